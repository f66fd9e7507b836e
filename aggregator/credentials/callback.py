"""The OAuth paths on the proxy's HTTP listener: the callback (``credentials.callback_path``,
by default ``/oauth/callback``), where the authorization server sends the user's browser
back with ``code`` and ``state``, and beside it the connect page and the sign-in's return
(``connect.ConnectPages``). They are reached without the proxy's bearer token (a browser
has none): the callback takes an answer only from the browser whose session cookie passed
the connect page for that flow (``browser``), and its single-use ``state``. It serves GET
only and answers a small HTML page; the code, state and cookie are never logged, nor is the
query of any OAuth path (an internal error there logs the path only and answers an HTML 500).
A callback that fails is a warning, the first at once, then at most one per
``FAILURE_LOG_INTERVAL`` with the count of those held back (anyone can send junk to it in a loop).
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from aggregator.credentials.authorization import AuthorizationFlows
from aggregator.credentials.browser import HTML_HEADERS, BrowserSessions, page
from aggregator.credentials.connect import ConnectPages
from aggregator.credentials.problems import CredentialError
from aggregator.log_summary import LogSummary
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)
MAX_QUERY = 8192
FAILURE_LOG_INTERVAL = 10.0  # seconds
FAILED = "The aggregator failed while handling this page; its log has the details. Open your link again."


class OAuthCallback:
    """Serves the OAuth paths (the HTTP endpoint asks ``serves`` for each path it has no
    route of its own for)."""

    def __init__(self, flows: AuthorizationFlows, path: str, sessions: BrowserSessions, pages: ConnectPages) -> None:
        self.flows = flows
        self.path = path
        self.sessions = sessions
        self.pages = pages
        self.failures = LogSummary(log, logging.WARNING, FAILURE_LOG_INTERVAL)

    def serves(self, path: str) -> bool:
        return path == self.path or self.pages.serves(path)

    async def handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        """Answer one request on an OAuth path, inside this path's own boundary: its query
        holds a live code or state, so an internal error logs the path only (not the query
        the connection's boundary would show) and is answered with an HTML page."""
        try:
            await self._handle(connection, request, path)
        except Exception:
            log.exception("oauth: internal error in %s %s; closing this connection only", request.method, path)
            if connection.response_pending():
                await connection.respond(500, [*HTML_HEADERS, ("connection", "close")], page("Internal error", FAILED))
            connection.closed = True  # this connection only ends (the response said so, or was begun)

    async def _handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        if path != self.path:
            await self.pages.handle(connection, request, path)
            return
        if request.method != "GET":
            await connection.respond(405, [("allow", "GET"), *HTML_HEADERS], page("Method not allowed", "GET only."))
            return
        query = request.path.partition("?")[2]
        if len(query) > MAX_QUERY:
            await connection.respond(414, HTML_HEADERS, page("Not granted", "The answer is too long."))
            return
        session = self.sessions.read(request.headers)
        try:
            pending = await self.flows.complete(
                dict(parse_qsl(query, keep_blank_values=True)), session.id if session is not None else None
            )
        except CredentialError as exc:
            self.failures.log("failed", "oauth callback: %s", exc)
            await connection.respond(400, HTML_HEADERS, page("Not granted", str(exc)))
            return
        text = f"The aggregator may now use server {pending.server!r} for you. You can close this page."
        await connection.respond(200, HTML_HEADERS, page("Access granted", text))

"""The callback path on the proxy's HTTP listener (``credentials.callback_path``, by default
``/oauth/callback``): where the authorization server sends the user's browser back with
``code`` and ``state``. It serves GET only, is reached without the proxy's bearer token (a
browser following a redirect has none; the single-use ``state`` is what it is checked by),
and answers a small HTML page; the code and state are never logged.
"""

from __future__ import annotations

import html
import logging
from urllib.parse import parse_qsl

from aggregator.credentials.authorization import AuthorizationFlows
from aggregator.credentials.problems import CredentialError
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)
MAX_QUERY = 8192
_HEADERS = [
    ("content-type", "text/html; charset=utf-8"),
    ("cache-control", "no-store"),
    ("referrer-policy", "no-referrer"),
    ("content-security-policy", "default-src 'none'"),
]


def _page(title: str, text: str) -> bytes:
    return (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
    ).encode()


class OAuthCallback:
    """Serves the callback path (the HTTP endpoint asks ``serves`` for each path it has no
    route of its own for)."""

    def __init__(self, flows: AuthorizationFlows, path: str) -> None:
        self.flows = flows
        self.path = path

    def serves(self, path: str) -> bool:
        return path == self.path

    async def handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        if request.method != "GET":
            await connection.respond(405, [("allow", "GET"), *_HEADERS], _page("Method not allowed", "GET only."))
            return
        query = request.path.partition("?")[2]
        if len(query) > MAX_QUERY:
            await connection.respond(414, _HEADERS, _page("Not granted", "The answer is too long."))
            return
        try:
            pending = await self.flows.complete(dict(parse_qsl(query, keep_blank_values=True)))
        except CredentialError as exc:
            log.warning("oauth callback: %s", exc)
            await connection.respond(400, _HEADERS, _page("Not granted", str(exc)))
            return
        text = f"The aggregator may now use server {pending.server!r} for you. You can close this page."
        await connection.respond(200, _HEADERS, _page("Access granted", text))

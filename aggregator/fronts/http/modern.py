"""Modern (2026-07-28) requests on the Streamable HTTP front: one POST, one stateless request.

A POST without Mcp-Session-Id whose request carries modern ``_meta`` (or names a revision
that is not a legacy one in MCP-Protocol-Version, or is ``server/discover``) is served
without a session (a notification from a modern client is accepted, 202, and dropped): its headers
are checked against its body (``headers``), the admission path chooses its principal
and profile as for ``initialize``, and the request becomes a hub client of its own
(``StatelessRequest``). Once answered, that client is kept for the next request of the
same token and profile if the router holds nothing of it (``Router.client_idle``), else
removed; one whose caller left early is always removed. The answer goes back as JSON, or as
an event stream (notifications that belong to the request, then the answer; never a server
request) with no event ids: a modern stream cannot be resumed. A client that closes the
stream before the answer cancels the request upstream at once, and hears nothing more of
it. A ``subscriptions/listen`` stream stays open as long as its client keeps it.

No session is opened or counted. Concurrent stateless requests are capped overall
(``http.max_stateless_requests``) and per token (``http.max_stateless_per_principal``);
past a cap, or while the aggregator shuts down, a request gets 503 with Retry-After (a
balancer sends a refused one to another replica); while it drains with shared ``[cluster]
keys`` one that still arrives is served instead (``hub.drain``).

``StatelessRequests`` owns the count of stateless requests in flight (overall and per
token), the clients kept between requests and the ``x-mcp-header`` parameters read off
the catalog; the POST exchange hands it each modern request (``is_modern_post``).

Imports of the HTTP front: ``answers``, ``headers`` and ``queue``.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from aggregator.config import HttpConfig
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.router import proxy_error
from aggregator.fronts.access import AccessPolicy, Denial, choose_profile
from aggregator.fronts.authorization import who
from aggregator.fronts.http.answers import refuse_session, reject
from aggregator.fronts.http.headers import ParamHeaders, answer_status, check_headers, check_version
from aggregator.fronts.http.queue import JSON, KEEPALIVE, MessageQueue, QuickWaits, until_client_leaves
from aggregator.fronts.port import ClientPort
from aggregator.hub.caps import DRAINING_RETRY_AFTER, Refusal
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST
from aggregator.jsonrpc.kinds import REQUEST
from aggregator.mcp.versions import DISCOVER, SUPPORTED, is_modern
from aggregator.telemetry.recent_errors import REFUSAL
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)

STREAM_HEADERS = [("x-accel-buffering", "no")]
# Stateless clients kept connected between their callers' requests, per token and profile
# (``_rest``): as many as were busy at once, up to this.
RESTING = 64


class StatelessRequest:
    """One modern request's hub client: what the router sends it goes to one response
    stream. Its answer ends the stream; a notification goes there if it belongs to the
    request (progress, its log lines, a listen's notices: the router relates each); a
    server-to-client request never does (the modern revision has none on a stream).
    Its budget is a client's (``proxy.client_buffer_bytes``)."""

    def __init__(self, memory: ClientMemory, limit: int, id: Any) -> None:
        self.key = 0
        self.dirty = False
        self.begin(memory, limit, id)

    def begin(self, memory: ClientMemory, limit: int, id: Any) -> None:
        """Serve request ``id`` (a new client, or one kept from its caller's last request)."""
        self.id = id
        self.ended = False  # its request is over: nothing more is queued
        self.waiting = 0
        self.limit = limit
        self.over_limit = False
        self.held = 0
        self.progress_at = trio.current_time()
        self.memory = memory
        self.drop_reason = ""
        self.queue = MessageQueue(self, keep=0)

    def put_message(self, message: Any, related: Any = None) -> None:
        if self.ended:
            return
        if type(message) is bytes:  # an answer, encoded already (``related`` is its id), or a notice
            data, response_to = message, related
        elif "method" in message:
            if "id" in message:
                log.debug("http request client %d: a server request is not sent on a modern stream", self.key)
                return
            if related != self.id:
                return  # not this request's: a modern request's stream carries only its own
            data, response_to = dumps(message), None
        else:
            data, response_to = dumps(message), message.get("id", related)
        queue = self.queue
        if response_to is not None:
            if response_to == self.id and not queue.final:
                queue.push(data, final=True)
            return
        if related == self.id:
            queue.push(data)

    def request_ended(self, id: Any) -> None:
        if id == self.id:
            self.queue.end_unanswered()

    def flush(self) -> None:
        self.dirty = False
        if self.over_limit and not self.queue.overflowed:
            log.error(
                "http request client %d dropped: %s (it does not read its stream)",
                self.key,
                self.drop_reason or f"more than {self.limit} bytes are waiting for it",
            )
            self.queue.close()
            release_all(self)

    def blocked(self) -> bool:
        return self.queue.blocked()

    def last_progress(self) -> float:
        return self.queue.last_progress()

    def shed(self, reason: str) -> None:
        if self.over_limit:
            return
        self.over_limit = True
        self.drop_reason = reason
        self.queue.close()
        release_all(self)

    async def wait_writable(self) -> None:
        return

    async def wait_drained(self) -> None:
        return


def is_modern_post(request: Request, kind: int, message: dict[str, Any], meta: Any) -> bool:
    """Whether a sessionless POST is to be served (or refused) as a modern request: a
    request with modern ``_meta`` or a revision header that no legacy session has."""
    if kind != REQUEST or "mcp-session-id" in request.headers:
        return False
    if meta is not None or message["method"] == DISCOVER:  # only a modern request asks it
        return True
    header = request.headers.get("mcp-protocol-version")
    return header is not None and header not in SUPPORTED


def is_modern_notification(request: Request) -> bool:
    """Whether a sessionless notification comes from a modern client (its revision
    header), which gets 202: it may send one, and the revision gives it no meaning
    over HTTP (closing a stream is what cancels)."""
    header = request.headers.get("mcp-protocol-version")
    return header is not None and is_modern(header)


class StatelessRequests:
    """POST of a modern request without a session."""

    def __init__(self, hub: ClientPort, config: HttpConfig, access: AccessPolicy, quick: QuickWaits) -> None:
        self.hub = hub
        self.config = config
        self.access = access
        self.quick = quick  # a request's answer, waited for as JSON before a watcher starts
        self.in_flight = 0  # modern requests being served now
        self.by_principal: dict[Any, int] = {}  # ... of each token
        self.resting: dict[tuple[Any, str], list[StatelessRequest]] = {}  # clients kept, per (token, profile)
        self.param_headers = ParamHeaders()

    async def serve(self, connection: HttpConnection, request: Request, message: dict[str, Any], meta: Any) -> None:
        """Serve one modern request (``message``, its ``_meta``) as a hub client of its own."""
        headers = request.headers
        admitted = choose_profile(self.access, headers, self.access.named_profile(request.path) or "")
        if isinstance(admitted, Denial):
            log.log(
                admitted.level,
                "http: refused %s on %s: %s",
                message["method"],
                request.path.partition("?")[0][:100],
                admitted.reason,
                extra=REFUSAL,
            )
            await reject(connection, admitted.status, INVALID_REQUEST, admitted.reason, message["id"], admitted.headers)
            return
        principal, profile = admitted
        error = check_version(headers, message, meta)
        if error is None:
            params = message.get("params")
            tool = params.get("name") if message["method"] == "tools/call" and type(params) is dict else None
            catalog = self.hub.profile_catalog(profile) if tool else None
            error = check_headers(headers, message, self.param_headers.of(catalog, tool) if tool else ())
        if error is not None:
            data = dumps(error)
            await connection.respond(answer_status(data), [JSON], data)
            return
        refusal = self._admit(principal)
        if refusal is not None:
            await refuse_session(connection, refusal, message["id"])
            return
        config = self.hub.config.proxy
        kept = self.resting.get((principal, profile))
        if kept:
            client = kept.pop()
            client.begin(self.hub.client_memory, config.client_buffer_bytes, message["id"])
        else:
            client = StatelessRequest(self.hub.client_memory, config.client_buffer_bytes, message["id"])
        try:
            if not client.key:
                client.key = self.hub.client_connected(
                    client, profile, era=Era.MODERN, principal=principal, stateless=True
                )
            self.hub.caller_token(client.key, self.access.access_token(headers))
            await self._answer(connection, client, message)
        finally:
            # Answered, or the client left (or this failed): the router cancels what is
            # still in flight upstream, and the client hears nothing more of it.
            client.ended = True
            self._release(principal)
            if client.key:
                release_all(client)
                if not self._rest(client, principal, profile):
                    self.hub.client_disconnected(client.key)
                    # The request and its queue point at each other: unlinked here, both go
                    # with their last reference, not at the next garbage collection (one per
                    # request, a cycle costs the whole process a collection every few
                    # hundred requests). Nothing is queued after ``ended``, nothing written.
                    client.queue.owner = None  # type: ignore[assignment]

    def _rest(self, client: StatelessRequest, principal: Any, profile: str) -> bool:
        """Keep an answered request's client for its caller's next request (same token, same
        profile), as long as the router holds nothing of it: a request then costs no client
        made and torn down. Up to ``RESTING`` are kept; one that was cut short (cancelled,
        dropped, unanswered) or that anything still refers to is removed as before."""
        queue = client.queue
        if not queue.final or queue.overflowed or client.over_limit or self.hub.draining:
            return False
        kept = self.resting.setdefault((principal, profile), [])
        if len(kept) >= RESTING or not self.hub.client_idle(client.key):
            return False
        kept.append(client)
        return True

    async def _answer(self, connection: HttpConnection, client: StatelessRequest, message: dict[str, Any]) -> None:
        queue = client.queue
        await self.hub.client_decoded(client.key, REQUEST, message)
        # Most answers come back within milliseconds and alone: JSON, with no task to
        # watch the connection, as for a session's request.
        await self.quick.wait(queue)
        if queue.final and queue.waiting == 1 and not queue.unanswered:
            await queue.respond(connection, [JSON], answer_status)
            return
        streaming = False
        async with until_client_leaves(connection):
            while True:
                with trio.move_on_after(KEEPALIVE) as idle:
                    await queue.wait()
                if idle.cancelled_caught:
                    if streaming and not await connection.send_chunk(b": keepalive\n\n"):
                        break
                    continue
                if queue.overflowed:
                    if not streaming:
                        error = proxy_error(
                            client.id,
                            "More was waiting for this request than the aggregator holds for one client",
                            reason="too_large",
                        )
                        await connection.respond(200, [JSON], dumps(error))
                    break
                if not streaming and queue.final and not queue.unanswered and queue.waiting == 1:
                    await queue.respond(connection, [JSON], answer_status)
                    break
                if not streaming:
                    streaming = True
                    if not await connection.start_stream(STREAM_HEADERS):
                        break
                last = queue.final
                if queue.waiting and not await queue.send_events(connection):
                    break
                if last:
                    await connection.end_stream()
                    break
        if not queue.final:
            connection.closed = True  # the client left, or its stream was cut: it is cancelled

    def _admit(self, principal: Any) -> Refusal | None:
        """Count a stateless request in, or say why not (nothing counted then)."""
        http = self.config
        if self.hub.shutdown.refuses_new(True):  # while draining with shared keys it is served (``hub.drain``)
            return Refusal(
                "The aggregator is shutting down and accepts no new requests", "unavailable", DRAINING_RETRY_AFTER
            )
        if self.in_flight >= http.max_stateless_requests:
            log.warning("http: refused a stateless request: %d in flight, the limit", self.in_flight)
            return Refusal(
                f"Too many requests in flight (limit {http.max_stateless_requests}); try again later", "overloaded", 1
            )
        if principal is not None:
            mine = self.by_principal.get(principal, 0)
            if mine >= http.max_stateless_per_principal:
                log.warning("http: refused a stateless request of %s: %d in flight, its limit", who(principal), mine)
                return Refusal(
                    f"Too many requests in flight for this token (limit {http.max_stateless_per_principal}); "
                    "try again later",
                    "overloaded",
                    1,
                )
            self.by_principal[principal] = mine + 1
        self.in_flight += 1
        return None

    def _release(self, principal: Any) -> None:
        self.in_flight -= 1
        if principal is not None:
            left = self.by_principal.pop(principal, 1) - 1
            if left:
                self.by_principal[principal] = left

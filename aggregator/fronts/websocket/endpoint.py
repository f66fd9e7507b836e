"""The WebSocket endpoint: one MCP session per connection, one message per text frame.

The handshake takes the admission path every front shares (``aggregator.fronts.access``:
Host, Origin, bearer token, then the profile its path names) before it is accepted; the
subprotocol ``mcp`` is chosen when the client offers it. What the session sends goes
through a ``WebSocketSink`` (``aggregator.fronts.websocket.sink``). Frames larger than
the body limit close the connection (trio-websocket enforces it while reading).

A WebSocket's messages carry no token, so the one of its handshake is held: an access
token's session is closed (1008, logged) when the token expires (its ``exp``), and one
introspected (RFC 7662: it may be revoked any time) is asked about again every
``auth.introspection_cache_seconds``; the session is closed (1008, logged) once it is
not active, no longer its principal's or short of a required scope. An issuer that cannot
be asked leaves the session open until the next time.

Admission is shared with the HTTP endpoint (``hub.admission``): a connection over
``http.max_connections`` gets 503 before its handshake is read, a handshake over
``http.max_sessions`` (or while the aggregator drains) is rejected with 503. The whole
handshake must arrive within ``http.header_timeout``.

Containment: every connection runs inside a boundary. A handshake the WebSocket library
cannot parse (bytes no header may hold) is a client's mistake: 400, one warning line. A
head (its first byte through the blank line) over ``http.max_header_bytes`` gets 431 and
one with an obs-fold (a line continuing the previous header) 400 before the library reads
it; one the client stops sending halfway is closed. A handshake refused at the library stage
(wrong path, admission), or one the library refuses by itself (a POST, no key), is
answered and its connection closed at once. An
exception while the session runs is ours: logged with its traceback, the message being
handled is answered with a JSON-RPC internal error, and the connection closes with 1011;
other connections and the process go on.
"""

from __future__ import annotations

import logging
import math
import time
from http import HTTPStatus
from typing import Any

import trio
import trio_websocket
from wsproto.utilities import ProtocolError

from aggregator.config import HttpConfig, parse_listen
from aggregator.fronts.access import AccessPolicy, Denial, admit, check_access, until_refused
from aggregator.fronts.authorization import Principal
from aggregator.fronts.containment import internal_error
from aggregator.fronts.port import ClientPort
from aggregator.fronts.websocket.handshake import HandshakeTap, current_tap, handshake_headers, reject
from aggregator.fronts.websocket.sink import WebSocketSink
from aggregator.jsonrpc.codec import dumps
from aggregator.transports.http_server import refuse_connection

log = logging.getLogger(__name__)
_MESSAGE_TOO_BIG = 1009  # the close code of a message over http.max_body_bytes (RFC 6455 7.4.1)
BAD_HANDSHAKE = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: 29\r\n\r\nmalformed WebSocket handshake"
)


class WebSocketEndpoint:
    def __init__(self, hub: ClientPort, config: HttpConfig) -> None:
        self.hub = hub
        self.config = config
        self.access = AccessPolicy(config, hub.config.profiles, hub.config.auth)
        self.admission = hub.admission

    async def serve(self, listen: str, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_listen(listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        server = _ContainedServer(
            self,
            self._handle,
            listeners,
            max_message_size=self.config.max_body_bytes,
            message_queue_size=16,
            connect_timeout=self.config.header_timeout,
            disconnect_timeout=self.config.header_timeout,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            log.info("serving MCP over WebSocket at ws://%s:%d%s", host, server.port, self.config.path)
            task_status.started(server)

    async def _connection(self, stream: trio.abc.Stream, serve: Any) -> None:
        """One connection's task, and its boundary: the cap, the handshake, the session."""
        if not self.admission.admit_connection():
            await refuse_connection(stream)
            return
        tap = HandshakeTap(stream)
        current_tap.set(tap)
        try:
            if not await self._access_checked(tap):
                return
            with tap.scope:
                await serve(tap)
        except Exception as exc:
            leaves = _leaves(exc)
            what = "; ".join(f"{type(leaf).__name__}: {str(leaf)[:200]}" for leaf in leaves[:3])
            if tap.read and all(isinstance(leaf, ProtocolError) for leaf in leaves):
                # The library's reader tripped over the client's frames (a ping after our
                # close frame makes it answer with a pong that wsproto refuses).
                log.warning("websocket: closed a connection whose frames the WebSocket library refused (%s)", what)
            elif tap.read:
                log.exception("websocket: internal error; closing this connection only")
            else:
                # The library choked on the handshake's bytes (a Host that is not IDNA,
                # a header that is not ASCII): the client's mistake, not a bug of ours.
                log.warning("websocket: refused a malformed handshake (%s)", what)
                with trio.move_on_after(1):
                    try:
                        await stream.send_all(BAD_HANDSHAKE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
        finally:
            try:
                await trio.aclose_forcefully(stream)
            finally:
                self.admission.release_connection()

    async def _access_checked(self, tap: HandshakeTap) -> bool:
        """Read the handshake's head and check Host, Origin and token, before the WebSocket
        library reads it (which answers 400 to a request that is no upgrade): False after
        refusing it, or when the head did not come within ``http.header_timeout``."""
        with trio.move_on_after(self.config.header_timeout):
            await tap.read_head(self.config.max_header_bytes)
            refusal = tap.bad_head(self.config.max_header_bytes)
            if refusal is None and not tap.complete:
                return False  # the client stopped sending before its head was complete
            if refusal is not None:
                status, reason = refusal
                log.warning("websocket: refused a handshake: %s", reason)
                extra: list[tuple[str, str]] = []
            else:
                head = tap.headers()
                if head is None:
                    return True
                target, headers = head
                denial = await check_access(self.access, headers, target)
                if denial is None:
                    return True
                self.access.note_refusal(
                    log, denial, "websocket: refused a request for %s: %s", target[:100], denial.reason
                )
                status, reason, extra = denial.status, denial.reason, list(denial.headers)
            body = reason.encode()
            lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
            lines += ["content-type: text/plain; charset=utf-8", "connection: close", f"content-length: {len(body)}"]
            lines += [f"{name}: {value}" for name, value in extra]
            try:
                await tap.stream.send_all("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        return False

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
        admitted = await admit(self.access, handshake_headers(request), request.path)
        if isinstance(admitted, Denial):
            path = request.path.partition("?")[0][:100]
            log.log(admitted.level, "websocket: refused a handshake for %s: %s", path, admitted.reason)
            extra = [(name.encode(), value.encode()) for name, value in admitted.headers]
            await reject(request, admitted.status, extra, admitted.reason)
            return
        session_refusal = self.admission.admit_session()
        if session_refusal is not None:
            extra_headers = (
                []
                if session_refusal.retry_after is None
                else [(b"retry-after", str(session_refusal.retry_after).encode())]
            )
            await reject(request, 503, extra_headers, session_refusal.message)
            return
        try:
            token = self.access.access_token(handshake_headers(request))
            await self._session(request, admitted.profile, admitted.principal, token)
        finally:
            self.admission.release_session()

    async def _session(
        self,
        request: trio_websocket.WebSocketRequest,
        profile: str,
        principal: Any = None,
        access_token: str | None = None,
    ) -> None:
        """One admitted session, from accepting the handshake to the connection's end."""
        subprotocol = "mcp" if "mcp" in request.proposed_subprotocols else None
        socket = await request.accept(subprotocol=subprotocol)
        tap = current_tap.get(None)
        if tap is not None:
            tap.accepted.set()  # a frame that came with the handshake may be read now
        connection = trio.CancelScope()
        # Its messages carry no token: an access token's session ends when the token does.
        expires = principal.expires if isinstance(principal, Principal) else math.inf
        if expires < math.inf:
            connection.deadline = trio.current_time() + max(0.0, expires - time.time())
        key = 0

        def dropped(reason: str) -> None:
            log.error(
                "websocket session %d dropped: %s (it does not read what it is sent); its requests are cancelled",
                key,
                reason,
            )
            connection.cancel()

        proxy = self.hub.config.proxy
        sink = WebSocketSink(
            proxy.client_buffer_bytes, proxy.client_write_timeout, on_drop=dropped, memory=self.hub.client_memory
        )
        key = self.hub.client_connected(sink, profile, principal=principal, access_token=access_token)
        log.info("websocket session %d: opened", key)
        refused: list[str] = []  # why its token is no longer accepted, when a recheck says so
        try:
            with connection:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sink.run, socket)
                    if access_token is not None and isinstance(principal, Principal):
                        nursery.start_soon(self._recheck, key, access_token, principal, connection, refused)
                    try:
                        while True:
                            message = await socket.get_message()
                            raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
                            try:
                                await self.hub.client_message(key, raw)
                                await self.hub.flush(sink)
                            except Exception:
                                log.exception(
                                    "websocket session %d: internal error handling a message;"
                                    " closing this connection only",
                                    key,
                                )
                                with trio.move_on_after(1):
                                    await socket.send_message(dumps(internal_error(raw)).decode())
                                    await socket.aclose(1011, "internal error")
                                break
                    except trio_websocket.ConnectionClosed as closed:
                        if closed.reason is not None and closed.reason.code == _MESSAGE_TOO_BIG:
                            log.warning(
                                "websocket session %d: closed (1009): a message larger than %d bytes"
                                " (http.max_body_bytes)",
                                key,
                                self.config.max_body_bytes,
                            )
                    nursery.cancel_scope.cancel()
            if refused:
                with trio.move_on_after(1):
                    await socket.aclose(1008, "the access token is no longer accepted")
            elif connection.cancelled_caught and trio.current_time() >= connection.deadline:
                log.info("websocket session %d: closed (1008): its access token expired", key)
                with trio.move_on_after(1):
                    await socket.aclose(1008, "the access token expired")
        finally:
            sink.close()
            self.hub.client_disconnected(key)
            log.info("websocket session %d: closed", key)

    async def _recheck(
        self, key: int, token: str, principal: Principal, connection: trio.CancelScope, refused: list[str]
    ) -> None:
        """Ask, every ``recheck_interval``, whether the introspected token a session opened
        with is still good: one revoked (not active), no longer this principal's or without
        a required scope ends the session (``refused`` says why; 1008). An issuer that
        cannot be asked now leaves the session as it is until the next time."""
        verifier = self.access.verifier
        if verifier is None or verifier.recheck_interval(token) is None:
            return
        reason = await until_refused(verifier, token, principal, f"websocket session {key}")
        log.warning("websocket session %d: closed (1008): its access token is no longer accepted (%s)", key, reason)
        refused.append(reason)
        connection.cancel()


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


class _ContainedServer(trio_websocket.WebSocketServer):
    """trio-websocket's server with each connection run through the endpoint's boundary
    (its cap, and a guard against what the library raises on a hostile handshake)."""

    def __init__(self, endpoint: WebSocketEndpoint, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._endpoint = endpoint

    async def _handle_connection(self, stream: trio.abc.Stream) -> None:
        await self._endpoint._connection(stream, super()._handle_connection)

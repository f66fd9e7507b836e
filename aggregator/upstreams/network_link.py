"""What every network upstream connector shares: the ``NetworkLink`` that passes the
server's messages to the session (each decoded once, here, under the proxy's size and
depth limits, with the request it belongs to) and the session's messages to the server,
the budget of messages waiting to be sent, the HTTP client with the server's own headers,
and how a failure is described (with the server's secrets masked: an exception's text may
hold a header's value).

Credentials: each server gets only its own configured ``headers``; nothing from a client
is ever forwarded. Redirects are not followed (a redirect could carry credentials to
another host).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import trio

from aggregator import __version__
from aggregator.config.masking import SecretMask, shown_url
from aggregator.core.router import proxy_error
from aggregator.jsonrpc.codec import ERROR, decode_message, dumps, loads, nameless_refusal
from aggregator.jsonrpc.errors import RemoteProtocolError
from aggregator.mcp.constants import INITIALIZED
from aggregator.transports.channel import Channel, ServerMessage
from aggregator.transports.pipe import message_pipe
from aggregator.upstreams.resumption import is_answer

log = logging.getLogger(__name__)
MAX_CONCURRENT_POSTS = 64
CONNECT_TIMEOUT = 30.0  # seconds to connect (and to write); reading waits for ever
# What may wait for one of those POSTs, in bytes of messages (at least one of the largest):
# past it the session's messages are not read, so its own budget for the server holds.
WAITING_POSTS_BYTES = 1024 * 1024
USER_AGENT = f"mcp-aggregator/{__version__}"


# The masks of the servers connected now (one per connection, while it runs), joined into the
# one the clients' log lines go through (None: no secrets); rebuilt when one starts or ends.
_client_masks: dict[int, SecretMask] = {}
_client_mask: SecretMask | None = None


def _join_client_masks() -> None:
    global _client_mask
    joined = SecretMask.joined(_client_masks.values())
    _client_mask = joined if joined.forms else None


@contextmanager
def client_logs_masked(mask: SecretMask) -> Iterator[None]:
    """While inside, the HTTP and WebSocket clients' log lines are masked with ``mask`` too."""
    _client_masks[id(mask)] = mask
    _join_client_masks()
    try:
        yield
    finally:
        del _client_masks[id(mask)]
        _join_client_masks()


def _shown_arg(arg: object, mask: SecretMask | None) -> object:
    if isinstance(arg, httpx.URL):
        arg = str(arg)
    if isinstance(arg, str):
        if (arg[:1] == "/" or "://" in arg) and ("?" in arg or "@" in arg):
            arg = shown_url(arg)
        if mask is not None:
            arg = mask(arg)
    return arg


def _hide_url_credentials(record: logging.LogRecord) -> bool:
    """The HTTP and WebSocket clients log the URL they connect to (httpx each request's URL at
    info, trio-websocket its ``Connecting to ws://host:port/path?query`` at debug): shown
    without its password and query values, which may be a server's credentials, and with
    the secrets of the servers connected now masked (a ``${VAR}`` in its path, user name or
    fragment)."""
    if isinstance(record.args, tuple):
        record.args = tuple(_shown_arg(arg, _client_mask) for arg in record.args)
    return True


for _client_logger in ("httpx", "aggregator.upstreams.http_client", "trio-websocket"):
    logging.getLogger(_client_logger).addFilter(_hide_url_credentials)


def _null_id_error_as_answer(raw: bytes, request: dict[str, Any], server: str) -> bytes | None:
    """A JSON-RPC error with ``"id": null`` on a POST's body or event stream is the
    server saying it could not read the request that POST carried: it answers that
    request (the server's error as it gave it, under the request's id). None otherwise."""
    try:
        message = loads(raw)
    except ValueError:
        return None
    if (
        type(message) is not dict
        or "method" in message
        or message.get("id", 0) is not None
        or type(message.get("error")) is not dict
    ):
        return None
    log.warning(
        "server %s: answered a %s it could not read: %s",
        server,
        request.get("method"),
        str(message["error"].get("message"))[:200],
    )
    message["id"] = request["id"]
    return dumps(message)


class NetworkLink:
    """What a connector shares with its tasks: the way to the session and back, and how it ends.

    ``limit`` and ``depth``: the size (bytes) and JSON nesting a server's message may
    have (``proxy.max_message_bytes`` and ``max_json_depth``, as for a stdio server's lines).
    """

    def __init__(self, config: Any, limit: int, depth: int) -> None:
        self.limit = limit
        self.depth = depth
        self.name: str = config.name
        self.mask = SecretMask.of(config)
        self.ended = trio.Event()
        self.reason = "the connection ended"
        self._to_session, self._messages = trio.open_memory_channel[ServerMessage](64)
        self._session_writes, self._outgoing = message_pipe()

    def channel(self, *, streams: bool = False) -> Channel:
        """What the session talks through (``streams``: see ``Channel``)."""
        return Channel(self._session_writes, messages=self._messages, streams=streams)

    def describe(self, exc: BaseException) -> str:
        """A failure in one short line, the server's secrets masked (for logs, the reason a
        connection ended, and the error a request gets)."""
        text = self.mask(str(exc) or type(exc).__name__)
        return text.splitlines()[0][:300] if text else type(exc).__name__

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.reason = reason
            self.ended.set()

    def _decode(self, raw: bytes) -> tuple[int, dict[str, Any]] | RemoteProtocolError:
        try:
            return decode_message(raw, self.depth)
        except RemoteProtocolError as exc:
            return exc

    async def deliver(self, data: bytes | str, answers: dict[str, Any] | None = None) -> None:
        """Pass one JSON-RPC message to the session, decoded.

        ``answers``: the request whose POST this message came back on. A message that
        cannot be read and does not name whom it answers is taken as that request's
        answer, and the request fails at once with the refusal rather than timing out.
        """
        raw = data.encode() if isinstance(data, str) else data
        raw = raw.strip()
        if not raw:
            return
        if b"\n" in raw or b"\r" in raw:
            # Pretty-printed JSON (legal in an HTTP body or across SSE data lines): made one
            # line, as a stdio server's would be, so that it is measured and read as one.
            # Parsing keeps numbers exact; a bad message is flattened as it is, for the
            # router to refuse.
            try:
                raw = dumps(loads(raw))
            except ValueError:
                raw = raw.replace(b"\r", b" ").replace(b"\n", b" ")
        if len(raw) > self.limit:
            log.error("server %s: dropped a %d-byte message (limit %d bytes)", self.name, len(raw), self.limit)
            if answers is None:
                return
            # On a POST's body or event stream it answers the request that POST carried:
            # that request fails now, as for a stdio server, rather than at its timeout.
            raw = self.refused_answer(answers, f"more than {self.limit} bytes", {"reason": "too_large"})
        decoded = self._decode(raw)
        related = None
        if answers is not None:
            # Refused and naming no party (a message read always names one): the request's
            # answer, which fails it with the refusal. An error for "the unreadable" (id
            # null) answers the request too: C-level tests first, most answers go by.
            if isinstance(decoded, RemoteProtocolError):
                refusal = nameless_refusal(raw)
                if refusal is not None:
                    raw = self.refused_answer(answers, refusal.message, refusal.data)
                    decoded = self._decode(raw)
                elif b"null" in raw and b'"error"' in raw:
                    raw, decoded = self._null_id_answer(raw, decoded, answers)
            elif decoded[0] == ERROR and decoded[1]["id"] is None and b"null" in raw and b'"error"' in raw:
                raw, decoded = self._null_id_answer(raw, decoded, answers)
            if type(answers.get("id")) is int:
                related = answers["id"]  # its request is named beside it, not in it
        try:
            await self._to_session.send(ServerMessage(decoded, related, raw))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.end("the session closed")

    def _null_id_answer(
        self, raw: bytes, decoded: tuple[int, dict[str, Any]] | RemoteProtocolError, request: dict[str, Any]
    ) -> tuple[bytes, tuple[int, dict[str, Any]] | RemoteProtocolError]:
        """``raw`` (and what it decoded to), or the answer to ``request`` it is (see
        ``_null_id_error_as_answer``), decoded."""
        answer = _null_id_error_as_answer(raw, request, self.name)
        if answer is None:
            return raw, decoded
        return answer, self._decode(answer)

    async def deliver_body(self, body: bytes, answers: dict[str, Any] | None, *, delivered: bool = False) -> None:
        """Pass on (unless ``delivered``) a POST's ``application/json`` body, which is the
        whole of what answers the request it carried: a body that holds a message of the
        server's own and no answer (a notification alone) fails that request at once,
        rather than leaving it to its timeout. (What cannot be read fails it in the router.)"""
        if not delivered:
            await self.deliver(body, answers)
        if answers is None:
            return
        if not body.strip():
            await self.no_answer(answers, "its JSON body was empty")
        elif b'"method"' in body and not is_answer(body.decode("utf-8", "replace")):  # C-level first
            await self.no_answer(answers, "its JSON body held a message of its own and no answer")

    async def no_answer(self, answers: dict[str, Any] | None, problem: str) -> None:
        """The request a POST carried got ``problem`` instead of an answer: it fails now."""
        if answers is not None:
            await self.deliver(self.refused_answer(answers, problem, {"reason": "malformed"}), answers)

    def refused_answer(self, request: dict[str, Any], problem: str, data: Any) -> bytes:
        method = request.get("method")
        log.warning("server %s: refused its answer to %s: %s", self.name, method, problem)
        reason = data["reason"] if type(data) is dict and "reason" in data else "malformed"
        return dumps(
            proxy_error(
                request["id"],
                f"Server {self.name!r} sent an answer to {method} that the aggregator cannot forward ({problem})",
                reason=reason,
                server=self.name,
            )
        )

    async def each_outgoing(
        self,
        send: Callable[[bytes, Any], Awaitable[None]],
        nursery: trio.Nursery,
        concurrent: bool,
        inspect: Callable[[bytes], None] | None = None,
    ) -> None:
        """Take what the session writes and hand each message to ``send``, as its line (to
        send as it is) and as the message itself (to read, never to change: a dict, or
        bytes when the router had it as bytes). A line over ``limit`` bytes is not sent.

        ``concurrent``: each message in a task of its own (``send`` limits how many talk to the
        server at once); reading goes on while messages wait for that, up to
        ``WAITING_POSTS_BYTES``, so that a message that frees a slot (a cancel) is never stuck
        behind one that waits for it. Save ``notifications/initialized``: it is sent before
        anything after it is, as a client's own would be, so the server has it before the
        first request of normal operation (a server may refuse requests before it, and
        POSTs in tasks of their own arrive in any order). ``inspect`` sees each line as it
        is taken."""
        waiting = _ByteBudget(max(self.limit, WAITING_POSTS_BYTES))

        async def in_task(line: bytes, message: Any) -> None:
            try:
                await send(line, message)
            finally:
                waiting.release(len(line))

        while True:
            batch = await self._outgoing.receive()
            if not batch:
                self.end("the session closed")
                return
            for message, line in batch:
                if len(line) > self.limit:
                    continue
                if inspect is not None:
                    inspect(line)
                if concurrent and not _is_initialized(message):
                    await waiting.acquire(len(line))  # backpressure before starting another task
                    nursery.start_soon(in_task, line, message)
                else:
                    await send(line, message)


def _is_initialized(message: Any) -> bool:
    """Whether an outgoing message is the handshake's ``notifications/initialized`` (the
    proxy's own, a dict; one it passes on as bytes is read back to tell)."""
    if type(message) is not dict:
        if INITIALIZED.encode() not in message:
            return False
        try:
            message = loads(message)
        except ValueError:
            return False
    return type(message) is dict and message.get("method") == INITIALIZED and "id" not in message


class _ByteBudget:
    """Bytes held by messages that wait: ``acquire`` waits while the budget is spent (one
    message larger than the whole budget is let through alone)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held = 0
        self._freed = trio.Event()

    async def acquire(self, amount: int) -> None:
        while self.held and self.held + amount > self.size:
            await self._freed.wait()
            self._freed = trio.Event()
        self.held += amount

    def release(self, amount: int) -> None:
        self.held -= amount
        self._freed.set()


def http_client(config: Any, auth: httpx.Auth | None = None) -> httpx.AsyncClient:
    """A client that sends the server's own headers, follows no redirect and waits for ever
    to read; ``auth``: a user's own credential for it (``credentials.service.UserBearer``)."""
    headers = {"user-agent": USER_AGENT, **dict(config.headers)}
    return httpx.AsyncClient(
        headers=headers, auth=auth, follow_redirects=False, timeout=httpx.Timeout(CONNECT_TIMEOUT, read=None)
    )

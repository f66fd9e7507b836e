"""Upstream servers over the network: Streamable HTTP, legacy HTTP+SSE, WebSocket.

Each connector has the shape of ``run_stdio_server``: it reports a ``Channel`` (an NDJSON
byte stream each way, through an in-memory pipe) and returns why the connection ended.
So an upstream session reads and writes the same way whatever the transport, and a lost
connection is handled exactly like a crashed child process: pending requests fail at
once, the supervisor reconnects with backoff.

Credentials: each server gets only its own configured ``headers``; nothing from a client
is ever forwarded. Redirects are not followed (a redirect could carry credentials to
another host).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import trio
import trio_websocket

from aggregator import __version__
from aggregator.core.router import proxy_error
from aggregator.jsonrpc.codec import dumps, loads, nameless_refusal
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine
from aggregator.transports.pipe import PipeEnd, byte_pipe
from aggregator.transports.sse import SseParser
from aggregator.transports.stdio import STREAM_TAG, Channel

log = logging.getLogger(__name__)
MAX_CONCURRENT_POSTS = 64
# What may wait for one of those POSTs, in bytes of messages (at least one of the largest):
# past it the session's messages are not read, so its own budget for the server holds.
WAITING_POSTS_BYTES = 1024 * 1024
USER_AGENT = f"mcp-aggregator/{__version__}"

# Resuming a request's event stream (MCP 2025-11-25 "Resumability and Redelivery"): wait
# the server's ``retry`` (this when it gave none), never less than the floor (no busy
# retry) nor more than the cap (a server's absurd value); give up after this many
# resumptions in a row that brought nothing (no new event, ended within a second).
RESUME_DELAY = 1.0
RESUME_DELAY_FLOOR = 0.1
RESUME_DELAY_CAP = 30.0
MAX_EMPTY_RESUMES = 5
UNRESUMABLE = "the server closed the response stream before answering and gave no event id to resume from"


def _retry_delay(retry_ms: int | None) -> float:
    """Seconds to wait before reconnecting an event stream, from its ``retry`` field."""
    if retry_ms is None:
        return RESUME_DELAY
    return min(max(retry_ms / 1000, RESUME_DELAY_FLOOR), RESUME_DELAY_CAP)


def _is_answer(data: str) -> bool:
    """Whether a message on a request's event stream is its answer rather than a request or
    notification of the server's. Only a member name or a string equal to "method" puts the
    text '"method"' into JSON (a quote inside a string is escaped), so a C-level search
    decides nearly every answer; a parse decides the rest. Unreadable text counts as the
    answer: it is taken as the request's (refused) answer when delivered."""
    if '"method"' not in data:
        return True
    try:
        message = loads(data.encode())
    except ValueError:
        return True
    return type(message) is not dict or "method" not in message


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


class _Link:
    """What a connector shares with its tasks: the pipe end, and how it ends."""

    def __init__(self, pipe: PipeEnd, limit: int, name: str) -> None:
        self.pipe = pipe
        self.limit = limit
        self.name = name
        self.ended = trio.Event()
        self.reason = "the connection ended"

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.reason = reason
            self.ended.set()

    async def deliver(self, data: bytes | str, answers: dict[str, Any] | None = None) -> None:
        """Pass one JSON-RPC message to the session, as one line.

        ``answers``: the request whose POST this message came back on. A message that
        cannot be read and does not name whom it answers is taken as that request's
        answer, and the request fails at once with the refusal rather than timing out.
        """
        raw = data.encode() if isinstance(data, str) else data
        raw = raw.strip()
        if not raw:
            return
        if b"\n" in raw or b"\r" in raw:
            # Pretty-printed JSON (legal in an HTTP body or across SSE data lines): make it
            # one line. Parsing keeps numbers exact; a bad message goes through as it is,
            # flattened, for the router to refuse.
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
            raw = self._refused_answer(answers, f"more than {self.limit} bytes", {"reason": "too_large"})
        if answers is not None:
            refusal = nameless_refusal(raw)
            if refusal is not None:
                raw = self._refused_answer(answers, refusal.message, refusal.data)
            elif b"null" in raw and b'"error"' in raw:  # C-level: most answers are not parsed twice
                raw = _null_id_error_as_answer(raw, answers, self.name) or raw
        if answers is not None and type(answers.get("id")) is int:
            # Its request is named beside it, not in it (``stdio.STREAM_TAG``); one copy with the line end.
            line = b"%s%d%s%s\n" % (STREAM_TAG, answers["id"], STREAM_TAG, raw)
        elif raw[:1] == STREAM_TAG:
            line = b" " + raw + b"\n"  # never taken for a tag (and no JSON either: refused as such)
        else:
            line = raw + b"\n"
        try:
            await self.pipe.send_all(line)
        except trio.BrokenResourceError:
            self.end("the session closed")

    def _refused_answer(self, request: dict[str, Any], problem: str, data: Any) -> bytes:
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
        send: Callable[[bytes], Awaitable[None]],
        nursery: trio.Nursery,
        concurrent: bool,
        inspect: Callable[[bytes], None] | None = None,
    ) -> None:
        """Read what the session writes and hand each message to ``send``.

        ``concurrent``: each message in a task of its own (``send`` limits how many talk to the
        server at once); reading goes on while messages wait for that, up to
        ``WAITING_POSTS_BYTES``, so that a message that frees a slot (a cancel) is never stuck
        behind one that waits for it. ``inspect`` sees each message as it is read."""
        splitter = LineSplitter(self.limit)
        waiting = _ByteBudget(max(self.limit, WAITING_POSTS_BYTES))

        async def in_task(line: bytes) -> None:
            try:
                await send(line)
            finally:
                waiting.release(len(line))

        while True:
            data = await self.pipe.receive_some(65536)
            if not data:
                self.end("the session closed")
                return
            for line in splitter.feed(data):
                if type(line) is OversizedLine:
                    continue
                if inspect is not None:
                    inspect(line)
                if concurrent:
                    await waiting.acquire(len(line))  # backpressure before starting another task
                    nursery.start_soon(in_task, line)
                else:
                    await send(line)


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


class _Reading:
    """A request's POST, and the resumptions of its event stream: how to stop them, and why."""

    __slots__ = ("scope", "resuming", "stopped")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.resuming = False
        self.stopped: str | None = None


def _http_client(config: Any) -> httpx.AsyncClient:
    headers = {"user-agent": USER_AGENT, **dict(config.headers)}
    return httpx.AsyncClient(headers=headers, follow_redirects=False, timeout=httpx.Timeout(30.0, read=None))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


# --- Streamable HTTP ---------------------------------------------------------------------


async def run_streamable_http_server(
    config: Any, limit: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a Streamable HTTP server (MCP 2025-03-26 and later)."""
    ours, theirs = byte_pipe()
    link = _Link(theirs, limit, config.name)
    url = config.url
    state: dict[str, Any] = {"session": None, "version": None, "initialize": None, "get_started": False}
    # request id -> its POST and the resumptions of its event stream, until it is answered:
    # stopped when the request is cancelled (or answered on the GET stream instead).
    reading: dict[int | str, _Reading] = {}
    slots = trio.CapacityLimiter(MAX_CONCURRENT_POSTS)
    async with _http_client(config) as client:

        def headers(accept: str) -> dict[str, str]:
            result = {"accept": accept}
            if state["session"] is not None:
                result["mcp-session-id"] = state["session"]
            if state["version"] is not None:
                result["mcp-protocol-version"] = state["version"]
            return result

        async def answer_failed(message: Any, reason: str) -> None:
            """The POST of a request failed: answer it now so nothing waits for it."""
            if type(message) is dict and "method" in message and "id" in message:
                await link.deliver(
                    dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "error": {
                                "code": -32603,
                                "message": f"Server {config.name!r} could not be reached: {reason}",
                                "data": {"source": "aggregator", "reason": "unavailable", "server": config.name},
                            },
                        }
                    )
                )

        async def post(line: bytes) -> None:
            try:
                message = loads(line)
            except ValueError:
                message = None
            # What comes back on this POST answers the request it carried, if it carried one.
            answers = message if type(message) is dict and "method" in message and "id" in message else None
            key = answers["id"] if answers is not None and type(answers["id"]) in (int, str) else None
            # Never longer than the request may last: a server that holds a stream open after
            # the request ended (cancelled, timed out) would otherwise hold a slot for ever.
            this = _Reading(trio.CancelScope(deadline=trio.current_time() + config.max_request_timeout))
            with this.scope:
                if key is not None:
                    reading[key] = this
                try:
                    async with slots:
                        await post_and_read(line, message, answers, this)
                finally:
                    if key is not None and reading.get(key) is this:
                        del reading[key]
            if this.scope.cancelled_caught and answers is not None:
                log.info(
                    "server %s: stopped %s the answer to %s (id %s): %s",
                    config.name,
                    "resuming" if this.resuming else "reading",
                    answers.get("method"),
                    answers["id"],
                    this.stopped or "its time is up",
                )

        async def post_and_read(line: bytes, message: Any, answers: dict[str, Any] | None, this: _Reading) -> None:
            is_initialize = type(message) is dict and message.get("method") == "initialize"
            try:
                async with client.stream(
                    "POST",
                    url,
                    content=line,
                    headers={"content-type": "application/json", **headers("application/json, text/event-stream")},
                ) as response:
                    status = response.status_code
                    if status == 404 and state["session"] is not None:
                        link.end("the server ended the session (404); starting a new one")
                        return
                    if status == 202:
                        return
                    if status != 200:
                        body = (await response.aread())[:300].decode("utf-8", "replace")
                        log.warning("server %s: HTTP %d for a POST: %s", config.name, status, body)
                        await answer_failed(message, f"HTTP {status}")
                        if is_initialize:
                            link.end(f"initialize was refused with HTTP {status}")
                        return
                    if is_initialize:
                        state["session"] = response.headers.get("mcp-session-id")
                    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                    if kind != "text/event-stream":
                        await note_and_deliver(await response.aread(), is_initialize, answers)
                        return
                    parser = SseParser(limit)
                    try:
                        if await read_events(response, parser, is_initialize, answers):
                            return
                        how = "was closed"
                    except httpx.HTTPError as exc:
                        if not parser.last_event_id:
                            raise  # a connection lost with nothing to resume: as for any failed POST
                        how = f"broke ({_describe(exc)})"
            except httpx.HTTPError as exc:
                await answer_failed(message, _describe(exc))
                link.end(f"cannot reach {url}: {_describe(exc)}")
                return
            if answers is not None:  # (always: a stream that answers no request counts as answered)
                this.resuming = True
                await resume_until_answered(answers, parser, is_initialize, how)

        async def read_events(
            response: httpx.Response, parser: SseParser, is_initialize: bool, answers: dict[str, Any] | None
        ) -> bool:
            """Deliver the messages of one event stream (not a priming event's empty data);
            whether the answer to ``answers`` was among them (True when it answers nothing)."""
            answered = answers is None
            async for chunk in response.aiter_bytes():
                for event in parser.feed(chunk):
                    if event.event == "message" and event.data:
                        if not answered:
                            answered = _is_answer(event.data)
                        await note_and_deliver(event.data, is_initialize, answers)
            return answered

        async def resume_until_answered(
            request: dict[str, Any], parser: SseParser, is_initialize: bool, how: str
        ) -> None:
            """The event stream of ``request``'s POST ended before its answer: ask for the
            rest of that stream with GET and Last-Event-ID, after the server's retry delay,
            as many times as it ends early. What comes on it answers ``request`` as the POST
            would have. Stops when the answer came; ``post`` stops it when the request is
            cancelled (``notifications/cancelled``, which the router sends when it gives up on
            it), or at the latest its timeout could be extended to. Fails the request at once
            when the stream cannot be resumed."""
            id, method = request["id"], request.get("method")
            empty = 0
            while True:
                if not parser.last_event_id:
                    if parser.dropped:  # what was dropped was most likely the answer: say so
                        await link.deliver(
                            link._refused_answer(request, f"more than {limit} bytes", {"reason": "too_large"})
                        )
                    else:
                        await unresumable(request, UNRESUMABLE)
                    return
                if empty >= MAX_EMPTY_RESUMES:
                    await unresumable(
                        request,
                        f"the server ended the resumed response stream {empty} times in a row without sending anything",
                    )
                    return
                delay = _retry_delay(parser.retry)
                log.info(
                    "server %s: the response stream of %s (id %s) %s before its answer; resuming it in %.2fs",
                    config.name,
                    method,
                    id,
                    how,
                    delay,
                )
                await trio.sleep(delay)
                parser.restart()
                last, opened = parser.last_event_id, trio.current_time()
                try:
                    async with client.stream(
                        "GET",
                        url,
                        headers={
                            **headers("text/event-stream"),
                            "last-event-id": last,
                        },
                    ) as response:
                        status = response.status_code
                        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                        if status == 404 and state["session"] is not None:
                            link.end("the server ended the session (404); starting a new one")
                            return
                        if status == 409:  # the server still holds the broken connection: try again
                            how = "is still held by the server (HTTP 409)"
                            empty += 1
                            continue
                        if status != 200 or kind != "text/event-stream":
                            log.warning(
                                "server %s: HTTP %d (%s) for the GET resuming a response stream",
                                config.name,
                                status,
                                kind or "no content type",
                            )
                            await unresumable(
                                request,
                                (
                                    f"the server refused to resume the response stream (HTTP {status})"
                                    if status != 200
                                    else f"the server answered the GET resuming the response stream with"
                                    f" {kind or 'no content type'}, not an event stream (HTTP 200)"
                                ),
                            )
                            return
                        try:
                            if await read_events(response, parser, is_initialize, request):
                                return
                            how = "was closed again"
                        except httpx.HTTPError as exc:
                            how = f"broke again ({_describe(exc)})"
                except httpx.HTTPError as exc:
                    await answer_failed(request, _describe(exc))
                    link.end(f"cannot reach {url}: {_describe(exc)}")
                    return
                brought_nothing = parser.last_event_id == last and trio.current_time() - opened < 1.0
                empty = empty + 1 if brought_nothing else 0

        async def unresumable(request: dict[str, Any], problem: str) -> None:
            log.warning(
                "server %s: cannot resume the answer to %s (id %s): %s",
                config.name,
                request.get("method"),
                request["id"],
                problem,
            )
            await link.deliver(
                dumps(
                    proxy_error(
                        request["id"],
                        f"Server {config.name!r} did not answer: {problem}",
                        reason="unavailable",
                        server=config.name,
                    )
                )
            )

        def stop_reading(line: bytes) -> None:
            """A ``notifications/cancelled`` on its way: stop reading (or waiting to post, or
            resuming) the event stream of the request it cancels. (The router writes
            its messages without spaces.) A request cancelled before its task ran is missed,
            and waits for the server to close its stream, or for its time."""
            if not reading or b'"notifications/cancelled"' not in line:
                return
            try:
                message = loads(line)
            except ValueError:
                return
            if type(message) is not dict or message.get("method") != "notifications/cancelled":
                return
            params = message.get("params")
            if type(params) is dict:
                stop(params.get("requestId"), "the request was cancelled")

        def stop(id: Any, why: str) -> None:
            this = reading.get(id) if type(id) in (int, str) else None
            if this is not None:
                this.stopped = why
                this.scope.cancel()

        def answered_elsewhere(data: str) -> None:
            """An answer on the GET stream (where a server must not send one): the request it
            answers needs its own stream no longer."""
            try:
                message = loads(data.encode())
            except ValueError:
                return
            if type(message) is dict:
                stop(message.get("id"), "it was answered on the GET stream")

        async def note_and_deliver(data: bytes | str, is_initialize: bool, answers: dict[str, Any] | None) -> None:
            if is_initialize and state["version"] is None:
                try:
                    result = loads(data.encode() if isinstance(data, str) else data).get("result") or {}
                    state["version"] = result.get("protocolVersion")
                except (ValueError, AttributeError):
                    pass
                if not state["get_started"]:
                    state["get_started"] = True
                    nursery.start_soon(listen)
            await link.deliver(data, answers)

        async def listen() -> None:
            """The GET stream: what the server sends outside any request. Reconnected with
            its Last-Event-ID, after a short backoff or the server's longer retry delay."""
            parser = SseParser(limit)
            delay = 0.5
            while True:
                request_headers = headers("text/event-stream")
                if parser.last_event_id:
                    request_headers["last-event-id"] = parser.last_event_id
                wait = delay
                try:
                    async with client.stream("GET", url, headers=request_headers) as response:
                        if response.status_code in (405, 404) or response.status_code >= 500:
                            if response.status_code == 404 and state["session"] is not None:
                                link.end("the server ended the session (404); starting a new one")
                            return  # no GET stream offered; requests' own streams still work
                        if response.status_code != 200:
                            return
                        delay = 0.5
                        async for chunk in response.aiter_bytes():
                            for event in parser.feed(chunk):
                                if event.event == "message" and event.data:
                                    if reading and '"method"' not in event.data:
                                        answered_elsewhere(event.data)
                                    await link.deliver(event.data)
                        if parser.retry is not None:  # closed: wait as asked, not less than usual
                            wait = max(delay, _retry_delay(parser.retry))
                except httpx.HTTPError as exc:
                    log.info("server %s: GET stream dropped (%s); reconnecting", config.name, _describe(exc))
                parser.restart()
                await trio.sleep(wait)
                delay = min(delay * 2, 30.0)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(link.each_outgoing, post, nursery, True, stop_reading)
                task_status.started(Channel(ours, ours, tagged=True))
                await link.ended.wait()
                nursery.cancel_scope.cancel()
        finally:
            if state["session"] is not None:
                with trio.move_on_after(2) as cleanup:
                    cleanup.shield = True
                    try:
                        await client.delete(url, headers=headers("application/json"))
                    except httpx.HTTPError:
                        pass
    return link.reason


# --- legacy HTTP+SSE (2024-11-05) ---------------------------------------------------------


async def run_sse_server(
    config: Any, limit: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a 2024-11-05 HTTP+SSE server: GET an event stream, POST to the endpoint it names."""
    ours, theirs = byte_pipe()
    link = _Link(theirs, limit, config.name)
    async with _http_client(config) as client:
        endpoint: list[str] = []
        slots = trio.CapacityLimiter(MAX_CONCURRENT_POSTS)

        async def post(line: bytes) -> None:
            try:
                async with slots:
                    response = await client.post(
                        endpoint[0], content=line, headers={"content-type": "application/json"}
                    )
                if response.status_code >= 400:
                    link.end(f"the server refused a message with HTTP {response.status_code}")
            except httpx.HTTPError as exc:
                link.end(f"cannot reach {endpoint[0]}: {_describe(exc)}")

        try:
            async with client.stream("GET", config.url, headers={"accept": "text/event-stream"}) as response:
                if response.status_code != 200:
                    return f"GET {config.url} answered HTTP {response.status_code}"
                parser = SseParser(limit)
                async with trio.open_nursery() as nursery:

                    async def read() -> None:
                        async for chunk in response.aiter_bytes():
                            for event in parser.feed(chunk):
                                if event.event == "endpoint" and not endpoint:
                                    target = urljoin(config.url, event.data.strip())
                                    if urlsplit(target).netloc != urlsplit(config.url).netloc:
                                        link.end(f"the server named an endpoint on another host: {target}")
                                        return
                                    endpoint.append(target)
                                    nursery.start_soon(link.each_outgoing, post, nursery, True)
                                    task_status.started(Channel(ours, ours))
                                elif event.event == "message" and endpoint:
                                    await link.deliver(event.data)
                        link.end("the server closed its event stream")

                    nursery.start_soon(read)
                    await link.ended.wait()
                    nursery.cancel_scope.cancel()
        except httpx.HTTPError as exc:
            if not endpoint:
                raise OSError(f"cannot reach {config.url}: {_describe(exc)}") from None
            link.end(f"connection to {config.url} lost: {_describe(exc)}")
    return link.reason


# --- WebSocket ---------------------------------------------------------------------------


async def run_websocket_server(
    config: Any, limit: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a server over WebSocket (subprotocol ``mcp``), one message per frame."""
    ours, theirs = byte_pipe()
    link = _Link(theirs, limit, config.name)
    headers = [("user-agent", USER_AGENT), *((k, v) for k, v in config.headers.items())]
    try:
        async with trio_websocket.open_websocket_url(
            config.url,
            subprotocols=["mcp"],
            extra_headers=headers,
            message_queue_size=64,
            max_message_size=limit,
            connect_timeout=30,
        ) as socket:

            async def send(line: bytes) -> None:
                try:
                    await socket.send_message(line.decode("utf-8"))
                except trio_websocket.ConnectionClosed:
                    link.end("the WebSocket closed")

            async def read() -> None:
                try:
                    while True:
                        await link.deliver(await socket.get_message())
                except trio_websocket.ConnectionClosed as exc:
                    link.end(f"the WebSocket closed ({exc.reason.code if exc.reason else '?'})")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(link.each_outgoing, send, nursery, False)
                nursery.start_soon(read)
                task_status.started(Channel(ours, ours))
                await link.ended.wait()
                nursery.cancel_scope.cancel()
    except (trio_websocket.HandshakeError, OSError) as exc:
        raise OSError(f"cannot connect to {config.url}: {_describe(exc)}") from None
    return link.reason

"""Upstream servers over Streamable HTTP (MCP 2025-03-26 and later).

Each message is POSTed; what comes back on a POST (a JSON body or an event stream) answers
the request it carried. A request's event stream that ends before its answer is resumed
with GET and Last-Event-ID (2025-11-25 "Resumability and Redelivery") until it is answered,
cancelled or out of time. The GET stream carries what the server sends outside any request.
The session id and protocol version learnt from ``initialize`` go with every later request;
the session is DELETEd when the connection ends.

A request carrying modern ``_meta`` is posted statelessly and read by
``upstreams.streamable_http_modern``; cancelling one closes its response stream
(``notifications/cancelled`` is not posted to a modern server).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx
import trio

from aggregator.config.masking import shown_url
from aggregator.core.router import proxy_error
from aggregator.credentials.problems import ConsentRequired, CredentialError
from aggregator.jsonrpc.codec import dumps, loads
from aggregator.mcp.constants import CANCELLED, INITIALIZE, URL_ELICITATION_REQUIRED
from aggregator.mcp.modern import LISTEN
from aggregator.mcp.versions import DISCOVER
from aggregator.telemetry.tracing import trace_headers
from aggregator.transports.channel import Channel
from aggregator.transports.sse import SseParser
from aggregator.upstreams.http_client import BadResponse, UpstreamClient
from aggregator.upstreams.modern_headers import ToolHeaders, request_headers
from aggregator.upstreams.network_link import MAX_CONCURRENT_POSTS, NetworkLink, client_logs_masked, http_client
from aggregator.upstreams.resumption import (
    MAX_EMPTY_RESUMES,
    UNRESUMABLE,
    Reading,
    answered_id,
    cancelled_request,
    is_answer,
    retry_delay,
    stop,
)
from aggregator.upstreams.streamable_http_modern import answer_refusal, read_modern

log = logging.getLogger(__name__)
_CANCELLED_BYTES = f'"{CANCELLED}"'.encode()  # as the router writes it (no spaces)
# What one resumption says when the server still holds the broken stream (HTTP 409).
_HELD = "is still held by the server (HTTP 409)"


async def run_streamable_http_server(
    config: Any,
    limit: int,
    depth: int,
    *,
    auth: httpx.Auth | None = None,
    task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED,
) -> str:
    """Talk to a Streamable HTTP server (MCP 2025-03-26 and later); ``limit`` and ``depth``:
    the size and nesting a message of it may have; ``auth``: one user's own credential for
    it (a server with ``auth = "oauth"`` or ``"token-exchange"``; per-session)."""
    async with (
        http_client(config, auth) as client,
        UpstreamClient.for_server(client, config, per_user=auth is not None) as upstream,
    ):
        connection = _StreamableHttp(config, NetworkLink(config, limit, depth), upstream)
        with client_logs_masked(connection.link.mask):
            await connection.run(task_status)
    return connection.link.reason


def unauthorized_error(id: Any, server: str, problem: CredentialError, url_elicitation: bool) -> dict[str, Any]:
    """The error that answers a request no credential of the user's could be sent with.

    When the user must grant access first (``ConsentRequired``), its message and
    ``data.url`` name the URL to open; for a client that declared URL-mode elicitation
    (2025-11-25) it is error -32042, URL elicitation required, with the URL in
    ``data.elicitations`` as the spec defines it: the call cannot go on until the user has
    been there, and the client retries it once they have. (The proxy does not hold the
    call open meanwhile: a grant takes a person at a browser, longer than a request's
    timeout.)"""
    error = proxy_error(id, str(problem), reason="unauthorized", server=server)
    if isinstance(problem, ConsentRequired):
        data = error["error"]["data"]
        data["url"] = problem.url
        if url_elicitation:
            error["error"]["code"] = URL_ELICITATION_REQUIRED
            data["elicitations"] = [
                {
                    "mode": "url",
                    "elicitationId": problem.elicitation_id,
                    "url": problem.url,
                    "message": f"Server {server!r} acts as you: grant it access to continue.",
                }
            ]
    return error


class _StreamableHttp:
    """One connection to a Streamable HTTP server: its session, and the requests being read."""

    def __init__(self, config: Any, link: NetworkLink, client: UpstreamClient) -> None:
        self.config = config
        self.limit = link.limit
        self.link = link
        self.client = client
        self.url = config.url
        self.session: str | None = None
        self.version: str | None = None
        self.get_started = False
        # request id -> its POST and the resumptions of its event stream, until it is answered:
        # stopped when the request is cancelled (or answered on the GET stream instead).
        self.reading: dict[int | str, Reading] = {}
        self.slots = trio.CapacityLimiter(MAX_CONCURRENT_POSTS)
        self.nursery: trio.Nursery | None = None
        self.modern = False  # it has been sent a modern request (cancel = close the stream)
        self.tools = ToolHeaders(config.name)

    async def run(self, task_status: trio.TaskStatus[Channel]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.link.each_outgoing, self.post, nursery, True, self.stop_reading)
                nursery.start_soon(self.client.tidy)
                task_status.started(self.link.channel(streams=True))
                await self.link.ended.wait()
                nursery.cancel_scope.cancel()
        finally:
            if self.session is not None:
                with trio.move_on_after(2) as cleanup:
                    cleanup.shield = True
                    try:
                        await self.client.delete(self.url, headers=self.headers("application/json"))
                    except httpx.HTTPError:
                        pass

    def headers(self, accept: str) -> dict[str, str]:
        result = {"accept": accept}
        if self.session is not None:
            result["mcp-session-id"] = self.session
        if self.version is not None:
            result["mcp-protocol-version"] = self.version
        return result

    def session_ended(self) -> None:
        self.link.end("the server ended the session (404); starting a new one")

    async def answer_failed(self, message: Any, reason: str) -> None:
        """The POST of a request failed: answer it now so nothing waits for it."""
        if type(message) is dict and "method" in message and "id" in message:
            name = self.config.name
            text = f"Server {name!r} could not be reached: {reason}"
            await self.link.deliver(dumps(proxy_error(message["id"], text, reason="unavailable", server=name)))

    async def answer_unauthorized(self, message: Any, problem: CredentialError) -> None:
        """No credential of the user's could be sent: answer the request with what to do
        (the URL to open, when the user must grant access). Nothing was sent to the server."""
        if type(message) is dict and "method" in message and "id" in message:
            url_elicitation = bool(getattr(self.client.httpx.auth, "url_elicitation", False))
            await self.link.deliver(
                dumps(unauthorized_error(message["id"], self.config.name, problem, url_elicitation))
            )

    # --- a message to the server, and what comes back on its POST -------------------------

    async def post(self, line: bytes, message: Any) -> None:
        """POST one message: ``line`` is its body; ``message`` what it encodes, read here
        (decoded from ``line`` only when the router had it as bytes)."""
        if type(message) is not dict:
            try:
                message = loads(line)
            except ValueError:
                message = None
        # What comes back on this POST answers the request it carried, if it carried one.
        answers = message if type(message) is dict and "method" in message and "id" in message else None
        if self.modern and answers is None and type(message) is dict and message.get("method") == CANCELLED:
            return  # closing the request's stream (``stop_reading``) is its cancellation
        key = answers["id"] if answers is not None and type(answers["id"]) in (int, str) else None
        # Never longer than the request may last: a server that holds a stream open after the request
        # ended would otherwise hold a slot for ever (a modern listen lasts as long as the connection).
        lasts = math.inf if answers is not None and answers["method"] == LISTEN else self.config.max_request_timeout
        this = Reading(trio.CancelScope(deadline=trio.current_time() + lasts))
        with this.scope:
            if key is not None:
                self.reading[key] = this
            try:
                async with self.slots:
                    await self.post_and_read(line, message, answers, this)
            finally:
                if key is not None and self.reading.get(key) is this:
                    del self.reading[key]
        if this.scope.cancelled_caught and answers is not None:
            how, why = "resuming" if this.resuming else "reading", this.stopped or "its time is up"
            said = "server %s: stopped %s the answer to %s (id %s): %s"
            log.info(said, self.config.name, how, answers.get("method"), answers["id"], why)

    async def post_and_read(self, line: bytes, message: Any, answers: dict[str, Any] | None, this: Reading) -> None:
        is_initialize = type(message) is dict and message.get("method") == INITIALIZE
        modern = request_headers(answers, self.tools) if answers is not None else None
        if modern is not None and answers is not None:
            self.modern = self.modern or answers["method"] != DISCOVER  # (the probe goes to legacy servers too)
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", **modern}
        else:
            headers = {"content-type": "application/json", **self.headers("application/json, text/event-stream")}
        if answers is not None:
            headers.update(trace_headers(answers))  # the request's W3C trace context, as headers too
        try:
            async with self.client.stream("POST", self.url, content=line, headers=headers) as response:
                if modern is not None:
                    await read_modern(self, response, answers)
                    return
                outcome = await self.read_post(response, message, answers, is_initialize)
        except (httpx.LocalProtocolError, UnicodeEncodeError, BadResponse) as exc:  # it alone fails
            said = "" if isinstance(exc, BadResponse) else "the request cannot be sent: "
            await self.answer_failed(message, said + self.link.describe(exc))
            return
        except CredentialError as exc:  # no credential of the user's for it (yet): it alone fails
            await self.answer_unauthorized(message, exc)
            return
        except httpx.HTTPError as exc:
            await self.answer_failed(message, self.link.describe(exc))
            self.link.end(f"cannot reach {shown_url(self.url)}: {self.link.describe(exc)}")
            return
        if outcome is None:
            return
        parser, how = outcome
        if answers is not None:  # (always: a stream that answers no request counts as answered)
            this.resuming = True
            await self.resume_until_answered(answers, parser, is_initialize, how)

    async def read_post(
        self, response: Any, message: Any, answers: dict[str, Any] | None, is_initialize: bool
    ) -> tuple[SseParser, str] | None:
        """Read what came back on a POST; None when that is all, else the event stream's
        parser and how it ended before its answer (to resume it)."""
        status = response.status_code
        if status == 404 and self.session is not None:
            self.session_ended()
            return None
        if status == 202:  # for a notification or an answer; a request must be answered
            await self.link.no_answer(answers, "HTTP 202 Accepted, with no answer")
            return None
        if status != 200:  # a JSON-RPC error in a 4xx answers the request (a refused initialize too)
            said = await answer_refusal(self, response, answers)
            if is_initialize and said is not None:
                self.link.end(f"initialize was refused with {said}")
            return None
        if is_initialize:
            self.session = response.headers.get("mcp-session-id")
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "text/event-stream":  # the whole answer (``deliver_body``)
            await self.note_and_deliver(body := await response.aread(), is_initialize, answers)
            await self.link.deliver_body(body, answers, delivered=True)
            return None
        parser = SseParser(self.limit)
        try:
            if await self.read_events(response, parser, is_initialize, answers):
                return None
            how = "was closed"
        except httpx.HTTPError as exc:
            if not parser.last_event_id:
                raise  # a connection lost with nothing to resume: as for any failed POST
            how = f"broke ({self.link.describe(exc)})"
        return parser, how

    async def read_events(
        self, response: Any, parser: SseParser, is_initialize: bool, answers: dict[str, Any] | None
    ) -> bool:
        """Deliver the messages of one event stream (not a priming event's empty data);
        whether the answer to ``answers`` was among them (True when it answers nothing)."""
        answered = answers is None
        async for chunk in response.aiter_bytes():
            for event in parser.feed(chunk):
                if event.event == "message" and event.data:
                    if not answered:
                        answered = is_answer(event.data)
                    await self.note_and_deliver(event.data, is_initialize, answers)
        return answered

    async def note_and_deliver(self, data: bytes | str, is_initialize: bool, answers: dict[str, Any] | None) -> None:
        if is_initialize and self.version is None:
            try:
                result = loads(data.encode() if isinstance(data, str) else data).get("result") or {}
                self.version = result.get("protocolVersion")
            except (ValueError, AttributeError):
                pass
            if not self.get_started and self.nursery is not None:
                self.get_started = True
                self.nursery.start_soon(self.listen)
        await self.link.deliver(data, answers)

    # --- resuming a request's event stream ------------------------------------------------

    async def resume_until_answered(
        self, request: dict[str, Any], parser: SseParser, is_initialize: bool, how: str
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
                    await self.link.deliver(
                        self.link.refused_answer(request, f"more than {self.limit} bytes", {"reason": "too_large"})
                    )
                else:
                    await self.unresumable(request, UNRESUMABLE)
                return
            if empty >= MAX_EMPTY_RESUMES:
                await self.unresumable(
                    request,
                    f"the server ended the resumed response stream {empty} times in a row without sending anything",
                )
                return
            delay = retry_delay(parser.retry)
            log.info(
                "server %s: the response stream of %s (id %s) %s before its answer; resuming it in %.2fs",
                self.config.name,
                method,
                id,
                how,
                delay,
            )
            await trio.sleep(delay)
            parser.restart()
            last, opened = parser.last_event_id, trio.current_time()
            resumed = await self.resume_once(request, parser, is_initialize, last)
            if resumed is None:
                return
            how = resumed
            if how == _HELD:  # the server still holds the broken connection: try again
                empty += 1
                continue
            brought_nothing = parser.last_event_id == last and trio.current_time() - opened < 1.0
            empty = empty + 1 if brought_nothing else 0

    async def resume_once(
        self, request: dict[str, Any], parser: SseParser, is_initialize: bool, last: str
    ) -> str | None:
        """One GET resuming ``request``'s event stream: None when it is done with (answered,
        failed, the session ended), else how the stream ended before the answer."""
        try:
            async with self.client.stream(
                "GET", self.url, headers={**self.headers("text/event-stream"), "last-event-id": last}
            ) as response:
                status = response.status_code
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if status == 404 and self.session is not None:
                    self.session_ended()
                    return None
                if status == 409:
                    return _HELD
                if status != 200 or kind != "text/event-stream":
                    await self.refused_resumption(request, status, kind)
                    return None
                try:
                    if await self.read_events(response, parser, is_initialize, request):
                        return None
                    return "was closed again"
                except httpx.HTTPError as exc:
                    return f"broke again ({self.link.describe(exc)})"
        except httpx.HTTPError as exc:
            await self.answer_failed(request, self.link.describe(exc))
            self.link.end(f"cannot reach {shown_url(self.url)}: {self.link.describe(exc)}")
            return None

    async def refused_resumption(self, request: dict[str, Any], status: int, kind: str) -> None:
        log.warning(
            "server %s: HTTP %d (%s) for the GET resuming a response stream",
            self.config.name,
            status,
            kind or "no content type",
        )
        await self.unresumable(
            request,
            (
                f"the server refused to resume the response stream (HTTP {status})"
                if status != 200
                else f"the server answered the GET resuming the response stream with"
                f" {kind or 'no content type'}, not an event stream (HTTP 200)"
            ),
        )

    async def unresumable(self, request: dict[str, Any], problem: str) -> None:
        name = self.config.name
        log.warning(
            "server %s: cannot resume the answer to %s (id %s): %s", name, request.get("method"), request["id"], problem
        )
        await self.link.deliver(
            dumps(
                proxy_error(
                    request["id"], f"Server {name!r} did not answer: {problem}", reason="unavailable", server=name
                )
            )
        )

    def stop_reading(self, line: bytes) -> None:
        """A ``notifications/cancelled`` on its way: stop reading (or waiting to post, or
        resuming) the event stream of the request it cancels. A request cancelled before
        its task ran is missed, and waits for the server to close its stream, or for its time."""
        if self.reading and _CANCELLED_BYTES in line:
            stop(self.reading, cancelled_request(line), "the request was cancelled")

    # --- the GET stream ---------------------------------------------------------------------

    async def listen(self) -> None:
        """The GET stream: what the server sends outside any request. Reconnected with
        its Last-Event-ID, after a short backoff or the server's longer retry delay."""
        parser = SseParser(self.limit)
        delay = 0.5
        while True:
            request_headers = self.headers("text/event-stream")
            if parser.last_event_id:
                request_headers["last-event-id"] = parser.last_event_id
            wait = delay
            try:
                async with self.client.stream("GET", self.url, headers=request_headers) as response:
                    if response.status_code in (405, 404) or response.status_code >= 500:
                        if response.status_code == 404 and self.session is not None:
                            self.session_ended()
                        return  # no GET stream offered; requests' own streams still work
                    if response.status_code != 200:
                        return
                    delay = 0.5
                    await self.read_get_stream(response, parser)
                    if parser.retry is not None:  # closed: wait as asked, not less than usual
                        wait = max(delay, retry_delay(parser.retry))
            except httpx.HTTPError as exc:
                log.info("server %s: GET stream dropped (%s); reconnecting", self.config.name, self.link.describe(exc))
            parser.restart()
            await trio.sleep(wait)
            delay = min(delay * 2, 30.0)

    async def read_get_stream(self, response: httpx.Response, parser: SseParser) -> None:
        async for chunk in response.aiter_bytes():
            for event in parser.feed(chunk):
                if event.event == "message" and event.data:
                    if self.reading and '"method"' not in event.data:  # an answer, here: its own stream may stop
                        stop(self.reading, answered_id(event.data), "it was answered on the GET stream")
                    await self.link.deliver(event.data)

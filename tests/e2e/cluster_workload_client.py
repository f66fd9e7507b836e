"""A mixed workload through a balancer, with the official Python SDK:
``python cluster_workload_client.py URL KIND WORKERS ROUNDS SECONDS``.

KIND is ``modern`` (SDK 2.x pinned to 2026-07-28), ``legacy`` (SDK 2.x, ``initialize``) or
``sdk1`` (SDK 1.x, run with ``.venv-mcp1``). ``WORKERS`` clients of that kind at once, each
running at most ``ROUNDS`` rounds for at most ``SECONDS``, in front of ``modern_server.py``
(prefix ``modern``). A round is one of each: ``tools/list``; ``echo`` of a marker unique to
this client, round and step (the answer must carry that marker: no answer reaches the wrong
client); ``resources/list`` and ``resources/read``; ``prompts/get``; ``slow`` with progress;
``summarize``, whose server asks the client for sampling (the client answers); a resource
subscription (``resources/subscribe``, or ``subscriptions/listen`` for the modern client)
with ``bump`` and the update seen; ``echo`` of a text past ``max_result_tokens`` and its
rest paged back with ``resources/read`` of the link the cut result carries.

Each operation ends as ``ok``, ``retryable`` (a transport error, as when the replica serving
it died, or a JSON-RPC error saying ``retryable`` or ``unavailable``: the operation is sent
again, at most ``RETRIES`` times; ``retried_ok`` if it then succeeds), ``timeout`` (1.x
only: that SDK never fails a request whose POST stream broke, so the call is sent again once
its timeout passed), ``failed`` (any other
error, a wrong answer or a timeout, with its text kept in ``samples``) or ``crossed`` (an
answer carrying another call's marker). Prints ``{"done": N}`` after every operation ended,
then one last line: the counts per operation and outcome, the session ids each legacy client
sent (``sessions``: one per client, kept to the end, unless its SDK ended the connection:
``reconnects``) and a few error texts. Every wait is bounded.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import anyio

KIND = sys.argv[2] if __name__ == "__main__" else "modern"
SDK1 = KIND == "sdk1"
OP_TIMEOUT = 10.0  # seconds one operation may take
UPDATE_WAIT = 5.0  # seconds a subscriber waits for its update
RETRIES = 3
BIG = 6000  # characters of the big echo: past max_result_tokens = 500 (about 2000 characters)
COUNTER = "modern+test://counter"

if SDK1:
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamablehttp_client
    from pydantic import AnyUrl
else:
    import mcp_types as types
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client


HTTP_STATUS = "Server returned an error response"
MARKER = re.compile(r"(?:modern|legacy|sdk1)[0-9]+-r[0-9]+-[a-z]+-[0-9]+")
NEXT_PAGE = re.compile(r"aggregator://results/[A-Za-z0-9_-]+(?:\?page=[0-9]+)?")


class Retryable(Exception):
    """What the client may send again: the replica serving it is gone, or said so."""


def classify(error: BaseException) -> type[Exception]:
    """``Retryable`` for a transport error or a JSON-RPC error marked retryable/unavailable."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    data = getattr(getattr(error, "error", None), "data", None)
    if isinstance(data, dict) and (data.get("retryable") is True or data.get("reason") == "unavailable"):
        return Retryable
    names = {cls.__name__ for cls in type(error).__mro__}
    transport = {"HTTPError", "TransportError", "StreamableHTTPError", "ClosedResourceError", "BrokenResourceError"}
    transport |= {"EndOfStream", "ConnectionError", "RemoteProtocolError", "SubscriptionLost"}
    if names & transport:
        return Retryable
    code = getattr(getattr(error, "error", None), "code", None)
    if code == -32000 and ("closed" in str(error).lower() or str(error).startswith("SSE stream")):
        # The SDK's own words (CONNECTION_CLOSED) when its stream ended mid-call: "Connection
        # closed", or "SSE stream ended without a response" when the replica serving a POST's
        # stream died before it sent an event id the SDK could resume from.
        return Retryable
    if code == -32603 and str(error) == HTTP_STATUS and not data:
        return Retryable  # the 2.x SDK's words for a POST answered 502 (the balancer's: the replica died)
    return Exception


def retry_after(error: BaseException) -> float:
    """The seconds a JSON-RPC error asks before its request is sent again (``retryAfter``,
    as a draining replica says), bounded; 0 when it asks none."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    data = getattr(getattr(error, "error", None), "data", None)
    seconds = data.get("retryAfter") if isinstance(data, dict) else None
    return min(float(seconds), 3.0) if isinstance(seconds, (int, float)) and seconds > 0 else 0.0


def dead(error: BaseException) -> bool:
    """Whether the SDK's connection itself ended (its streams closed)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"ClosedResourceError", "BrokenResourceError", "EndOfStream"})


def describe(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    data = getattr(getattr(error, "error", None), "data", None)
    return f"{type(error).__name__}: {str(error)[:160]}" + (f" {json.dumps(data)[:160]}" if data else "")


def texts(result: Any) -> list[str]:
    return [str(item.text) for item in result.content if getattr(item, "type", "") == "text"]


def links(result: Any) -> list[str]:
    return [str(item.uri) for item in result.content if getattr(item, "type", "") == "resource_link"]


def is_error(result: Any) -> bool:
    return bool(getattr(result, "isError", None) or getattr(result, "is_error", None))


async def on_sample(context: Any, params: Any) -> Any:
    said = getattr(params.messages[0].content, "text", "")
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"short: {said}"), model="stub-model"
    )


class Peer:
    """One client (one session for the legacy kinds), connected again if its SDK ended it."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.client: Any = None
        self.updates: list[str] = []
        self.sessions: list[str] = []  # every Mcp-Session-Id it sent, in order, once each
        self.reconnects = 0
        self.statuses: Counter[str] = Counter()  # HTTP error statuses the 2.x client got
        self.round = 0  # where the workload is, kept across connections
        self.step = 0
        self.attempt = 0  # of the operation at hand: retries so far
        self.in_flight: str | None = None  # an operation sent and not counted yet

    def saw_session(self, session: str | None) -> None:
        if session and (not self.sessions or self.sessions[-1] != session):
            self.sessions.append(session)

    async def message(self, message: Any) -> None:
        message = getattr(message, "root", message)
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))

    async def run(self, body: Any, ended: Any) -> None:
        """Run ``body(self)`` with a connected client until it returns; connect again when the
        SDK ends the connection (what an application does)."""
        while True:
            try:
                await self._connected(body)
                return
            except Exception as error:  # noqa: BLE001 - an ended connection: connect again, bounded by the caller
                if classify(error) is not Retryable or self.reconnects >= 20:
                    raise
                ended(error)
                self.reconnects += 1
                self.client = None
                await anyio.sleep(0.2)

    async def _connected(self, body: Any) -> None:
        if SDK1:
            # The session is not ended at the close (no DELETE): the test checks it still answers.
            async with streamablehttp_client(self.url, terminate_on_close=False) as (read, write, session_id):
                async with ClientSession(read, write, sampling_callback=on_sample, message_handler=self.message) as s:
                    await s.initialize()
                    self.saw_session(session_id())
                    self.client = s
                    await body(self)
                    self.saw_session(session_id())
            return
        http = create_mcp_http_client()

        async def sent(request: Any) -> None:
            self.saw_session(request.headers.get("mcp-session-id"))

        async def answered(response: Any) -> None:
            if response.status_code >= 400:
                self.statuses[str(response.status_code)] += 1

        http.event_hooks["request"].append(sent)
        http.event_hooks["response"].append(answered)
        mode = "2026-07-28" if KIND == "modern" else "legacy"
        async with (
            http,
            Client(
                streamable_http_client(self.url, http_client=http, terminate_on_close=False),
                mode=mode,  # type: ignore[arg-type]
                sampling_callback=on_sample,
                message_handler=self.message,
                cache=None,
            ) as client,
        ):
            self.client = client
            await body(self)

    # The operations: each returns nothing, raises on a wrong answer.

    async def tools(self, marker: str) -> None:
        found = await self.client.list_tools()
        assert any(tool.name == "modern__echo" for tool in found.tools), "no echo tool"

    async def echo(self, marker: str) -> None:
        said = texts(await self.client.call_tool("modern__echo", {"text": marker}))
        if said != [marker]:
            raise Crossed(f"{marker} got {said}")

    async def resources(self, marker: str) -> None:
        listed = await self.client.list_resources()
        assert COUNTER in [str(r.uri) for r in listed.resources], "no counter"
        read = await self.client.read_resource(AnyUrl(COUNTER) if SDK1 else COUNTER)
        assert str(read.contents[0].text).isdigit(), read

    async def prompt(self, marker: str) -> None:
        got = await self.client.get_prompt("modern__greeting", {"name": marker, "style": "pirate"})
        said = str(got.messages[0].content.text)
        if said != f"Ahoy, {marker}!":
            raise Crossed(f"{marker} got {said}")

    async def progress(self, marker: str) -> None:
        steps: list[float] = []

        async def seen(value: float, total: float | None, message: str | None) -> None:
            steps.append(value)

        result = await self.client.call_tool("modern__slow", {"steps": 3, "delay": 0.05}, progress_callback=seen)
        assert texts(result) == ["done after 3 steps"] and steps, (texts(result), steps)

    async def sampling(self, marker: str) -> None:
        result = await self.client.call_tool("modern__summarize", {"text": marker})
        said = texts(result)
        if said != [f"summary: short: {marker}"]:
            if not is_error(result) and any(marker not in text for text in said):
                raise Crossed(f"{marker} got {said}")
            raise AssertionError(f"summarize: {said}")

    async def subscription(self, marker: str) -> None:
        if KIND == "modern":
            async with self.client.listen(resource_subscriptions=[COUNTER]) as subscription:
                await self.client.call_tool("modern__bump", {})
                with anyio.fail_after(UPDATE_WAIT):
                    async for event in subscription:
                        if str(getattr(event, "uri", "")) == COUNTER:
                            return
            return
        self.updates.clear()
        await self.client.subscribe_resource(AnyUrl(COUNTER) if SDK1 else COUNTER)
        await self.client.call_tool("modern__bump", {})
        with anyio.move_on_after(UPDATE_WAIT):
            while COUNTER not in self.updates:  # noqa: ASYNC110 - the SDK's handler has no event of its own
                await anyio.sleep(0.02)
            return
        raise AssertionError("no notifications/resources/updated within the wait")

    async def kept(self, marker: str) -> None:
        text = (marker + " ") * (BIG // (len(marker) + 1))
        result = await self.client.call_tool("modern__echo", {"text": text})
        [first] = texts(result)[:1] or [""]
        if not first.startswith(marker):
            raise Crossed(f"{marker} got {first[:60]}")
        rest: list[str] = []
        uris = links(result)
        assert uris and uris[0].startswith("aggregator://results/"), f"not cut: {uris}"
        uri: str | None = uris[0]
        for _ in range(20):
            if uri is None:
                break
            page = await self.client.read_resource(AnyUrl(uri) if SDK1 else uri)
            body = str(page.contents[0].text)
            following = [found for found in NEXT_PAGE.findall(body) if found != uri]
            rest.append(NEXT_PAGE.sub(" ", body))
            uri = following[-1] if following else None
        # Every marker in the whole text (its pages cut anywhere) is this call's.
        others = {found for found in MARKER.findall(first + "".join(rest)) if found != marker}
        if others:
            raise Crossed(f"{marker} got {sorted(others)[:3]}")
        assert marker in "".join(rest), "the rest lacks this call's marker"


class Crossed(Exception):
    """An answer that carries another call's marker."""


OPERATIONS = ["tools", "echo", "resources", "prompt", "progress", "sampling", "subscription", "kept"]


async def main(url: str, workers: int, rounds: int, seconds: float) -> dict[str, Any]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    samples: dict[str, list[str]] = defaultdict(list)
    ended = 0
    deadline = time.monotonic() + seconds
    peers = [Peer(url, f"{KIND}{index}") for index in range(workers)]

    def end(operation: str, outcome: str, error: BaseException | None = None) -> None:
        nonlocal ended
        counts[operation][outcome] += 1
        if error is not None and len(samples[f"{operation} {outcome}"]) < 3:
            samples[f"{operation} {outcome}"].append(describe(error))
        ended += 1
        print(json.dumps({"done": ended}), flush=True)

    async def one(peer: Peer, operation: str, marker: str) -> None:
        """One operation, sent again while its error says it may be; its outcome counted. A
        transport error ends the SDK's connection: raised, to connect again and resume here."""
        while True:
            attempt = peer.attempt
            peer.in_flight = operation
            try:
                with anyio.fail_after(OP_TIMEOUT):
                    await getattr(peer, operation)(f"{marker}-{attempt}")
            except Crossed as error:
                end(operation, "crossed", error)
            except Exception as error:  # noqa: BLE001 - every error is counted, by kind
                retry = classify(error) is Retryable or (SDK1 and isinstance(error, TimeoutError))
                if retry and attempt < RETRIES:
                    peer.in_flight = None
                    peer.attempt += 1
                    end(operation, "timeout" if isinstance(error, TimeoutError) else "retryable", error)
                    if dead(error):
                        raise  # the SDK ended its connection: connect again, then resume here
                    await anyio.sleep(retry_after(error))  # as a client that honours it does
                    continue  # the same connection goes on: send it again
                end(operation, "failed", error)
            else:
                end(operation, "retried_ok" if attempt else "ok")
            peer.in_flight = None
            peer.attempt = 0
            return

    async def work(peer: Peer) -> None:
        async def body(connected: Peer) -> None:
            while peer.round < rounds and time.monotonic() < deadline:
                while peer.step < len(OPERATIONS):
                    operation = OPERATIONS[peer.step]
                    await one(connected, operation, f"{peer.name}-r{peer.round}-{operation}")
                    peer.step += 1
                peer.step = 0
                peer.round += 1

        def ended(error: BaseException) -> None:
            """The connection ended under an operation not counted yet: counted, sent again."""
            if peer.in_flight is not None:
                end(peer.in_flight, "retryable", error)
                peer.in_flight = None
                peer.attempt += 1

        with anyio.fail_after(seconds + 30):
            await peer.run(body, ended)

    async with anyio.create_task_group() as group:
        for peer in peers:
            group.start_soon(work, peer)
    return {
        "kind": KIND,
        "counts": {operation: dict(outcomes) for operation, outcomes in counts.items()},
        "sessions": [peer.sessions for peer in peers] if KIND != "modern" else [],
        "reconnects": sum(peer.reconnects for peer in peers),
        "statuses": dict(sum((peer.statuses for peer in peers), Counter())),
        "samples": dict(samples),
    }


if __name__ == "__main__":
    url, _, workers, rounds, seconds = sys.argv[1:6]
    tally = anyio.run(main, url, int(workers), int(rounds), float(seconds))
    print(json.dumps(tally), flush=True)

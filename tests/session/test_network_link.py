"""What a network server's connection hands its session: each message decoded once, under
the proxy's limits, with the request whose POST it came back on (``ServerMessage.related``),
and what the router could not tie to a request made that request's answer.

``NetworkLink.deliver`` in memory, its session end read directly; every wait bounded.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import trio

from aggregator.jsonrpc import ERROR, NOTIFICATION, RESPONSE, RemoteProtocolError, dumps, loads
from aggregator.transports.channel import ServerMessage
from aggregator.upstreams.network_link import NetworkLink

LIMIT, DEPTH = 1024, 16
CONFIG = types.SimpleNamespace(name="s", headers={}, env={})
CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t"}}
LIFECYCLE = {"jsonrpc": "2.0", "id": "aggregator-1", "method": "tools/list"}


async def delivered(data: bytes | str, answers: dict[str, Any] | None = None) -> list[ServerMessage]:
    link = NetworkLink(CONFIG, LIMIT, DEPTH)
    channel = link.channel(streams=True)
    assert channel.messages is not None and channel.streams
    with trio.fail_after(5):
        await link.deliver(data, answers)
    out = []
    while True:
        try:
            out.append(channel.messages.receive_nowait())
        except trio.WouldBlock:
            return out


def answer(id: Any = 7, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, **(fields or {"result": {"content": []}})}


async def test_an_answer_on_its_post_comes_decoded_with_its_request() -> None:
    raw = dumps(answer())
    [message] = await delivered(raw, CALL)
    assert message == ServerMessage((RESPONSE, answer()), 7, raw)


@pytest.mark.parametrize(
    ("answers", "related"),
    [(None, None), (LIFECYCLE, None)],
    ids=["on the GET stream: of no request", "on a lifecycle request's POST: its id is not an upstream id"],
)
async def test_what_belongs_to_no_upstream_request_comes_without_one(answers: Any, related: Any) -> None:
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    [message] = await delivered(dumps(note), answers)
    assert message.decoded == (NOTIFICATION, note) and message.related is related


async def test_pretty_printed_json_is_read_as_one_line() -> None:
    text = '{\n  "jsonrpc": "2.0",\n  "id": 7,\r\n  "result": {"n": 1.50}\n}\n'
    [message] = await delivered(text, CALL)
    assert message.raw == b'{"jsonrpc":"2.0","id":7,"result":{"n":1.50}}'
    assert message.decoded == (RESPONSE, loads(message.raw)) and message.related == 7


async def test_a_refusal_that_names_its_request_goes_to_the_router_as_it_is() -> None:
    deep: Any = 1
    for _ in range(DEPTH):
        deep = [deep]
    raw = dumps(answer(result={"deep": deep}))
    [message] = await delivered(raw, CALL)
    assert isinstance(message.decoded, RemoteProtocolError)
    assert message.decoded.response_to == 7 and message.decoded.data["reason"] == "too_large"
    assert message.raw == raw and message.related == 7


async def test_an_unreadable_answer_on_a_post_is_its_request_failing() -> None:
    [message] = await delivered(b"\xff\xfe{not json", CALL)
    kind, error = message.decoded  # type: ignore[misc]
    assert kind == ERROR and error["id"] == 7 and message.related == 7
    assert error["error"]["data"]["reason"] == "malformed" and error["error"]["data"]["server"] == "s"
    assert "tools/call" in error["error"]["message"]


async def test_an_unreadable_message_off_any_post_is_left_to_the_router() -> None:
    [message] = await delivered(b"\xff\xfe{not json")
    assert isinstance(message.decoded, RemoteProtocolError) and message.related is None


async def test_an_error_for_the_unreadable_on_a_post_answers_its_request() -> None:
    error = {"code": -32700, "message": "Parse error"}
    [message] = await delivered(dumps(answer(None, error=error)), CALL)
    assert message.decoded == (ERROR, answer(7, error=error)) and message.raw == dumps(answer(7, error=error))


async def test_an_oversized_answer_fails_its_request_and_is_dropped_elsewhere() -> None:
    raw = dumps(answer(result={"text": "x" * LIMIT}))
    [message] = await delivered(raw, CALL)
    kind, error = message.decoded  # type: ignore[misc]
    assert kind == ERROR and error["id"] == 7 and error["error"]["data"]["reason"] == "too_large"
    assert await delivered(raw) == []


async def test_blank_messages_are_not_delivered() -> None:
    assert await delivered(" \r\n ", CALL) == []


@pytest.mark.parametrize("as_bytes", [False, True])
async def test_the_initialized_notification_reaches_the_server_before_what_follows_it(
    as_bytes: bool, autojump_clock: Any
) -> None:
    # Each POST goes in a task of its own, so they arrive in any order; a server may refuse a
    # request before notifications/initialized (the MCP SDK's own servers do): it goes first.
    link = NetworkLink(CONFIG, LIMIT, DEPTH)
    channel = link.channel()
    initialized: Any = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    if as_bytes:
        initialized = dumps(initialized)
    arrived: list[str] = []
    both = trio.Event()

    async def post(line: bytes, message: Any) -> None:
        method = loads(line)["method"]
        if method == "notifications/initialized":
            await trio.sleep(1)  # a server slow to take it
        arrived.append(method)
        if len(arrived) == 2:
            both.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.each_outgoing, post, nursery, True)
            messages = [(initialized, initialized if as_bytes else dumps(initialized)), (LIFECYCLE, dumps(LIFECYCLE))]
            data = b"".join(line + b"\n" for _, line in messages)
            await channel.send.send_messages(data, [(message, len(line) + 1) for message, line in messages])
            await both.wait()
            nursery.cancel_scope.cancel()
    assert arrived == ["notifications/initialized", "tools/list"]

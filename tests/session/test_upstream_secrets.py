"""A server's secrets (the values of its ``headers`` and ``env``) never reach the log,
``check`` or a client, even when the connection fails with an exception that quotes one.

The config check refuses a header value the HTTP client would refuse (a line break, a
NUL); these tests build the config past that check, as if a value had slipped through,
and connect for real to a socket listening on 127.0.0.1.
"""

from __future__ import annotations

import logging
import traceback
from functools import partial

import attrs
import pytest
import trio
import trio.testing

from aggregator.cli.common import status_lines
from aggregator.config import structure_config
from aggregator.hub import Hub
from aggregator.session import serve_stream_session
from aggregator.transports.masking import SecretMask
from tests.session.harness import Client

SECRET = "sekrit-token-123"
ENV_SECRET = "env-secret-456"


async def _accept_and_close(stream: trio.SocketStream) -> None:
    with trio.move_on_after(1):
        await stream.receive_some(65536)
    await stream.aclose()


def _config(url: str, headers: dict[str, str]):
    config = structure_config(
        {"proxy": {"startup_timeout": 5.0}, "servers": {"a": {"url": "http://127.0.0.1:9/mcp", "init_timeout": 2.0}}},
        environ={},
    )
    server = attrs.evolve(config.servers["a"], url=url, headers=headers, env={"API_KEY": ENV_SECRET})
    return attrs.evolve(config, servers={"a": server})


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        record.getMessage() + ("".join(traceback.format_exception(*record.exc_info)) if record.exc_info else "")
        for record in caplog.records
    )


@pytest.mark.parametrize("transport, scheme", [("streamable-http", "http"), ("sse", "http"), ("websocket", "ws")])
@pytest.mark.parametrize("value", [f"Bearer {SECRET}\n", f"Bearer {SECRET}\r\nX-Api-Key: {ENV_SECRET}"])
async def test_a_refused_header_value_is_masked_in_the_log_check_and_last_error(caplog, transport, scheme, value):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="httpcore")  # as ``aggregator.cli.main`` sets it: no traces
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, _accept_and_close, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            config = _config(f"{scheme}://127.0.0.1:{port}/mcp", {"Authorization": value})
            config = attrs.evolve(config, servers={"a": attrs.evolve(config.servers["a"], transport=transport)})
            hub = Hub(config)
            await nursery.start(hub.run)
            await hub.startup_done.wait()
            upstream = hub.upstreams["a"]
            assert upstream.state == "down" and upstream.last_error

            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_stream_session, hub, theirs, theirs)
            client = Client(ours)
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__x", "arguments": {}})
            nursery.cancel_scope.cancel()
    last_error = answer["error"]["data"]["lastError"]
    check = "\n".join(status_lines(hub))
    logged = _log_text(caplog)
    for text in (last_error, check, logged):
        assert SECRET not in text and ENV_SECRET not in text
    # The failure itself is still told (the value refused, shown as ***), not swallowed.
    assert "***" in last_error and "***" in check and "***" in logged, (last_error, check)


def test_the_mask_covers_a_value_as_an_exception_quotes_it():
    mask = SecretMask([f"Bearer {SECRET}\n", "abc", ENV_SECRET])
    assert mask(f"Illegal header value b'Bearer {SECRET}\\n'") == "Illegal header value b'***'"
    assert mask(f"value 'Bearer {SECRET}\\n' refused") == "value '***' refused"
    assert mask(f"first line: Bearer {SECRET}") == "first line: ***"  # a message cut at the line break
    assert mask(f"{ENV_SECRET} and abc") == "*** and abc"  # shorter than 4: not a secret

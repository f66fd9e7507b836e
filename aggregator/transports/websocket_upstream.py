"""Upstream servers over WebSocket (subprotocol ``mcp``): one JSON-RPC message per frame."""

from __future__ import annotations

from typing import Any

import trio
import trio_websocket

from aggregator.transports.network_link import USER_AGENT, NetworkLink
from aggregator.transports.pipe import byte_pipe
from aggregator.transports.stdio import Channel


async def run_websocket_server(
    config: Any, limit: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a server over WebSocket (subprotocol ``mcp``), one message per frame."""
    ours, theirs = byte_pipe()
    link = NetworkLink(theirs, limit, config)
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
        raise OSError(f"cannot connect to {config.url}: {link.describe(exc)}") from None
    return link.reason

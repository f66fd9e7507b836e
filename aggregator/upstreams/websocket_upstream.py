"""Upstream servers over WebSocket (subprotocol ``mcp``): one JSON-RPC message per frame."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import trio
import trio_websocket

from aggregator.config.masking import shown_url
from aggregator.transports.channel import Channel
from aggregator.upstreams.network_link import USER_AGENT, NetworkLink, client_logs_masked


async def run_websocket_server(
    config: Any, limit: int, depth: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a server over WebSocket (subprotocol ``mcp``), one message per frame."""
    link = NetworkLink(config, limit, depth)
    with client_logs_masked(link.mask):
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

                async def send(line: bytes, message: Any) -> None:
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
                    task_status.started(link.channel())
                    await link.ended.wait()
                    nursery.cancel_scope.cancel()
        except (trio_websocket.HandshakeError, OSError) as exc:
            raise OSError(f"cannot connect to {shown_url(config.url)}: {_refusal(exc, link)}") from None
    return link.reason


def _refusal(exc: BaseException, link: NetworkLink) -> str:
    """Why the handshake failed: what the server answered (status, reason, the start of its
    body), or the network error under trio-websocket's bare HandshakeError."""
    if isinstance(exc, trio_websocket.ConnectionRejected):
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = ""
        text = f"the server answered HTTP {exc.status_code}{' ' + phrase if phrase else ''}"
        body = (exc.body or b"")[:200].decode("utf-8", "replace").strip()
        return f"{text}: {link.describe(ValueError(body))}" if body else text
    if isinstance(exc, trio_websocket.HandshakeError) and not str(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return link.describe(exc)

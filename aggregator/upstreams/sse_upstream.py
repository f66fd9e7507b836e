"""Upstream servers over the legacy HTTP+SSE transport (MCP 2024-11-05): GET an event
stream, POST each message to the endpoint its first event names (on the same host only)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import trio

from aggregator.config.masking import shown_url
from aggregator.transports.channel import Channel
from aggregator.transports.sse import SseParser
from aggregator.upstreams.network_link import MAX_CONCURRENT_POSTS, NetworkLink, client_logs_masked, http_client


async def run_sse_server(
    config: Any, limit: int, depth: int, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Talk to a 2024-11-05 HTTP+SSE server: GET an event stream, POST to the endpoint it names."""
    link = NetworkLink(config, limit, depth)
    with client_logs_masked(link.mask):
        async with http_client(config) as client:
            endpoint: list[str] = []
            slots = trio.CapacityLimiter(MAX_CONCURRENT_POSTS)

            async def post(line: bytes, message: Any) -> None:
                try:
                    async with slots:
                        response = await client.post(
                            endpoint[0], content=line, headers={"content-type": "application/json"}
                        )
                    if response.status_code >= 400:
                        link.end(f"the server refused a message with HTTP {response.status_code}")
                except httpx.HTTPError as exc:
                    link.end(f"cannot reach {shown_url(endpoint[0])}: {link.describe(exc)}")

            try:
                async with client.stream("GET", config.url, headers={"accept": "text/event-stream"}) as response:
                    if response.status_code != 200:
                        # Before the channel is handed over: a failure to start, as for a network error.
                        raise OSError(f"GET {shown_url(config.url)} answered HTTP {response.status_code}")
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
                                        task_status.started(link.channel())
                                    elif event.event == "message" and endpoint:
                                        await link.deliver(event.data)
                            link.end("the server closed its event stream")

                        nursery.start_soon(read)
                        await link.ended.wait()
                        nursery.cancel_scope.cancel()
            except httpx.HTTPError as exc:
                if not endpoint:
                    raise OSError(f"cannot reach {shown_url(config.url)}: {link.describe(exc)}") from None
                link.end(f"connection to {shown_url(config.url)} lost: {link.describe(exc)}")
    return link.reason

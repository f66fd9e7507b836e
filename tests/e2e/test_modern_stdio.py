"""Modern (2026-07-28) clients through `aggregator serve --stdio`, in front of legacy servers.

The official Python SDK 2.x client, pinned to 2026-07-28 (no initialize: every request
carries its `_meta`) and in its default `auto` mode (which probes `server/discover` first
and must now choose the modern revision), against mcp-server-time,
@modelcontextprotocol/server-everything and the fault server's `rug_pull` mode (whose
tool list changes on demand): tools, resources, prompts, progress and a
`subscriptions/listen` stream that sees a list change. The 1.x (legacy) client is
tests/e2e/test_sdk1.py.
"""

from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from tests.e2e.conftest import fake, write_config

pytestmark = pytest.mark.e2e

MODERN = "2026-07-28"


def servers(tmp_path, everything_js):
    return write_config(
        tmp_path,
        f'''
[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
'''
        + fake("fake", "rug_pull"),
        page_size=5,
        startup_timeout=20.0,
        list_changed_debounce=0.05,
    )


def client_for(config, mode):
    argv = ["-m", "aggregator", "serve", "--stdio", "--config", str(config)]
    return Client(StdioServerParameters(command=sys.executable, args=argv), mode=mode, cache=None)


async def all_pages(fetch, key):
    items, cursor = [], None
    for _ in range(50):  # bounded: a cursor that never ends fails the test
        result = await fetch(cursor=cursor)
        items += getattr(result, key)
        cursor = result.next_cursor
        if not cursor:
            return items
    raise AssertionError("the pages never ended")


def test_a_pinned_modern_client_is_served_without_initialize(tmp_path, everything_js):
    config = servers(tmp_path, everything_js)

    async def main():
        with anyio.fail_after(60):
            await session()

    async def session():
        async with client_for(config, MODERN) as client:
            assert client.protocol_version == MODERN

            tools = await all_pages(client.list_tools, "tools")
            names = [t.name for t in tools]
            assert {"time__get_current_time", "everything__get-sum", "fake__echo", "fake__rug"} <= set(names)
            assert len(names) == len(set(names))
            assert names == [t.name for t in await all_pages(client.list_tools, "tools")]  # a stable order

            result = await client.call_tool("everything__get-sum", {"a": 2, "b": 40})
            assert not result.is_error and "42" in result.content[0].text
            result = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            assert not result.is_error and "UTC" in result.content[0].text

            resources = await all_pages(client.list_resources, "resources")
            uri = next(r.uri for r in resources if r.uri.startswith("everything+demo://"))
            read = await client.read_resource(uri)
            assert str(read.contents[0].uri) == uri

            prompt = await client.get_prompt("everything__args-prompt", {"city": "Lisbon"})
            assert "Lisbon" in prompt.messages[0].content.text

            progress = []

            async def on_progress(done, total, message):
                progress.append(done)

            result = await client.call_tool(
                "everything__trigger-long-running-operation",
                {"duration": 0.3, "steps": 3},
                progress_callback=on_progress,
            )
            assert not result.is_error and len(progress) >= 2 and progress == sorted(progress)

            # A listen stream hears the list change the fault server announces; nothing
            # reaches the client outside it.
            async with client.listen(tools_list_changed=True) as subscription:
                await client.call_tool("fake__rug", {})
                with anyio.fail_after(10):
                    async for event in subscription:
                        assert isinstance(event, ToolsListChanged), event
                        break
            echo = next(t for t in await all_pages(client.list_tools, "tools") if t.name == "fake__echo")
            assert echo.description != next(t for t in tools if t.name == "fake__echo").description

    anyio.run(main)


def test_a_dual_era_client_chooses_the_modern_revision(tmp_path, everything_js):
    config = servers(tmp_path, everything_js)

    async def main():
        with anyio.fail_after(60):
            await session()

    async def session():
        async with client_for(config, "auto") as client:
            assert client.protocol_version == MODERN
            assert client.server_info.name == "aggregator"
            assert "Server everything" in (client.instructions or "")
            result = await client.call_tool("fake__echo", {"said": "hi"})
            assert "hi" in result.content[0].text

    anyio.run(main)


def test_a_listen_hears_updates_of_the_resources_it_names(tmp_path, everything_js):
    """server-everything, once told to, reports every subscribed resource as updated
    every 5 s: the proxy subscribes upstream for the listen and tags what comes back."""
    config = servers(tmp_path, everything_js)

    async def main():
        with anyio.fail_after(60):
            await session()

    async def session():
        async with client_for(config, MODERN) as client:
            resources = await all_pages(client.list_resources, "resources")
            uri = next(r.uri for r in resources if r.uri.startswith("everything+demo://"))
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                await client.call_tool("everything__toggle-subscriber-updates", {})
                with anyio.fail_after(15):
                    async for event in subscription:
                        assert isinstance(event, ResourceUpdated), event
                        assert event.uri == uri  # under the proxy's name for it
                        break

    anyio.run(main)

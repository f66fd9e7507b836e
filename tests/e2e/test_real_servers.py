"""The proxy in stdio mode in front of three real third-party servers, driven by the SDK.

mcp-server-time and mcp-server-git (PyPI) and @modelcontextprotocol/server-everything
(npm) run behind `aggregator serve --stdio`; the official `mcp` client (2.x, pinned to the
legacy era) talks to it.
"""

from __future__ import annotations

import json
import sys
import time

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import PromptReference, ResourceTemplateReference

from tests.e2e.conftest import time_and_git, write_config

pytestmark = pytest.mark.e2e


def three_servers(tmp_path, git_repo, everything_js):
    return write_config(
        tmp_path,
        time_and_git(git_repo)
        + f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
''',
        page_size=5,
        startup_timeout=20.0,
    )


def client_for(config):
    return Client(
        StdioServerParameters(
            command=sys.executable, args=["-m", "aggregator", "serve", "--stdio", "--config", str(config)]
        ),
        mode="legacy",  # the legacy era; tests/e2e/test_modern_stdio.py drives the modern one
    )


async def all_pages(fetch, key):
    items, cursor, pages = [], None, 0
    while True:
        result = await fetch(cursor=cursor)
        pages += 1
        items += getattr(result, key)
        cursor = result.next_cursor
        if not cursor:
            return items, pages


def test_three_real_servers_through_one_endpoint(tmp_path, git_repo, everything_js):
    config = three_servers(tmp_path, git_repo, everything_js)

    async def main():
        started = time.monotonic()
        async with client_for(config) as client:
            # Pinned to the legacy era: initialize at once, no probe.
            assert time.monotonic() - started < 9
            assert client.server_info.name == "aggregator"
            assert client.protocol_version == "2025-11-25"
            assert "Server everything" in (client.instructions or "")

            tools, pages = await all_pages(client.list_tools, "tools")
            names = [t.name for t in tools]
            assert pages >= 4 and len(names) == len(set(names))
            assert {
                "time__get_current_time",
                "time__convert_time",
                "git__git_status",
                "git__git_log",
                "everything__echo",
                "everything__get-sum",
            } <= set(names)
            assert all(n.split("__", 1)[0] in ("time", "git", "everything") for n in names)

            result = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            assert not result.is_error and json.loads(result.content[0].text)["timezone"] == "UTC"
            result = await client.call_tool("git__git_log", {"repo_path": str(git_repo), "max_count": 1})
            assert not result.is_error and "first" in result.content[0].text
            result = await client.call_tool("everything__get-sum", {"a": 2, "b": 40})
            assert "42" in result.content[0].text
            structured = next(t for t in tools if t.name == "everything__get-structured-content")
            assert structured.output_schema is not None
            result = await client.call_tool("everything__get-structured-content", {"location": "New York"})
            assert result.structured_content and "temperature" in result.structured_content
            # An upstream's own tool error passes through as a result with isError.
            result = await client.call_tool("time__get_current_time", {"timezone": "Not/AZone"})
            assert result.is_error

            resources, _ = await all_pages(client.list_resources, "resources")
            uris = [r.uri for r in resources]
            assert uris and all(u.startswith("everything+demo://") for u in uris)
            read = await client.read_resource(uris[0])
            assert read.contents[0].uri == uris[0]
            templates, _ = await all_pages(client.list_resource_templates, "resource_templates")
            template = next(t.uri_template for t in templates if "dynamic/text" in t.uri_template)
            assert template == "everything+demo://resource/dynamic/text/{resourceId}"
            read = await client.read_resource(template.replace("{resourceId}", "3"))
            assert read.contents[0].uri == "everything+demo://resource/dynamic/text/3"

            # Follow a resource_link from a tool result.
            result = await client.call_tool("everything__get-resource-links", {"count": 2})
            links = [c for c in result.content if c.type == "resource_link"]
            assert links and all(str(link.uri).startswith("everything+demo://") for link in links)
            read = await client.read_resource(str(links[0].uri))
            assert read.contents and str(read.contents[0].uri) == str(links[0].uri)

            prompts, _ = await all_pages(client.list_prompts, "prompts")
            assert {"everything__simple-prompt", "everything__args-prompt"} <= {p.name for p in prompts}
            prompt = await client.get_prompt("everything__args-prompt", {"city": "Lisbon"})
            assert "Lisbon" in prompt.messages[0].content.text
            embedded = await client.get_prompt(
                "everything__resource-prompt", {"resourceType": "Text", "resourceId": "2"}
            )
            blocks = [m.content for m in embedded.messages if m.content.type == "resource"]
            assert blocks and str(blocks[0].resource.uri).startswith("everything+demo://")

            completion = await client.complete(
                PromptReference(type="ref/prompt", name="everything__completable-prompt"),
                {"name": "department", "value": "E"},
            )
            assert "Engineering" in completion.completion.values
            completion = await client.complete(
                ResourceTemplateReference(type="ref/resource", uri=template), {"name": "resourceId", "value": "1"}
            )
            assert completion.completion.values

            with pytest.raises(Exception, match="Unknown tool"):
                result = await client.call_tool("time__nope", {})
                if result.is_error:
                    raise RuntimeError(result.content[0].text)

    anyio.run(main)


def test_typescript_sdk_client(tmp_path, git_repo, everything_js):
    """The TypeScript SDK's client, the base of Claude Desktop, Cursor and VS Code."""
    import subprocess
    from pathlib import Path

    config = three_servers(tmp_path, git_repo, everything_js)
    script = Path(__file__).parent / "ts_client.mjs"
    out = subprocess.run(
        [
            "node",
            str(script),
            sys.executable,
            "-m",
            "aggregator",
            "serve",
            "--stdio",
            "--config",
            str(config),
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["server"]["name"] == "aggregator"
    assert seen["pages"] >= 4 and len(seen["tools"]) == len(set(seen["tools"]))
    assert {"everything__get-sum", "time__get_current_time", "git__git_status"} <= set(seen["tools"])
    assert "42" in seen["sum"] and json.loads(seen["time"])["timezone"] == "UTC"
    assert seen["firstResource"].startswith("everything+demo://") and seen["readUri"] == seen["firstResource"]
    assert seen["unknown"]["code"] == -32602 and "Unknown tool" in seen["unknown"]["message"]

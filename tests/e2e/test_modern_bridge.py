"""A modern (2026-07-28) client calling a legacy server that asks for input mid-call.

The official Python SDK 2.x client, pinned to 2026-07-28, with elicitation, sampling and
roots callbacks, through `aggregator serve --stdio` and `--http` (where each request, the
retries too, is a client of its own), in front of a server built with the
SDK 1.x (tests/e2e/sdk1_asking_server.py, over stdio and over Streamable HTTP, where its
requests come on the call's own POST stream) whose tool elicits, samples and lists roots
during one call. The proxy parks the call and answers `input_required` three times; the
SDK retries with each input, and the server gets every answer on its own request.
"""

from __future__ import annotations

import sys

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import http_proxy, write_config
from tests.loopback import mcp_over_http

pytestmark = pytest.mark.e2e

ASKING = f"{__file__.rsplit('/', 1)[0]}/sdk1_asking_server.py"


def config_for(tmp_path, python1, url=None):
    if url is None:
        body = f'''
[servers.ask]
command = "{python1}"
args = ["{ASKING}"]
'''
    else:
        body = f'''
[servers.ask]
url = "{url}"
'''
    return write_config(tmp_path, body, startup_timeout=20.0)


@pytest.fixture
def asking_http(python1):
    with mcp_over_http([str(python1), ASKING, "PORT"]) as url:
        yield url


async def on_elicit(context, params):
    assert params.message == "Your name?"
    return types.ElicitResult(action="accept", content={"name": "ada"})


async def on_sample(context, params):
    [message] = params.messages
    assert "tea" in message.content.text
    text = types.TextContent(type="text", text="sampled-words")
    return types.CreateMessageResult(role="assistant", content=text, model="test-model")


async def on_roots(context):
    return types.ListRootsResult(roots=[types.Root(uri="file:///work/here")])


def client_for(config, **callbacks):
    argv = ["-m", "aggregator", "serve", "--stdio", "--config", str(config)]
    server = StdioServerParameters(command=sys.executable, args=argv)
    return Client(server, mode="2026-07-28", cache=None, **callbacks)


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_a_legacy_servers_questions_reach_a_modern_client_as_input_required(tmp_path, python1, transport, request):
    url = request.getfixturevalue("asking_http") if transport == "streamable-http" else None
    config = config_for(tmp_path, python1, url)

    async def main():
        with anyio.fail_after(60):
            callbacks = {"elicitation_callback": on_elicit, "sampling_callback": on_sample}
            async with client_for(config, list_roots_callback=on_roots, **callbacks) as client:
                assert client.protocol_version == "2026-07-28"
                for topic in ("tea", "more tea"):  # a second call parks and resumes as well
                    result = await client.call_tool("ask__interview", {"topic": topic})
                    assert not result.is_error, result
                    assert result.content[0].text == "name=ada; sampled=sampled-words; roots=file:///work/here"

    anyio.run(main)


def test_a_call_that_needs_what_the_client_did_not_declare_fails_with_missing_capability(tmp_path, python1):
    config = config_for(tmp_path, python1)

    async def main():
        with anyio.fail_after(60):
            async with client_for(config, elicitation_callback=on_elicit) as client:
                # The name is asked; then the server needs sampling, which the client lacks.
                with pytest.raises(MCPError) as failed:
                    await client.call_tool("ask__interview", {"topic": "tea"})
                assert failed.value.code == -32021 and "sampling" in failed.value.message
                assert failed.value.data["requiredCapabilities"] == {"sampling": {}}
                # The call was cancelled upstream; the next one is served as usual.
                assert (await client.list_tools()).tools

    anyio.run(main)


def test_over_http_each_retry_is_a_request_of_its_own_and_resumes_the_call(tmp_path, python1):
    config = config_for(tmp_path, python1)
    with http_proxy(config) as (port, log):

        async def main():
            with anyio.fail_after(60):
                callbacks = {"elicitation_callback": on_elicit, "list_roots_callback": on_roots}
                url = f"http://127.0.0.1:{port}/mcp"
                async with Client(
                    url, mode="2026-07-28", cache=None, sampling_callback=on_sample, **callbacks
                ) as client:
                    assert client.protocol_version == "2026-07-28"
                    result = await client.call_tool("ask__interview", {"topic": "tea"})
                    assert not result.is_error, result
                    # The roots asked during the caller's own call are the caller's, shared server or not.
                    assert result.content[0].text == "name=ada; sampled=sampled-words; roots=file:///work/here"

        anyio.run(main)

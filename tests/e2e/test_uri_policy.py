"""URI policy end to end: the official SDK client, `aggregator serve --stdio`, and
@modelcontextprotocol/server-everything behind it with a deny on one of its resources
and one of its templates. Every spelling of a denied URI (case of the scheme, the
proxy's prefix and the host, percent-encoded unreserved characters, dot segments,
trailing space) is refused on read, subscribe and completion, and reaches no server;
the allowed ones still work in any spelling."""

from __future__ import annotations

import json
import sys

import anyio
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp import types as t

from tests.e2e.conftest import RawProxy, fake, write_config
from tests.fakesrv import FakeServer

INFO = {"name": "test", "version": "1"}

# The 2.x SDK warns that subscribe and logging are gone in the 2026 revision; they are the
# 2025 features under test here.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*2026-07-28")]

SECRET = "demo://resource/static/document/architecture.md"
DENIED = [
    f"everything+{SECRET}",
    "EVERYTHING+DEMO://resource/static/document/architecture.md",
    "Everything+Demo://resource/static/document/architecture.md",
    "everything+demo://RESOURCE/static/document/architecture.md",
    "everything+demo://resource/static/document/%61rchitecture%2emd",
    "everything+%64emo://resource/static/document/architecture.md",
    "everything+demo://resource/static/document/../document/architecture.md",
    "everything+demo://resource/static/document/./%2E%2E/document/architecture.md",
    f"everything+{SECRET} ",
    f" everything+{SECRET}",
    f"everything+{SECRET}\t",
    # an empty port or user info is no port or user info (the SDK's URL parser agrees)
    "everything+demo://resource:/static/document/architecture.md",
    "everything+demo://@resource/static/document/architecture.md",
    "everything+demo://:@RESOURCE:/static/document/architecture.md",
    # the hidden template, in any spelling
    "everything+demo://resource/dynamic/blob/1",
    "EVERYTHING+DEMO://resource/dynamic/blob/1",
    "everything+demo://resource/dynamic/%62lob/1",
    "everything+demo://resource/dynamic/text/../blob/1",
    "everything+demo://resource/dynamic/text/..%2Fblob%2F1",
    "everything+demo://resource:/dynamic/blob/1",
    "everything+demo://@resource/dynamic/blob/1",
]
DENIED_REFS = [
    "everything+demo://resource/dynamic/blob/{resourceId}",
    "EVERYTHING+DEMO://resource/dynamic/blob/{resourceId}",
    "everything+demo://resource/dynamic/%62lob/{resourceId}",
    "everything+demo://RESOURCE/dynamic/blob/{resourceId}",
    "everything+demo://resource/dynamic/blob/{resourceId} ",
]


def config_for(tmp_path, everything_js):
    return write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
[servers.everything.resources]
deny = ["DEMO://resource/static/document/architecture.md"]
[servers.everything.templates]
deny = ["demo://resource/dynamic/blob/*"]
''',
        startup_timeout=20.0,
    )


async def refused(call) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await call()
    error = caught.value
    # The proxy's own answer, not the server's.
    assert error.code == -32602 and error.message.startswith(("Unknown resource", "Invalid params")), error.message
    return error


def test_denied_spellings_are_refused_and_allowed_ones_work(tmp_path, everything_js):
    config = config_for(tmp_path, everything_js)
    logs: list[t.LoggingMessageNotificationParams] = []

    async def on_log(params):
        logs.append(params)

    async def main():
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "aggregator", "serve", "--stdio", "--config", str(config)]
        )
        with anyio.fail_after(90):
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, logging_callback=on_log) as session,
            ):
                await session.initialize()
                # server-everything logs every subscribe it receives: the witness that a
                # denied one never reached it.
                await session.set_logging_level("debug")
                listed = {str(r.uri) for r in (await session.list_resources()).resources}
                assert f"everything+{SECRET}" not in listed
                assert "everything+demo://resource/static/document/features.md" in listed
                templates = {r.uri_template for r in (await session.list_resource_templates()).resource_templates}
                assert "everything+demo://resource/dynamic/text/{resourceId}" in templates
                assert "everything+demo://resource/dynamic/blob/{resourceId}" not in templates

                for uri in DENIED:
                    await refused(lambda uri=uri: session.read_resource(uri))
                    await refused(lambda uri=uri: session.subscribe_resource(uri))
                for ref in DENIED_REFS:
                    await refused(
                        lambda ref=ref: session.complete(
                            t.ResourceTemplateReference(type="ref/resource", uri=ref),
                            {"name": "resourceId", "value": "1"},
                        )
                    )

                # Allowed URIs work in any spelling; the server gets one spelling.
                read = await session.read_resource("EVERYTHING+DEMO://resource/static/document/%66eatures.md")
                assert read.contents and read.contents[0].text
                read = await session.read_resource("Everything+demo://resource/dynamic/text/%31")
                assert "Resource 1" in read.contents[0].text
                read = await session.read_resource("everything+demo://resource/dynamic/blob/../text/2")
                assert "Resource 2" in read.contents[0].text
                completion = await session.complete(
                    t.ResourceTemplateReference(
                        type="ref/resource", uri="EVERYTHING+DEMO://resource/dynamic/text/{resourceId}"
                    ),
                    {"name": "resourceId", "value": "3"},
                )
                assert completion.completion.values == ["3"]
                await session.subscribe_resource("EVERYTHING+Demo://resource/dynamic/%74ext/7")
                with anyio.fail_after(15):
                    while not any("dynamic/text/7" in str(log.data) for log in logs):  # noqa: ASYNC110
                        await anyio.sleep(0.05)

        # Messages from one server arrive in order: the log of the allowed subscribe came
        # after any a denied one would have caused. It names the URI in normal form.
        said = [str(log.data) for log in logs]
        assert any("demo://resource/dynamic/text/7" in line for line in said), said
        assert not any("architecture" in line or "blob" in line for line in said), said

    anyio.run(main)


# Spellings of a denied scheme that a server which percent-decodes before parsing (as many
# do) reads as a URI of that scheme, and spellings without an authority.
SCHEME_SPELLINGS = [
    "S+secret:%2F%2Fx",
    "S+secret:/%2Fx",
    "S+secret:x",
    "S+secret:%2F%2Ft/1",
    "s+SECRET:%252F%252Fx",
    "s+secret%3A%2F%2Fx",
]


def test_a_scheme_wide_deny_holds_against_a_server_that_decodes(tmp_path):
    record = tmp_path / "received.jsonl"
    config = write_config(
        tmp_path,
        fake("S", "decodes_uris", f"record:{record}") + '[servers.S.resources]\ndeny = ["secret://*"]\n',
    )
    # The server really does serve the secret for these spellings when asked directly.
    server = FakeServer(["decodes_uris"])
    for uri in SCHEME_SPELLINGS:
        own = uri.partition("+")[2]
        [line] = server.handle(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": own}}).encode()
        )
        assert json.loads(line)["result"]["contents"][0]["text"] == "THE SECRET", own

    proxy = RawProxy(config)
    try:
        proxy.request(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": INFO})
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        listed = proxy.request(1, "resources/list")["result"]["resources"]
        assert [r["uri"] for r in listed] == ["S+fake://doc/1"]
        next_id = 2
        for uri in SCHEME_SPELLINGS:
            for method, params in (
                ("resources/read", {"uri": uri}),
                ("resources/subscribe", {"uri": uri}),
                (
                    "completion/complete",
                    {"ref": {"type": "ref/resource", "uri": uri}, "argument": {"name": "id", "value": ""}},
                ),
            ):
                answer = proxy.request(next_id, method, params)
                next_id += 1
                assert answer["error"]["code"] == -32602, (method, uri, answer)
                assert "THE SECRET" not in json.dumps(answer)
        # An allowed read still reaches the server, after every refused one.
        assert proxy.request(next_id, "resources/read", {"uri": "S+fake://doc/1"})["result"]["contents"]
    finally:
        code, log = proxy.close()
    assert code == 0, log
    received = [json.loads(line) for line in record.read_text().splitlines()]
    uris = [str(m.get("params", {}).get("uri") or m.get("params", {}).get("ref", {}).get("uri")) for m in received]
    assert not any("secret" in uri.lower() for uri in uris), uris
    assert "fake://doc/1" in uris

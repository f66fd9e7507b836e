"""The errors of the proxy's own requests to a server carry the server's JSON-RPC code."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from aggregator.errors import UpstreamError
from tests.fakesrv import FakeServer
from tests.session.harness import running_proxy


def templates_answer(monkeypatch, error: dict[str, Any]) -> None:
    """Make every fake server answer resources/templates/list with ``error``."""
    answer = FakeServer._answer

    def patched(self: FakeServer, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("method") == "resources/templates/list":
            return {"jsonrpc": "2.0", "id": message.get("id"), "error": error}
        return answer(self, message)

    monkeypatch.setattr(FakeServer, "_answer", patched)


async def test_an_error_answer_carries_its_code_and_message():
    async with running_proxy({"a": []}) as proxy:
        with trio.fail_after(5):
            await proxy.hub.startup_done.wait()
            with pytest.raises(UpstreamError) as caught:
                await proxy.hub.upstreams["a"].request("tools/call", {"name": "fail"})
    assert (caught.value.code, caught.value.message) == (-32042, "upstream says no")
    assert str(caught.value) == "tools/call failed: upstream says no (code -32042)"


async def test_a_server_without_templates_lists_its_other_resources(monkeypatch):
    templates_answer(monkeypatch, {"code": -32601, "message": "Method not found"})
    async with running_proxy({"a": []}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(5):
            await client.initialize()
            assert (await client.request("resources/templates/list"))["result"]["resourceTemplates"] == []
            resources = (await client.request("resources/list"))["result"]["resources"]
        assert [r["name"] for r in resources] == ["doc1"]
        assert proxy.hub.upstreams["a"].state == "ready"


@pytest.mark.parametrize("code", [-32603, -326010])
async def test_only_the_method_not_found_code_means_no_templates(monkeypatch, code):
    """A failure that merely mentions -32601 (in its message, in a longer code) is a failed
    listing, reported, not a server without templates."""
    templates_answer(monkeypatch, {"code": code, "message": "the handler for -32601 broke"})
    async with running_proxy({"a": []}) as proxy:
        upstream = proxy.hub.upstreams["a"]
        with trio.fail_after(5):
            while upstream.last_error is None:  # noqa: ASYNC110 - polling the proxy's own state in a test
                await trio.sleep(0.01)
        assert "resources/templates/list failed: the handler for -32601 broke" in upstream.last_error
        assert upstream.state != "ready"


async def test_an_unanswered_own_request_fails_at_the_request_timeout(autojump_clock):
    """The pump enforces the lifecycle's deadline for a request made while it waits for
    nothing else; the unanswered request is then forgotten."""
    async with running_proxy({"a": []}, {"request_timeout": 2.0}) as proxy:
        with trio.fail_after(30):
            await proxy.hub.startup_done.wait()
            upstream = proxy.hub.upstreams["a"]
            start = trio.current_time()
            with pytest.raises(UpstreamError) as caught:
                await upstream.request("tools/call", {"name": "hang"})
            assert 2.0 <= trio.current_time() - start < 2.2
    assert str(caught.value) == "tools/call: no answer in time" and caught.value.code is None

"""The hub's metrics inside a running proxy (memory streams, fake servers, virtual clock):
sessions, policy refusals and plugin decisions, read back through the exposition parser."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

from aggregator.plugins.api import Deny
from tests.session.harness import running_proxy
from tests.session.scrape import only, samples


class Decider:
    """Denies ``a__fail``, answers ``a__links`` itself, lets the rest through; refuses
    every sampling request."""

    name = "decider"

    def request(self, request):
        if request.exposed == "a__fail":
            raise Deny("not today")
        if request.exposed == "a__links":
            request.answer = {"content": []}

    def server_request(self, request):
        return False


async def test_sessions_by_transport_and_profile(autojump_clock):
    async with running_proxy({"a": []}) as proxy:
        assert only(samples(proxy.hub), "aggregator_sessions") == {}
        with trio.fail_after(10):
            first, second = await proxy.connect(), await proxy.connect()
            await first.initialize()
            await second.initialize()
            assert only(samples(proxy.hub), "aggregator_sessions") == {
                (("profile", "default"), ("transport", "stdio")): 2
            }
            await first.stream.aclose()
            for _ in range(100):  # the proxy notices the end of its input
                if len(proxy.hub.clients) == 1:
                    break
                await trio.sleep(0.01)
            assert only(samples(proxy.hub), "aggregator_sessions") == {
                (("profile", "default"), ("transport", "stdio")): 1
            }


async def test_policy_refusals_are_counted(autojump_clock):
    async with running_proxy({"a": ["odd_json"]}, server_settings={"server_requests": []}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize({"sampling": {}})
            answer = await client.request("tools/call", {"name": "a__sample", "arguments": {}})
        told = json.loads(answer["result"]["content"][0]["text"])
        assert told["error"]["data"]["reason"] == "denied"
        assert only(samples(proxy.hub), "aggregator_policy_denials_total") == {
            (("method", "sampling/createMessage"), ("server", "a")): 1
        }
        assert only(samples(proxy.hub), "aggregator_plugin_decisions_total") == {}


async def test_plugin_decisions_are_counted(autojump_clock):
    plugins = [{"use": "tests.session.test_metrics_session:Decider"}]
    async with running_proxy({"a": ["odd_json"]}, plugins=plugins) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize({"sampling": {}})
            assert "error" in await client.request("tools/call", {"name": "a__fail"})
            assert "result" in await client.request("tools/call", {"name": "a__links"})
            for n in range(2):
                assert "result" in await client.request("tools/call", {"name": "a__echo", "arguments": {"n": n}})
            await client.request("tools/call", {"name": "a__sample", "arguments": {}})
        found = samples(proxy.hub)
        assert only(found, "aggregator_plugin_decisions_total") == {
            (("decision", "denied"), ("hook", "request")): 1,
            (("decision", "answered"), ("hook", "request")): 1,
            (("decision", "allowed"), ("hook", "request")): 3,  # two echoes and the sample call
            (("decision", "denied"), ("hook", "server_request")): 1,
        }
        # What plugins decided never reached the server; what they let through did.
        requests = only(found, "aggregator_requests_total")
        assert requests == {
            (("method", "tools/call"), ("outcome", "ok"), ("reason", ""), ("server", "a")): 3,
        }
        assert only(found, "aggregator_policy_denials_total") == {}  # the policy allows sampling


async def test_tools_list_tokens_per_profile_and_in_the_status(autojump_clock):
    from aggregator.core.catalogs.discovery import SEARCH_LIST_TOKENS
    from aggregator.ops.status import snapshot

    async with running_proxy({"a": []}, discovery={"mode": "search"}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize()
        tokens = only(samples(proxy.hub), "aggregator_tools_list_tokens")
        everything = tokens[(("listing", "all"), ("profile", "default"))]
        assert everything > 0 and everything != SEARCH_LIST_TOKENS
        assert tokens[(("listing", "current"), ("profile", "default"))] == SEARCH_LIST_TOKENS
        shown = snapshot(proxy.hub)["catalog"]["default"]["discovery"]
        assert (shown["mode"], shown["lists"], shown["tools_list_tokens"]) == ("search", "search", everything)


def test_prometheus_client_is_imported_only_when_scraped():
    """A proxy nobody scrapes (a desktop client's stdio proxy) pays nothing for the library."""
    script = (
        "import sys\n"
        "from aggregator.config import structure_config\n"
        "from aggregator.hub.hub import Hub\n"
        "import aggregator.cli.main\n"
        "hub = Hub(structure_config({'servers': {}}, environ={}))\n"
        "print('prometheus_client' in sys.modules)\n"
        "hub.metrics.exposition()\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]

"""``Hub.reload`` inside a running proxy (memory streams, fake servers, virtual clock): the
file is read again and only what changed is applied while a client stays connected."""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from aggregator.config import load_config
from aggregator.hub.hub import Hub
from aggregator.hub.reload import watch_config
from aggregator.plugins import api as plugins
from tests.session.harness import Client, FakeUpstreams, Proxy
from tests.session.scrape import only, samples


def write(path: Path, servers: dict[str, str], extra: str = "") -> None:
    """A config of fake servers (each with its own extra TOML lines) and more tables."""
    text = "[proxy]\nstartup_timeout = 5.0\nlist_changed_debounce = 0\n"
    for name, lines in servers.items():
        text += f'\n[servers.{name}]\ncommand = "fake"\ninit_timeout = 2.0\n{lines}\n'
    path.write_text(text + extra)


@asynccontextmanager
async def proxy_of(path: Path, modes: dict[str, list[str]]) -> Any:
    upstreams = FakeUpstreams(modes)
    hub = Hub(load_config(path), connector=upstreams)
    hub.config_path = path
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        yield Proxy(hub, upstreams, nursery)
        nursery.cancel_scope.cancel()


async def names(client: Client) -> list[str]:
    return sorted(tool["name"] for tool in await client.list_all("tools/list", "tools"))


async def changed_lists(client: Client) -> list[str]:
    """The list_changed notifications that came since the last look (a ping flushes them in)."""
    await client.request("ping")
    seen = [n["method"] for n in client.notifications]
    client.notifications.clear()
    return seen


async def test_servers_added_removed_and_ruled_while_the_client_stays(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": "", "b": ""})
    async with proxy_of(path, {"a": [], "b": [], "c": ["many:2"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            assert {"a__add", "a__echo", "b__echo"} <= set(await names(client))
            write(path, {"a": '[servers.a.tools]\ndeny = ["add"]', "c": ""})
            result = await proxy.hub.reload()
            assert result.ok and result.errors == []
            assert result.changes == ["servers.c: added", "servers.b: removed", "policy: changed; catalogs rebuilt"]
            assert "notifications/tools/list_changed" in await changed_lists(client)
            await proxy.hub.startup_done.wait()
            for _ in range(100):  # c lists a moment after it starts
                if "c__t0" in await names(client):
                    break
                await trio.sleep(0.1)
            tools = await names(client)
            assert "c__t1" in tools and "a__echo" in tools
            assert "a__add" not in tools and not any(name.startswith("b__") for name in tools)
            assert "notifications/tools/list_changed" in await changed_lists(client)
            assert len(proxy.upstreams.servers["a"]) == 1  # a was never restarted
            assert set(proxy.hub.upstreams) == {"a", "c"}
            answer = await client.request("tools/call", {"name": "c__t0", "arguments": {}})
            assert "result" in answer
            answer = await client.request("tools/call", {"name": "a__add", "arguments": {"a": 1, "b": 2}})
            assert answer["error"]["code"] == -32602  # hidden now: as absent as a name never listed


async def test_a_bad_file_is_rejected_and_the_running_config_stays(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            before = proxy.hub.config
            write(path, {"a": "comand = 1", "b": "request_timeout = -1"})
            result = await proxy.hub.reload()
            assert not result.ok and result.changes == []
            assert any(e.startswith("servers.a.comand") for e in result.errors)
            assert any(e.startswith("servers.b.request_timeout") for e in result.errors)
            assert proxy.hub.config is before
            assert "a__echo" in await names(client)
            path.write_text("not toml [")
            result = await proxy.hub.reload()
            assert not result.ok and "not valid TOML" in result.errors[0]
            answer = await client.request("tools/call", {"name": "a__echo", "arguments": {"x": 1}})
            assert "result" in answer


async def test_what_needs_a_restart_is_reported_and_ignored(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        with trio.fail_after(30):
            await proxy.hub.startup_done.wait()
            path.write_text(path.read_text().replace("[proxy]\n", "[proxy]\npage_size = 7\n"))
            result = await proxy.hub.reload()
            assert result.ok and result.changes == ["proxy: changed; takes a restart (ignored until then)"]
            assert proxy.hub.config.proxy.page_size == 100
            assert len(proxy.upstreams.servers["a"]) == 1


async def test_a_removed_servers_calls_in_flight_are_answered(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": "", "h": ""})
    async with proxy_of(path, {"a": [], "h": ["hang_call"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            await client.send({"id": "hung", "method": "tools/call", "params": {"name": "h__hang", "arguments": {}}})
            await client.request("ping")
            write(path, {"a": ""})
            result = await proxy.hub.reload()
            assert result.changes == ["servers.h: removed"]
            answer = await client.response("hung")
            assert answer["error"]["data"]["reason"] == "unavailable"
            assert "removed from the configuration" in answer["error"]["message"]
            assert "h" not in proxy.hub.upstreams


class HideEcho:
    """A plugin that hides every ``echo`` and refuses calls to ``add``."""

    name = "hide-echo"
    events: list[str] = []

    def load(self) -> None:
        HideEcho.events.append("load")

    def done(self) -> None:
        HideEcho.events.append("done")

    def catalog(self, profile: str, kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [item for item in items if not str(item.get("name", "")).endswith("echo")]

    def request(self, request: Any) -> None:
        from aggregator.plugins.api import Deny

        if request.exposed == "a__add":
            raise Deny("no adding")


async def test_plugins_are_replaced_live(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    plugin = '\n[[plugins]]\nuse = "tests.session.test_reload_session:HideEcho"\n'
    write(path, {"a": ""})
    HideEcho.events.clear()
    async with proxy_of(path, {"a": []}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            assert "a__echo" in await names(client)
            write(path, {"a": ""}, plugin)
            result = await proxy.hub.reload()
            assert result.changes == ["plugins: changed; reloaded"]
            assert HideEcho.events == ["load"]
            assert "notifications/tools/list_changed" in await changed_lists(client)
            assert "a__echo" not in await names(client)
            answer = await client.request("tools/call", {"name": "a__add", "arguments": {"a": 1, "b": 2}})
            assert answer["error"]["message"] == "no adding"
            # A plugin that cannot be built refuses the whole reload.
            write(path, {"a": "", "b": ""}, '\n[[plugins]]\nuse = "tests.session.nowhere:Nothing"\n')
            result = await proxy.hub.reload()
            assert not result.ok and result.errors[0].startswith("plugins[0].use: cannot load")
            assert set(proxy.hub.upstreams) == {"a"}
            write(path, {"a": ""})
            result = await proxy.hub.reload()
            assert result.ok and HideEcho.events == ["load", "done"]
            assert proxy.hub.gate.decisions[("request", "denied")] == 1  # counted before still counts
            assert "a__echo" in await names(client)
            answer = await client.request("tools/call", {"name": "a__add", "arguments": {"a": 1, "b": 2}})
            assert "result" in answer
            assert len(proxy.upstreams.servers["a"]) == 1


async def test_a_changed_server_restarts_and_a_call_meanwhile_waits_for_it(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": "", "h": ""})
    async with proxy_of(path, {"a": ["slow_stop"], "h": ["hang_call"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            await client.send({"id": "hung", "method": "tools/call", "params": {"name": "h__hang", "arguments": {}}})
            await client.request("ping")
            write(path, {"a": "request_timeout = 30.0", "h": ""})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(proxy.hub.reload)
                await trio.sleep(0.5)  # a's old connection takes 2 s to stop
                # A call to a while it restarts waits for the new connection.
                answer = await client.request("tools/call", {"name": "a__echo", "arguments": {"x": 1}})
            assert "result" in answer, answer
            assert len(proxy.upstreams.servers["a"]) == 2  # started again
            assert len(proxy.upstreams.servers["h"]) == 1  # unchanged: untouched
            assert proxy.hub.upstreams["a"].config.request_timeout == 30.0
            assert proxy.hub.router.links["a"].request_timeout == 30.0
            answer = await client.request("tools/call", {"name": "h__echo", "arguments": {}})
            assert "result" in answer
            # The unchanged server's call in flight goes on.
            assert "hung" not in [m.get("id") for m in client.inbox]


async def test_a_hub_without_a_config_file_has_nothing_to_reload(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        proxy.hub.config_path = None
        result = await proxy.hub.reload()
        assert not result.ok and result.errors == ["this proxy was not started from a config file; nothing to reload"]


async def test_a_reload_that_leaves_fewer_servers_than_min_ready_is_rejected(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": "", "b": ""})
    path.write_text(path.read_text().replace("[proxy]\n", "[proxy]\nmin_ready = 2\n", 1))
    async with proxy_of(path, {"a": [], "b": []}) as proxy:
        with trio.fail_after(30):
            before = proxy.hub.config
            write(path, {"a": ""})
            path.write_text(path.read_text().replace("[proxy]\n", "[proxy]\nmin_ready = 2\n", 1))
            result = await proxy.hub.reload()
            assert not result.ok and result.changes == []
            assert [e for e in result.errors if e.startswith("proxy.min_ready: 2 servers must be ready")], result
            assert proxy.hub.config is before and set(proxy.hub.upstreams) == {"a", "b"}


async def test_a_reload_is_checked_against_the_running_min_ready(autojump_clock, tmp_path):
    # The file lowers min_ready and disables b: [proxy] waits for a restart, so the running
    # min_ready of 2 would be in force with one server, and /readyz would never say ready.
    path = tmp_path / "aggregator.toml"
    write(path, {"a": "", "b": ""})
    path.write_text(path.read_text().replace("[proxy]\n", "[proxy]\nmin_ready = 2\n", 1))
    async with proxy_of(path, {"a": [], "b": []}) as proxy:
        with trio.fail_after(30):
            before = proxy.hub.config
            write(path, {"a": "", "b": "enabled = false"})
            path.write_text(path.read_text().replace("[proxy]\n", "[proxy]\nmin_ready = 1\n", 1))
            result = await proxy.hub.reload()
            assert not result.ok and result.changes == []
            assert result.errors == [
                "proxy.min_ready: 2 servers must be ready (the running value: [proxy] changes take a restart),"
                " but 1 enabled server is configured; /readyz would never say ready"
            ]
            assert proxy.hub.config is before and set(proxy.hub.upstreams) == {"a", "b"}


async def test_each_problem_of_a_refused_reload_is_a_record_of_its_own(autojump_clock, tmp_path, caplog):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        with trio.fail_after(30):
            caplog.clear()
            write(path, {"a": "comand = 1", "b": "request_timeout = -1"})
            assert not (await proxy.hub.reload()).ok
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.reload"]
    assert lines[0] == f"reload: {path} is rejected; the running config stays:"
    assert len(lines) == 3 and all("\n" not in line for line in lines), lines
    assert lines[1].startswith("reload:   servers.a.comand") and lines[2].startswith("reload:   servers.b.request")


async def test_the_watcher_applies_a_file_once_it_is_written_and_never_one_without_servers(
    autojump_clock, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="aggregator.reload")
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": [], "b": []}) as proxy:
        with trio.fail_after(60):
            await proxy.hub.startup_done.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_config, proxy.hub.reload, path, 1.0)
                await trio.sleep(0.5)
                caplog.clear()
                path.write_text("")  # truncated: a file being written
                await trio.sleep(1.0)  # one look saw it
                write(path, {"a": "", "b": ""})  # written in full after that look
                await trio.sleep(5.0)
                assert set(proxy.hub.upstreams) == {"a", "b"}
                assert len(proxy.upstreams.servers["a"]) == 1  # a was never removed
                path.write_text("")  # emptied, and left so
                await trio.sleep(5.0)
                assert set(proxy.hub.upstreams) == {"a", "b"}
                nursery.cancel_scope.cancel()
    reloads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the config file")]
    assert len(reloads) == 2, reloads
    refused = [r.getMessage() for r in caplog.records if "has no servers" in r.getMessage()]
    assert refused == [f"reload: {path} has no servers; not applied by --watch (reload it by hand to mean it)"]


class Tagged:
    """A plugin that records, under its tag, each answer it sees and when it is done."""

    name = "tagged"
    seen: list[tuple[str, str]] = []

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def response(self, response: Any) -> None:
        Tagged.seen.append((self.tag, response.request.exposed))

    def done(self) -> None:
        Tagged.seen.append((self.tag, "done"))


async def test_requests_in_flight_finish_with_the_plugins_they_started_under(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    tagged = '\n[[plugins]]\nuse = "tests.session.test_reload_session:Tagged"\noptions = {{ tag = "{}" }}\n'
    write(path, {"h": "request_timeout = 3.0"}, tagged.format("one"))
    Tagged.seen.clear()
    async with proxy_of(path, {"h": ["hang_call"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            await client.send({"id": "slow", "method": "tools/call", "params": {"name": "h__hang", "arguments": {}}})
            await client.request("ping")
            write(path, {"h": "request_timeout = 3.0"}, tagged.format("two"))
            assert (await proxy.hub.reload()).changes == ["plugins: changed; reloaded"]
            assert Tagged.seen == []  # the old plugins wait for the call they watch
            answer = await client.request("tools/call", {"name": "h__echo", "arguments": {}})
            assert "result" in answer
            assert (await client.response("slow"))["error"]["data"]["reason"] == "timeout"
            await trio.sleep(1)
            assert Tagged.seen == [("two", "h__echo"), ("one", "h__hang"), ("one", "done")]
            assert proxy.hub.gate.watched == {} and proxy.hub.gate.retired == {}
            # Replaced while a call they watch is in flight, and the proxy stops: they are done too.
            await client.send({"id": "last", "method": "tools/call", "params": {"name": "h__hang", "arguments": {}}})
            await client.request("ping")
            write(path, {"h": "request_timeout = 3.0"}, tagged.format("three"))
            assert (await proxy.hub.reload()).ok
    assert Tagged.seen[-2:] == [("two", "done"), ("three", "done")], Tagged.seen


async def test_a_changed_servers_counters_go_on_after_its_restart(autojump_clock, tmp_path):
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": ["crash_on_call"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(60):
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__crash", "arguments": {}})
            assert "error" in answer
            for _ in range(100):  # it is started again a moment later
                if proxy.hub.upstreams["a"].state == "ready":
                    break
                await trio.sleep(0.1)
            assert "result" in await client.request("tools/call", {"name": "a__echo", "arguments": {"x": 1}})
            before = samples(proxy.hub)
            restarts = only(before, "aggregator_server_restarts_total")[(("server", "a"),)]
            received = only(before, "aggregator_server_received_bytes_total")[(("server", "a"),)]
            assert restarts == 1 and received > 0
            write(path, {"a": "request_timeout = 30.0"})
            assert (await proxy.hub.reload()).changes == ["servers.a: changed; restarted"]
            assert "result" in await client.request("tools/call", {"name": "a__echo", "arguments": {"x": 1}})
            after = samples(proxy.hub)
            assert only(after, "aggregator_server_restarts_total")[(("server", "a"),)] == restarts
            assert only(after, "aggregator_server_received_bytes_total")[(("server", "a"),)] > received


class SlowLoads:
    """A plugin whose plain load blocks (as a sync network call would); ``AsyncSlowLoads``
    waits as long in a coroutine, which holds up nothing else."""

    name = "slow-loads"

    def load(self) -> None:
        time.sleep(0.2)  # the blocking this test is about: the event loop cannot run meanwhile


class AsyncSlowLoads:
    name = "async-slow-loads"

    async def load(self) -> None:
        await trio.sleep(10)
        raise RuntimeError("loaded late and failed")


async def test_a_plain_load_hook_that_blocks_a_reload_is_named_in_a_warning(
    autojump_clock, tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(plugins, "SLOW_PLAIN_HOOK", 0.1)
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        with trio.fail_after(30):
            caplog.clear()
            for use in ("SlowLoads", "AsyncSlowLoads"):
                write(path, {"a": ""}, f'\n[[plugins]]\nuse = "tests.session.test_reload_session:{use}"\n')
                assert (await proxy.hub.reload()).ok
    slow = [r.getMessage() for r in caplog.records if "held up the proxy" in r.getMessage()]
    assert len(slow) == 1 and slow[0].startswith("plugin slow-loads: its plain load hook held up the proxy for"), slow
    assert any("plugin async-slow-loads: load hook failed" in r.getMessage() for r in caplog.records)


async def test_discovery_settings_change_live(autojump_clock, tmp_path):
    """[proxy.discovery] applies on reload (the rest of [proxy] needs a restart): the client
    is told its tool list changed, and lists the two search tools from then on."""
    path = tmp_path / "aggregator.toml"
    write(path, {"a": ""})
    async with proxy_of(path, {"a": []}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            assert "a__echo" in await names(client)
            write(path, {"a": ""}, '\n[proxy.discovery]\nmode = "search"\n')
            result = await proxy.hub.reload()
            assert result.ok and not any("restart" in line for line in result.changes), result.changes
            assert "notifications/tools/list_changed" in await changed_lists(client)
            assert await names(client) == ["call_tool", "find_tools"]
            found = await client.request("tools/call", {"name": "find_tools", "arguments": {"query": "echo"}})
            assert [t["name"] for t in found["result"]["structuredContent"]["tools"]][0] == "a__echo"

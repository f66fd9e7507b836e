"""Servers started on demand and stopped when idle, through the router with a clock the
test moves: a lazy server's cached catalog is served at once, the first request for it
wakes it and waits, a stale cache is replaced and announced, an idle server is stopped
and woken again (``core.catalogs.outages`` rule 6, ``core.upstreams.idle_stops``)."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import StopIdle, WakeUpstream
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerCached,
    ServerDown,
    ServerItems,
    ServerListed,
    ServerLost,
    ServerMessage,
    ServerReady,
    ServerRemoved,
    ServerReplaced,
    ServerRestarting,
    StartupCompleted,
    TimePassed,
)
from aggregator.core.router import Router, RouterSettings
from aggregator.core.settings import Discovery, LinkSettings
from tests.core.helpers import Clock, msg, unpack

IDLE = 60.0
TIMEOUT = IDLE * 5  # a lazy server's requests (longer than its idle time, so that one in flight outlasts it)
READY = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "resources": {"subscribe": True}}}
CACHED = {"tools": [{"name": "t"}], "resources": [{"uri": "demo://r"}]}


def start(router: Router, server: str, tools: list[dict[str, Any]], resources: Any = ()) -> list[Any]:
    """What the supervisor reports when a server comes up: ready, listed."""
    out = router.handle(ServerReady(server, READY))
    out += router.handle(ServerItems(server, "tools", tools))
    out += router.handle(ServerItems(server, "resources", list(resources)))
    return out + router.handle(ServerListed(server))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def router(clock: Clock) -> Router:
    """``lazy`` (not started, its cached catalog served; idle after 60 s) and ``eager``
    (running, never stopped), client 1 connected."""
    configs = [ServerConfig(name="lazy", command="x"), ServerConfig(name="eager", command="x")]
    settings = RouterSettings(
        servers=(
            LinkSettings("lazy", request_timeout=TIMEOUT, max_request_timeout=TIMEOUT, idle_stop_after=IDLE),
            LinkSettings("eager"),
        ),
        list_changed_debounce=0.0,
    )
    r = Router(Catalog(configs, "__", 50), settings, clock=clock)
    assert r.handle(ServerCached("lazy", CACHED)) == []  # nobody to tell yet
    start(r, "eager", [{"name": "e"}])
    r.handle(StartupCompleted())
    r.handle(ClientConnected(1))
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    r.handle(ClientMessage(1, msg(id=0, method="initialize", params=init)))
    r.handle(ClientMessage(1, msg(method="notifications/initialized")))
    return r


def ask(router: Router, id: Any, method: str, **params: Any) -> list[tuple[str, Any, Any]]:
    return unpack(router.handle(ClientMessage(1, msg(id=id, method=method, params=params))))


def tool_names(router: Router) -> list[str]:
    [(_, _, answer)] = ask(router, "list", "tools/list")
    return sorted(tool["name"] for tool in answer["result"]["tools"])


def answer_upstream(router: Router, server: str, sent: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return unpack(router.handle(ServerMessage(server, msg(id=sent["id"], result={"content": []}))))


def test_a_lazy_servers_cached_catalog_is_listed_before_it_starts(router: Router) -> None:
    assert tool_names(router) == ["eager__e", "lazy__t"]
    assert "lazy" in router.outages and not router.links["lazy"].ready


@pytest.mark.parametrize(
    ("method", "params", "sent_upstream"),
    [
        ("tools/call", {"name": "lazy__t"}, 2),
        ("resources/read", {"uri": "lazy+demo://r"}, 2),
        ("resources/subscribe", {"uri": "lazy+demo://r"}, 1),  # the second: subscribed already
    ],
)
def test_the_first_request_wakes_it_and_waits_then_goes(
    router: Router, method: str, params: Any, sent_upstream: int
) -> None:
    assert router.handle(ClientMessage(1, msg(id=1, method=method, params=params))) == [WakeUpstream("lazy")]
    assert router.handle(ClientMessage(1, msg(id=2, method=method, params=params))) == []  # woken once
    out = unpack(start(router, "lazy", [{"name": "t"}], [{"uri": "demo://r"}]))
    sent = [message for kind, server, message in out if kind == "ToServer" and message.get("method") == method]
    assert len(sent) == sent_upstream  # in order, as their client sent them
    assert not any(kind == "ToClient" and "list_changed" in str(m) for kind, _, m in out)  # the cache was right


def test_a_caller_with_a_progress_token_hears_that_the_server_starts(router: Router) -> None:
    out = ask(router, 7, "tools/call", name="lazy__t", _meta={"progressToken": "p"})
    assert out[0] == ("WakeUpstream", "lazy", ())
    [(kind, key, note)] = out[1:]
    assert (kind, key, note["method"]) == ("ToClient", 1, "notifications/progress")
    assert note["params"] == {"progressToken": "p", "progress": 0, "message": "starting server 'lazy'"}
    assert router.handle(ClientMessage(1, msg(id=8, method="tools/call", params={"name": "lazy__t"}))) == []


def test_a_stale_cache_is_replaced_and_announced(router: Router) -> None:
    assert ask(router, 1, "tools/call", name="lazy__t")[0][0] == "WakeUpstream"
    out = unpack(start(router, "lazy", [{"name": "t2"}]))
    notices = [m["method"] for kind, key, m in out if kind == "ToClient" and "method" in m]
    assert "notifications/tools/list_changed" in notices
    [answer] = [m for kind, key, m in out if kind == "ToClient" and m.get("id") == 1]
    assert answer["error"]["code"] == -32602  # the tool is gone: the held call is looked up anew
    assert tool_names(router) == ["eager__e", "lazy__t2"]


def test_a_server_that_does_not_start_in_time_fails_its_held_request(router: Router, clock: Clock) -> None:
    ask(router, 1, "tools/call", name="lazy__t")
    clock.now += TIMEOUT + 0.1
    [(kind, key, answer)] = unpack(router.handle(TimePassed()))
    assert (kind, key, answer["id"]) == ("ToClient", 1, 1)
    assert answer["error"]["data"]["reason"] == "unavailable"


def test_a_woken_server_that_fails_is_lazy_again_with_its_catalog_and_no_start_storm(
    router: Router, clock: Clock
) -> None:
    ask(router, 1, "tools/call", name="lazy__t")
    assert unpack(router.handle(ServerLost("lazy", "cannot start 'x'"))) == []  # its catalog stays: nothing told
    out = unpack(router.handle(ServerDown("lazy", "cannot start 'x'", 2.0)))
    [answer] = [m for kind, _, m in out if kind == "ToClient" and m.get("id") == 1]
    error = answer["error"]
    assert error["message"] == (
        "Server 'lazy' could not be started (cannot start 'x'); it stays lazy, and a request in 2.0 s or later"
        " starts it again"
    )
    assert error["data"] == {
        "source": "aggregator",
        "reason": "unavailable",
        "server": "lazy",
        "state": "lazy",
        "retryAfter": 2.0,
        "lastError": "cannot start 'x'",
    }
    assert tool_names(router) == ["eager__e", "lazy__t"]  # still listed, from its cache
    # Within the 2 s: answered at once, no new start.
    clock.now += 1.5
    [(kind, _, again)] = ask(router, 2, "tools/call", name="lazy__t")
    assert kind == "ToClient" and again["error"]["data"]["retryAfter"] == 0.5
    # After them: the next request starts it again, and this time it comes up.
    clock.now += 0.5
    assert ask(router, 3, "tools/call", name="lazy__t") == [("WakeUpstream", "lazy", ())]
    out = unpack(start(router, "lazy", [{"name": "t"}], [{"uri": "demo://r"}]))
    assert [m["params"]["name"] for kind, _, m in out if kind == "ToServer" and m.get("method") == "tools/call"] == [
        "t"
    ]


def test_an_idle_stopped_server_whose_restart_fails_is_idle_stopped_again(router: Router, clock: Clock) -> None:
    started(router, clock)
    clock.now += IDLE
    assert router.handle(TimePassed()) == [StopIdle("lazy")]
    router.handle(ServerLost("lazy", "stopped"))
    assert ask(router, 3, "tools/call", name="lazy__t") == [("WakeUpstream", "lazy", ())]
    router.handle(ServerLost("lazy", "the server exited with status 1"))
    out = unpack(router.handle(ServerDown("lazy", "the server exited with status 1", 1.0)))
    [answer] = [m for kind, _, m in out if kind == "ToClient" and m.get("id") == 3]
    assert answer["error"]["data"]["state"] == "idle-stopped"
    assert tool_names(router) == ["eager__e", "lazy__t"]
    clock.now += 1.0
    assert ask(router, 4, "tools/call", name="lazy__t") == [("WakeUpstream", "lazy", ())]


def started(router: Router, clock: Clock) -> None:
    """Wake ``lazy`` with a call, start it, answer the call."""
    ask(router, 1, "tools/call", name="lazy__t")
    out = unpack(start(router, "lazy", [{"name": "t"}], [{"uri": "demo://r"}]))
    [sent] = [m for kind, _, m in out if kind == "ToServer" and m.get("method") == "tools/call"]
    answer_upstream(router, "lazy", sent)


# What keeps a started server from being idle, and when it is stopped: (what happens after
# it answered its call, seconds later, whether it is stopped then).
IDLE_CASES = [
    ("nothing", IDLE - 1, False),
    ("nothing", IDLE, True),
    ("a call in flight", IDLE * 3, False),
    ("a subscription", IDLE * 3, False),
    ("a call that ended late", IDLE + 10, False),  # its end restarts the idle time
]


@pytest.mark.parametrize(("use", "later", "stopped"), IDLE_CASES)
def test_a_server_nobody_uses_is_stopped_after_its_idle_time(
    router: Router, clock: Clock, use: str, later: float, stopped: bool
) -> None:
    started(router, clock)
    target = clock.now + later
    if use == "a call in flight":
        ask(router, 2, "tools/call", name="lazy__t")
    elif use == "a subscription":
        [(_, _, sent)] = ask(router, 2, "resources/subscribe", uri="lazy+demo://r")
        router.handle(ServerMessage("lazy", msg(id=sent["id"], result={})))
    elif use == "a call that ended late":
        [(_, _, sent)] = ask(router, 2, "tools/call", name="lazy__t")
        clock.now += 50
        answer_upstream(router, "lazy", sent)
    commands: list[Any] = []
    while clock.now < target:  # the clock looks every 10 s, as the trio layer's timer would at least
        clock.now = min(target, clock.now + 10)
        commands += router.handle(TimePassed())
    assert (StopIdle("lazy") in commands) is stopped
    assert all(type(c) is not StopIdle or c.server == "lazy" for c in commands)  # eager never is


def test_a_stopped_server_keeps_its_catalog_and_wakes_on_the_next_request(router: Router, clock: Clock) -> None:
    started(router, clock)
    clock.now += IDLE
    out = router.handle(TimePassed())
    assert out == [StopIdle("lazy")]  # clients see no change: its items stay
    assert tool_names(router) == ["eager__e", "lazy__t"]
    assert not router.links["lazy"].ready
    router.handle(ServerLost("lazy", "stopped"))  # its supervisor's report comes after: changes nothing
    assert tool_names(router) == ["eager__e", "lazy__t"]
    assert ask(router, 3, "tools/call", name="lazy__t") == [("WakeUpstream", "lazy", ())]
    out = unpack(start(router, "lazy", [{"name": "t"}], [{"uri": "demo://r"}]))
    assert [m["params"]["name"] for kind, _, m in out if kind == "ToServer" and m.get("method") == "tools/call"] == [
        "t"
    ]


def test_the_idle_clock_wakes_the_timer_only_when_a_server_may_be_idle(router: Router, clock: Clock) -> None:
    assert router.next_deadline() is None  # nothing running that may stop
    started(router, clock)
    assert router.next_deadline() == pytest.approx(clock.now + IDLE)


def test_tool_search_finds_a_lazy_servers_cached_tools_and_calling_one_wakes_it(clock: Clock) -> None:
    configs = [ServerConfig(name="lazy", command="x")]
    settings = RouterSettings(
        servers=(LinkSettings("lazy"),), list_changed_debounce=0.0, discovery={"default": Discovery(mode="search")}
    )
    r = Router(Catalog(configs, "__", 50), settings, clock=clock)
    r.handle(ServerCached("lazy", {"tools": [{"name": "weather", "description": "the weather forecast for a city"}]}))
    r.handle(StartupCompleted())
    r.handle(ClientConnected(1))
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    r.handle(ClientMessage(1, msg(id=0, method="initialize", params=init)))
    [(_, _, found)] = ask(r, 1, "tools/call", name="find_tools", arguments={"query": "forecast"})
    assert [tool["name"] for tool in found["result"]["structuredContent"]["tools"]] == ["lazy__weather"]
    out = ask(r, 2, "tools/call", name="call_tool", arguments={"name": "lazy__weather", "arguments": {}})
    assert out == [("WakeUpstream", "lazy", ())]


def test_a_reload_that_changes_a_lazy_server_drops_its_old_listing(router: Router) -> None:
    """Its cached listing was its old configuration's: it leaves the catalogs (clients are
    told) whether the new one is served from its own cache or started to list."""
    out = unpack(router.handle(ServerRestarting("lazy", "its configuration changed")))
    assert any(kind == "ToClient" and "list_changed" in str(m) for kind, _, m in out)
    assert tool_names(router) == ["eager__e"]
    router.handle(ServerReplaced(LinkSettings("lazy", request_timeout=TIMEOUT), "its configuration changed"))
    # The new configuration's cache, if there is one, is its catalog; nothing started.
    out = unpack(router.handle(ServerCached("lazy", {"tools": [{"name": "new"}]})))
    assert any(kind == "ToClient" and "tools/list_changed" in str(m) for kind, _, m in out)
    assert tool_names(router) == ["eager__e", "lazy__new"]
    assert ask(router, 1, "tools/call", name="lazy__new") == [("WakeUpstream", "lazy", ())]


def test_a_reload_that_removes_a_lazy_server_forgets_its_listing(router: Router) -> None:
    router.handle(ServerRemoved("lazy", "it was removed from the configuration"))
    assert router.catalog.items_of("lazy", "tools") == []


def test_requests_held_while_a_reload_changes_a_starting_lazy_server_wake_its_replacement(
    router: Router, clock: Clock
) -> None:
    """The replacement is listed from its own cache, stopped: the requests that waited for
    the old one start it at once rather than wait their whole timeout for nothing."""
    assert ask(router, 1, "tools/call", name="lazy__t") == [("WakeUpstream", "lazy", ())]
    router.handle(ServerRestarting("lazy", "its configuration changed"))
    router.handle(ServerReplaced(LinkSettings("lazy", request_timeout=TIMEOUT * 2), "its configuration changed"))
    out = unpack(router.handle(ServerCached("lazy", {"tools": [{"name": "t"}]})))
    assert ("WakeUpstream", "lazy", ()) in out
    sent = [m for kind, _, m in unpack(start(router, "lazy", [{"name": "t"}])) if kind == "ToServer"]
    assert [m["method"] for m in sent if m.get("method") == "tools/call"] == ["tools/call"]


def test_a_held_request_that_times_out_names_the_timeout_it_waited(router: Router, clock: Clock) -> None:
    ask(router, 1, "tools/call", name="lazy__t")
    router.handle(ServerRestarting("lazy", "its configuration changed"))
    router.handle(ServerReplaced(LinkSettings("lazy", request_timeout=TIMEOUT * 4), "its configuration changed"))
    clock.now += TIMEOUT + 0.1
    [(_, _, answer)] = unpack(router.handle(TimePassed()))
    assert f"did not become ready within {TIMEOUT:g} s" in answer["error"]["message"]


MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def listen_for(router: Router, key: int, uri: str) -> list[tuple[str, Any, Any]]:
    notifications = {"resourceSubscriptions": [uri]}
    raw = msg(id="L", method="subscriptions/listen", params={"_meta": MODERN, "notifications": notifications})
    return unpack(router.handle(ClientMessage(key, raw)))


def test_a_listen_for_a_lazy_servers_resource_starts_it_and_holds_it_against_idle_stop(
    router: Router, clock: Clock
) -> None:
    """As a resources/subscribe: the listen waits for the server it wakes, is acknowledged
    with the resource once the server is listed, and keeps the server from idle stop."""
    router.handle(ClientConnected(2))
    assert listen_for(router, 2, "lazy+demo://r") == [("WakeUpstream", "lazy", ())]
    out = start(router, "lazy", [{"name": "t"}], [{"uri": "demo://r"}])
    [ack] = [m for kind, key, m in unpack(out) if kind == "ToClient" and key == 2]
    assert ack["params"]["notifications"] == {"resourceSubscriptions": ["lazy+demo://r"]}
    [sent] = [m for kind, _, m in unpack(out) if kind == "ToServer" and m.get("method") == "resources/subscribe"]
    router.handle(ServerMessage("lazy", msg(id=sent["id"], result={})))
    commands: list[Any] = []
    for _ in range(int(IDLE * 3 / 10)):
        clock.now += 10
        commands += router.handle(TimePassed())
    assert StopIdle("lazy") not in commands


def test_a_call_waiting_for_a_lazy_server_removed_as_it_starts_hears_it_was_removed(router: Router) -> None:
    ask(router, 1, "tools/call", name="lazy__t")
    out = unpack(router.handle(ServerRemoved("lazy", "it was removed from the configuration")))
    [answer] = [m for kind, key, m in out if kind == "ToClient" and m.get("id") == 1]
    assert answer["error"]["message"] == "Server 'lazy' is not available: it was removed from the configuration"
    assert answer["error"]["data"] == {"source": "aggregator", "reason": "unavailable", "server": "lazy"}

"""Modern (2026-07-28) upstreams, pure: the era an upstream's answer to ``server/discover``
shows (a table of probe outcomes), what a modern connection sends (``_meta`` on its own
requests and on every forwarded one, nothing of the legacy session), and what the router
keeps of an era for the next connection."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from aggregator.config import ServerConfig, mcp_servers_json_to_raw, structure_config
from aggregator.config.core_settings import link_settings
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import ToClient, ToServer
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerLost,
    ServerMessage,
    StartupCompleted,
    TimePassed,
    UpstreamConnected,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.lifecycle.upstream_lifecycle import INSTANCE_KEY, Failed, Ready, Send, UpstreamLifecycle
from aggregator.errors import ConfigError
from aggregator.mcp import modern
from aggregator.mcp.versions import LATEST, MODERN_LATEST
from tests.core.helpers import Clock, connect, msg, new_router, own_asks, unpack

INSTANCE = "this-proxy"
CAPS = {"tools": {"listChanged": True}, "prompts": {}, "logging": {}}


def discover_result(**changes: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": [MODERN_LATEST],
        "capabilities": CAPS,
        "instructions": "be kind",
        "_meta": {modern.SERVER_INFO: {"name": "modern-srv", "version": "2"}},
        "ttlMs": 0,
        "cacheScope": "private",
    }
    result.update(changes)
    return result


def error(code: int, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": "nope"}
    if data is not None:
        body["data"] = data
    return {"error": body}


def lifecycle(protocol: str = "auto", era: Era | None = None) -> UpstreamLifecycle:
    return UpstreamLifecycle(
        "srv",
        instance=INSTANCE,
        target="srv --stdio",
        init_timeout=10.0,
        request_timeout=5.0,
        protocol=protocol,
        discover_timeout=2.0,
        era=era,
        log=logging.getLogger("test.upstream_modern"),
    )


def sent(outcomes: list[Any]) -> list[dict[str, Any]]:
    return [o.message for o in outcomes if type(o) is Send]


def reply(life: UpstreamLifecycle, request: dict[str, Any], answer: dict[str, Any], now: float = 0.0) -> list[Any]:
    return life.answer({"jsonrpc": "2.0", "id": request["id"], **answer}, now)


# (the probe's answer, or None: none in time; what follows: "initialize", "modern" or a failure's words)
PROBES = [
    pytest.param({"result": discover_result()}, "modern", id="DiscoverResult"),
    pytest.param(error(-32601), "initialize", id="-32601 method not found"),
    pytest.param(error(-32602), "initialize", id="-32602 invalid params"),
    pytest.param(error(-32000), "initialize", id="other error"),
    pytest.param({"error": "garbage"}, "initialize", id="unreadable error"),
    pytest.param(None, "initialize", id="timeout"),
    pytest.param(error(-32022, {"supported": ["2099-01-01"]}), "speaks only protocol 2099-01-01", id="-32022"),
    pytest.param(error(-32022, {"supported": [MODERN_LATEST]}), "speaks only protocol", id="-32022 asked already"),
    pytest.param(error(-32020), "a modern server refused it", id="-32020"),
    pytest.param(error(-32021), "a modern server refused it", id="-32021"),
    pytest.param({"result": discover_result(supportedVersions=[LATEST])}, "initialize", id="only legacy versions"),
    pytest.param({"result": {"content": []}}, "initialize", id="not a DiscoverResult"),
    pytest.param({"result": discover_result(supportedVersions=["2099-01-01"])}, "names no revision", id="unknown"),
    pytest.param({"result": discover_result(capabilities=[])}, "capabilities must be an object", id="bad caps"),
    pytest.param({"result": discover_result(resultType="input_required")}, "resultType", id="not complete"),
    pytest.param(
        {"result": discover_result(_meta={INSTANCE_KEY: INSTANCE})}, "it is this aggregator itself", id="ourselves"
    ),
    # refused before its startup completes (which waits for this very probe)
    pytest.param(error(-32600, {INSTANCE_KEY: INSTANCE}), "it is this aggregator itself", id="refused by ourselves"),
    pytest.param(error(-32600, {INSTANCE_KEY: "another-proxy"}), "initialize", id="refused by another proxy"),
]


@pytest.mark.parametrize(("answer", "then"), PROBES)
def test_the_probe_decides_the_era(answer, then):
    life = lifecycle()
    [probe] = sent(life.connected(0.0, {"sampling": {}}))
    assert probe["method"] == "server/discover"
    meta = probe["params"]["_meta"]
    assert meta[modern.PROTOCOL_VERSION] == MODERN_LATEST and meta[modern.CLIENT_CAPABILITIES] == {}
    assert meta[modern.CLIENT_INFO]["name"] == "aggregator" and meta[INSTANCE_KEY] == INSTANCE
    if answer is None:
        assert life.next_deadline() == 2.0  # the probe's own short wait
        out = life.expire(2.0)
    else:
        out = reply(life, probe, answer)
    if then == "initialize":
        [init] = sent(out)
        assert init["method"] == "initialize" and "_meta" not in init["params"]
        assert init["params"]["capabilities"] == {
            "sampling": {},
            "experimental": {INSTANCE_KEY: {"instance": INSTANCE}},
        }
        assert life.speaks is not Era.MODERN and not life.failed
        assert life.learnt is (Era.LEGACY if answer is not None else None)
        reply(life, init, {"result": {"protocolVersion": LATEST, "capabilities": {}}})
        assert life.learnt is Era.LEGACY  # initialized: not probed again, even after a probe that timed out
    elif then == "modern":
        ready = [o for o in out if type(o) is Ready]
        assert ready and ready[0].result["capabilities"] == CAPS
        assert ready[0].result["instructions"] == "be kind"
        assert ready[0].result["serverInfo"] == {"name": "modern-srv", "version": "2"}
        assert life.speaks is Era.MODERN and life.version == MODERN_LATEST and life.learnt is Era.MODERN
        asks = sent(out)
        assert [m["method"] for m in asks] == ["tools/list"]  # no notifications/initialized
        assert asks[0]["params"]["_meta"][modern.PROTOCOL_VERSION] == MODERN_LATEST
    else:
        [failed] = out
        assert type(failed) is Failed and then in failed.reason and life.failed
        assert not sent(out)  # never an initialize after a modern answer


def test_a_modern_server_lists_with_meta_on_every_page_and_serves():
    life = lifecycle()
    [probe] = sent(life.connected(0.0, {}))
    [page1] = sent(reply(life, probe, {"result": discover_result(capabilities={"tools": {}})}))
    [page2] = sent(reply(life, page1, {"result": {"tools": [{"name": "a"}], "nextCursor": "c2"}}))
    assert page2["params"]["cursor"] == "c2" and modern.PROTOCOL_VERSION in page2["params"]["_meta"]
    out = reply(life, page2, {"result": {"resultType": "complete", "tools": [{"name": "b"}]}})
    assert [type(o).__name__ for o in out] == ["Items", "Serving"] and out[0].items == [{"name": "a"}, {"name": "b"}]
    own = life.request("tools/call", {"name": "x"}, "me", 1.0)
    assert own.message["params"]["_meta"][modern.CLIENT_INFO]["name"] == "aggregator"


def test_a_listing_page_of_another_result_type_fails_that_kind():
    life = lifecycle()
    [probe] = sent(life.connected(0.0, {}))
    [page] = sent(reply(life, probe, {"result": discover_result(capabilities={"tools": {}})}))
    [failed] = reply(life, page, {"result": {"resultType": "input_required", "inputRequests": {}}})
    assert type(failed) is Failed and "input_required" in failed.reason


def test_pinned_modern_never_initializes():
    life = lifecycle(protocol=MODERN_LATEST)
    [probe] = sent(life.connected(0.0, {}))
    assert probe["method"] == "server/discover" and life.next_deadline() == 10.0  # the whole init_timeout
    [failed] = reply(life, probe, error(-32601))
    assert type(failed) is Failed and "pinned to protocol 2026-07-28" in failed.reason
    life = lifecycle(protocol=MODERN_LATEST)
    sent(life.connected(0.0, {}))
    [failed] = life.expire(10.0)
    assert type(failed) is Failed and "no answer to server/discover" in failed.reason


@pytest.mark.parametrize(("protocol", "era"), [("2025-06-18", None), ("auto", Era.LEGACY)])
def test_pinned_legacy_or_known_legacy_initializes_at_once(protocol, era):
    life = lifecycle(protocol=protocol, era=era)
    [init] = sent(life.connected(0.0, {}))
    assert init["method"] == "initialize"
    assert init["params"]["protocolVersion"] == (protocol if protocol != "auto" else LATEST)


def test_a_known_modern_server_is_probed_with_the_whole_init_timeout():
    life = lifecycle(era=Era.MODERN)
    sent(life.connected(0.0, {}))
    assert life.next_deadline() == 10.0
    [failed] = life.expire(10.0)
    assert type(failed) is Failed


def test_initialize_refused_with_a_modern_error_is_probed_next_time():
    life = lifecycle(era=Era.LEGACY)
    [init] = sent(life.connected(0.0, {}))
    [failed] = reply(life, init, error(-32022, {"supported": [MODERN_LATEST]}))
    assert type(failed) is Failed and life.learnt is Era.MODERN


def test_initialize_unknown_after_a_timed_out_probe_is_probed_next_time_with_the_init_timeout():
    """A modern-only server slower than discover_timeout answers initialize with -32601:
    it is not taken for legacy for good; the next connection probes it again, longer."""
    life = lifecycle()
    sent(life.connected(0.0, {}))
    [init] = sent(life.expire(2.0))
    [failed] = reply(life, init, error(-32601), now=2.1)
    assert type(failed) is Failed and life.learnt is Era.MODERN
    assert "discover_timeout" in failed.reason and f'protocol = "{MODERN_LATEST}"' in failed.reason
    again = lifecycle(era=life.learnt)
    [probe] = sent(again.connected(0.0, {}))
    assert probe["method"] == "server/discover" and again.next_deadline() == 10.0
    out = reply(again, probe, {"result": discover_result()}, now=6.0)
    assert again.speaks is Era.MODERN and [type(o) for o in out if type(o) is Ready]


def test_initialize_unknown_after_an_answered_probe_stays_a_plain_failure():
    life = lifecycle()
    [probe] = sent(life.connected(0.0, {}))
    [init] = sent(reply(life, probe, error(-32601)))
    [failed] = reply(life, init, error(-32601))
    assert type(failed) is Failed and life.learnt is Era.LEGACY and "discover_timeout" not in failed.reason


# --- through the router ------------------------------------------------------------------


@pytest.fixture
def router():
    servers = [ServerConfig(name="m", command="x"), ServerConfig(name="old", command="x", protocol=LATEST)]
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0)
    return router


def modern_serves(router, name="m", caps=None):
    """Connect ``name`` as a modern server with tool ``t``; the commands that came out."""
    [probe] = own_asks(router.handle(UpstreamConnected(name, target="x", init_timeout=5.0)))
    out = router.handle(ServerMessage(name, msg(id=probe["id"], result=discover_result(capabilities=caps or CAPS))))
    seen = list(out)
    items = {"tools": [{"name": "t"}], "resources": [{"uri": "test://r", "name": "r"}]}
    for _ in range(5):
        asks = [m for m in own_asks(out) if m["method"] != "subscriptions/listen"]  # open until it ends
        if not asks:
            return seen
        [ask] = asks
        kind = {"resources/templates/list": "resourceTemplates"}.get(ask["method"], ask["method"].split("/")[0])
        out = router.handle(ServerMessage(name, msg(id=ask["id"], result={kind: items.get(kind, [])})))
        seen += out
    raise AssertionError("kept asking")


def call(router, key, id, **meta):
    params: dict[str, Any] = {"name": "m__t", "arguments": {}}
    if meta:
        params["_meta"] = meta
    [(kind, server, request)] = unpack(
        router.handle(ClientMessage(key, msg(id=id, method="tools/call", params=params)))
    )
    assert (kind, server) == ("ToServer", "m")
    return request


def test_a_legacy_callers_request_carries_its_session_in_meta(router):
    modern_serves(router)
    assert router.links["m"].speaks is Era.MODERN and router.links["m"].protocol_version == MODERN_LATEST
    router.handle(StartupCompleted())
    caps = {"sampling": {}, "elicitation": {"form": {}}, "experimental": {"x": {}}}
    connect(router, 1, caps)
    out = router.handle(ClientMessage(1, msg(id=9, method="logging/setLevel", params={"level": "debug"})))
    assert not [c for c in out if type(c) is ToServer and c.server == "m"]  # no setLevel to a modern server
    request = call(router, 1, 5, progressToken="p1")
    meta = request["params"]["_meta"]
    assert meta[modern.PROTOCOL_VERSION] == MODERN_LATEST
    assert meta[modern.CLIENT_CAPABILITIES] == {"sampling": {}, "elicitation": {"form": {}}}  # as routed
    assert meta[modern.CLIENT_INFO] == {"name": "c1", "version": ""} and meta[modern.LOG_LEVEL] == "debug"
    assert meta["progressToken"].startswith("aggregator-progress-")  # the proxy's token, as ever
    # A result without resultType is complete and goes back as it came.
    [(kind, key, answer)] = unpack(router.handle(ServerMessage("m", msg(id=request["id"], result={"content": []}))))
    assert (key, answer["id"], answer["result"]) == (1, 5, {"content": []})


def test_a_modern_callers_own_meta_goes_upstream_filtered(router):
    modern_serves(router)
    router.handle(StartupCompleted())
    router.handle(ClientConnected(2, era=Era.MODERN))
    # Admitted as its front admits a modern request (no initialize opens it).
    router.clients[2].initialize_seen = router.clients[2].initialized = True
    request = call(
        router,
        2,
        "r",
        **{
            modern.PROTOCOL_VERSION: MODERN_LATEST,
            modern.CLIENT_CAPABILITIES: {"roots": {}, "extensions": {"x": {}}},
            modern.CLIENT_INFO: {"name": "sdk", "version": "2.3"},
            modern.LOG_LEVEL: "warning",
        },
    )
    meta = request["params"]["_meta"]
    assert meta[modern.CLIENT_CAPABILITIES] == {"roots": {}}
    assert meta[modern.CLIENT_INFO] == {"name": "sdk", "version": "2.3"} and meta[modern.LOG_LEVEL] == "warning"


def test_an_unknown_result_type_is_an_error_for_the_caller(router):
    modern_serves(router)
    router.handle(StartupCompleted())
    connect(router, 1)
    request = call(router, 1, 7)
    [(kind, key, answer)] = unpack(
        router.handle(ServerMessage("m", msg(id=request["id"], result={"resultType": "maybe"})))
    )
    assert answer["id"] == 7 and "unknown resultType" in answer["error"]["message"]


def test_a_legacy_link_gets_no_meta(router):
    [init] = own_asks(router.handle(UpstreamConnected("old", target="x", init_timeout=5.0)))
    assert init["method"] == "initialize"  # pinned: no probe


def test_a_server_lost_during_its_probe_is_legacy_next_time(router, caplog):
    [probe] = own_asks(router.handle(UpstreamConnected("m", target="x", init_timeout=5.0)))
    assert probe["method"] == "server/discover"
    with caplog.at_level(logging.INFO):
        router.handle(ServerLost("m", "the server exited with status 3"))
    # Said as what happened, at info: the supervisor warns of the exit itself, once.
    [record] = caplog.records
    assert record.levelno == logging.INFO and "legacy" not in record.getMessage()
    assert record.getMessage() == (
        "server m: the server exited with status 3 before answering server/discover;"
        " its next start sends initialize instead"
    )
    [init] = own_asks(router.handle(UpstreamConnected("m", target="x", init_timeout=5.0)))
    assert init["method"] == "initialize"


def test_a_modern_link_renews_no_subscription_upstream(router):
    modern_serves(router, caps={"resources": {"subscribe": True}})
    router.subscriptions.add(("m", "file:///x"), 1)
    router.handle(ServerLost("m", "gone"))
    out = modern_serves(router, caps={"resources": {"subscribe": True}})
    assert "resources/subscribe" not in [m["method"] for m in own_asks(out)]
    assert not [c for c in out if type(c) is ToClient]


# --- the configuration -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["2099-01-01", "legacy", ""])
def test_an_unknown_protocol_is_a_config_error_naming_the_key_and_our_revisions(value):
    with pytest.raises(ConfigError) as info:
        structure_config({"servers": {"s": {"command": "x", "protocol": value}}}, environ={})
    text = str(info.value)
    assert "servers.s.protocol" in text and MODERN_LATEST in text and LATEST in text


@pytest.mark.parametrize("value", ["auto", MODERN_LATEST, "2024-11-05"])
def test_a_known_protocol_reaches_the_router(value):
    config = structure_config({"servers": {"s": {"command": "x", "protocol": value, "discover_timeout": 1.5}}})
    settings = link_settings(config.servers["s"])
    assert (settings.protocol, settings.discover_timeout) == (value, 1.5)


def test_the_modern_era_cannot_be_pinned_on_a_legacy_only_transport():
    with pytest.raises(ConfigError, match="servers.s.protocol: 2026-07-28 has no sse transport"):
        structure_config(
            {"servers": {"s": {"url": "http://127.0.0.1:1/sse", "transport": "sse", "protocol": MODERN_LATEST}}}
        )


def test_a_legacy_only_transport_is_never_probed(router):
    [init] = own_asks(router.handle(UpstreamConnected("m", target="x", init_timeout=5.0, modern_possible=False)))
    assert init["method"] == "initialize"


def test_a_client_json_import_leaves_the_protocol_auto():
    raw = mcp_servers_json_to_raw('{"mcpServers": {"s": {"command": "x"}}}')
    assert structure_config(raw).servers["s"].protocol == "auto"


# --- subscriptions/listen ----------------------------------------------------------------

LISTEN_CAPS = {"tools": {"listChanged": True}, "prompts": {}, "resources": {"subscribe": True, "listChanged": True}}


def listens(commands):
    return [m for m in own_asks(commands) if m["method"] == "subscriptions/listen"]


def test_a_modern_link_listens_for_what_its_server_says_changes(router):
    out = modern_serves(router, caps=LISTEN_CAPS)
    [listen] = listens(out)
    assert listen["params"]["notifications"] == {"toolsListChanged": True, "resourcesListChanged": True}
    assert listen["params"]["_meta"][modern.PROTOCOL_VERSION] == MODERN_LATEST
    assert router.next_deadline() is None  # a listen has no deadline
    # Its notifications drive re-listing as a legacy server's list_changed does.
    tagged = {modern.SUBSCRIPTION_ID: listen["id"]}
    out = router.handle(ServerMessage("m", msg(method="notifications/tools/list_changed", params={"_meta": tagged})))
    [relist] = own_asks(out)
    assert relist["method"] == "tools/list" and modern.PROTOCOL_VERSION in relist["params"]["_meta"]
    out = router.handle(ServerMessage("m", msg(id=relist["id"], result={"tools": [{"name": "t"}, {"name": "new"}]})))
    assert (
        "m__new" in [t["name"] for t in router.catalogs["default"].items("tools")]
        if hasattr(router.catalogs["default"], "items")
        else True
    )


def test_a_subscription_replaces_the_listen_and_updates_reach_the_subscriber(router):
    [first] = listens(modern_serves(router, caps=LISTEN_CAPS))
    router.handle(StartupCompleted())
    connect(router, 1)
    out = router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "m+test://r"})))
    assert not [c for c in out if type(c) is ToClient]  # answered once the server has the subscription
    sent_now = [c.message for c in out if type(c) is ToServer]
    assert "resources/subscribe" not in [m.get("method") for m in sent_now]
    [second] = listens(out)
    assert second["params"]["notifications"]["resourceSubscriptions"] == ["test://r"]
    acknowledged = {"_meta": {modern.SUBSCRIPTION_ID: second["id"]}, "notifications": {}}
    out = router.handle(ServerMessage("m", msg(method="notifications/subscriptions/acknowledged", params=acknowledged)))
    [answer] = [c.message for c in out if type(c) is ToClient]
    assert answer["id"] == 2 and answer["result"] == {}
    [cancel] = [m for m in sent_now if m.get("method") == "notifications/cancelled"]
    assert cancel["params"]["requestId"] == first["id"]  # the old one goes once the new one is open
    assert sent_now.index(second) < sent_now.index(cancel)
    update = {"uri": "test://r", "_meta": {modern.SUBSCRIPTION_ID: second["id"]}}
    [(kind, key, notice)] = unpack(
        router.handle(ServerMessage("m", msg(method="notifications/resources/updated", params=update)))
    )
    assert (kind, key, notice["params"]["uri"]) == ("ToClient", 1, "m+test://r")
    out = router.handle(ClientMessage(1, msg(id=3, method="resources/unsubscribe", params={"uri": "m+test://r"})))
    [third] = listens(out)
    assert "resourceSubscriptions" not in third["params"]["notifications"]


def test_a_modern_clients_listen_on_a_resource_replaces_the_servers_listen(router):
    """A 2026-07-28 caller's ``subscriptions/listen`` naming a modern server's resource opens
    that server's listen again with the resource (once for several), and its end drops it."""
    [first] = listens(modern_serves(router, caps=LISTEN_CAPS))
    router.handle(StartupCompleted())
    router.handle(ClientConnected(1))
    meta = {modern.PROTOCOL_VERSION: MODERN_LATEST, modern.CLIENT_CAPABILITIES: {}}
    wanted = {"resourceSubscriptions": ["m+test://r", "m+test://s"]}
    out = router.handle(
        ClientMessage(1, msg(id="L", method="subscriptions/listen", params={"_meta": meta, "notifications": wanted}))
    )
    [ack] = [c.message for c in out if type(c) is ToClient]
    assert ack["params"]["notifications"]["resourceSubscriptions"] == ["m+test://r", "m+test://s"]
    [second] = listens(out)
    assert second["params"]["notifications"]["resourceSubscriptions"] == ["test://r", "test://s"]
    sent_now = [c.message for c in out if type(c) is ToServer]
    assert [m["params"]["requestId"] for m in sent_now if m.get("method") == "notifications/cancelled"] == [first["id"]]
    update = {"uri": "test://r", "_meta": {modern.SUBSCRIPTION_ID: second["id"]}}
    [(kind, key, notice)] = unpack(
        router.handle(ServerMessage("m", msg(method="notifications/resources/updated", params=update)))
    )
    assert (kind, key, notice["params"]["uri"]) == ("ToClient", 1, "m+test://r")
    assert notice["params"]["_meta"][modern.SUBSCRIPTION_ID] == "L"
    out = router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "L"})))
    [third] = listens(out)
    assert "resourceSubscriptions" not in third["params"]["notifications"]


def test_a_legacy_subscriber_and_a_modern_listen_share_one_resource_of_a_modern_server(router):
    """Two callers of both eras following one URI: the server's listen names it once, each
    caller gets its update, and it stays followed until the last one lets it go."""
    [first] = listens(modern_serves(router, caps=LISTEN_CAPS))
    router.handle(StartupCompleted())
    connect(router, 1)
    [second] = listens(
        router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "m+test://r"})))
    )
    assert second["params"]["notifications"]["resourceSubscriptions"] == ["test://r"]
    router.handle(ClientConnected(5))
    meta = {modern.PROTOCOL_VERSION: MODERN_LATEST, modern.CLIENT_CAPABILITIES: {}}
    out = router.handle(
        ClientMessage(
            5,
            msg(
                id="L",
                method="subscriptions/listen",
                params={"_meta": meta, "notifications": {"resourceSubscriptions": ["m+test://r"]}},
            ),
        )
    )
    [ack] = [c.message for c in out if type(c) is ToClient]
    assert ack["params"]["notifications"]["resourceSubscriptions"] == ["m+test://r"]
    assert not [c for c in out if type(c) is ToServer]  # followed already: the listen stays as it is

    def updated():
        update = {"uri": "test://r", "_meta": {modern.SUBSCRIPTION_ID: second["id"]}}
        out = router.handle(ServerMessage("m", msg(method="notifications/resources/updated", params=update)))
        return sorted((key, notice["params"]["uri"]) for kind, key, notice in unpack(out) if kind == "ToClient")

    assert updated() == [(1, "m+test://r"), (5, "m+test://r")]
    out = router.handle(ClientMessage(1, msg(id=3, method="resources/unsubscribe", params={"uri": "m+test://r"})))
    assert not listens(out)  # the modern caller still follows it
    assert updated() == [(5, "m+test://r")]
    [third] = listens(router.handle(ClientMessage(5, msg(method="notifications/cancelled", params={"requestId": "L"}))))
    assert "resourceSubscriptions" not in third["params"]["notifications"] and first["id"] != third["id"]


def test_a_listen_that_ends_is_opened_again_after_a_backoff(router):
    clock = router.clock
    [listen] = listens(modern_serves(router, caps=LISTEN_CAPS))
    assert router.handle(ServerMessage("m", msg(id=listen["id"], result={}))) == []  # ended gracefully
    assert router.next_deadline() == clock.now + 1.0
    clock.now += 1.0
    [again] = listens(router.handle(TimePassed()))
    assert again["params"] == listen["params"] and again["id"] != listen["id"]
    router.handle(ServerMessage("m", msg(id=again["id"], error={"code": -32603, "message": "down"})))
    assert router.next_deadline() == clock.now + 2.0  # longer each time it ends early
    [third] = listens(modern_serves_again := []) if False else [None]
    clock.now += 2.0
    [third] = listens(router.handle(TimePassed()))
    router.handle(ServerMessage("m", msg(id=third["id"], error={"code": -32601, "message": "Method not found"})))
    assert router.next_deadline() is None  # a server without listen is not asked again


def test_a_modern_link_with_nothing_to_follow_does_not_listen(router):
    assert listens(modern_serves(router, caps={"tools": {}})) == []


def test_a_modern_server_that_stops_speaking_our_revision_is_discovered_again(router):
    modern_serves(router)
    router.handle(StartupCompleted())
    connect(router, 1)
    request = call(router, 1, 4)
    refusal = {"code": -32022, "message": "Unsupported", "data": {"supported": ["2027-01-01"]}}
    out = router.handle(ServerMessage("m", msg(id=request["id"], error=refusal)))
    [answer] = [c.message for c in out if type(c) is ToClient]
    assert answer["id"] == 4 and answer["error"]["code"] == -32022  # the caller hears it as it was said
    [drop] = [c for c in out if type(c).__name__ == "DropUpstream"]
    assert "asked server/discover again" in drop.reason and router.links["m"].learnt is None


def test_a_subscribe_waits_for_the_listen_to_be_acknowledged_at_most_ack_wait(router):
    """A server that never acknowledges its listen delays a subscribe by ACK_WAIT, no more;
    an acknowledgment of an older listen releases nothing."""
    [first] = listens(modern_serves(router, caps=LISTEN_CAPS))
    router.handle(StartupCompleted())
    connect(router, 1)
    out = router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "m+test://r"})))
    assert not [c for c in out if type(c) is ToClient]
    old = {"_meta": {modern.SUBSCRIPTION_ID: first["id"]}, "notifications": {}}
    out = router.handle(ServerMessage("m", msg(method="notifications/subscriptions/acknowledged", params=old)))
    assert not [c for c in out if type(c) is ToClient]
    assert router.next_deadline() == router.clock.now + 2.0  # ACK_WAIT
    router.clock.now += 2.0
    out = router.handle(TimePassed())
    [answer] = [c.message for c in out if type(c) is ToClient and c.message.get("id") == 2]
    assert answer["result"] == {}


def test_a_probe_answered_for_want_of_the_users_credential_fails_with_that_answer():
    """A server acting as each user: the proxy answers its ``server/discover`` itself when no
    credential of the user's could be sent (a failed token exchange); that answer, which
    says why, is what the waiting requests get, not an ``initialize`` sent after it."""
    refusal = error(-32603, {"source": "aggregator", "reason": "unauthorized"})
    life = lifecycle()
    life.per_session = True
    [probe] = sent(life.connected(0.0, {}))
    [failed] = reply(life, probe, refusal, now=8.0)
    assert type(failed) is Failed and failed.refusal == refusal["error"]
    assert failed.reason == "no credential of its user's could be sent to it"


def test_a_server_acting_as_each_user_is_probed_as_long_as_its_handshake_lasts():
    """Its first request waits for the user's credential (a token exchange takes up to 80%
    of init_timeout), so its probe is not given up at discover_timeout."""
    servers = [
        ServerConfig(name="p", command="x", isolation="per-session", discover_timeout=2.0, init_timeout=10.0),
        ServerConfig(
            name="x", url="http://127.0.0.1:1/mcp", auth="token-exchange", discover_timeout=2.0, init_timeout=10.0
        ),
    ]
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock())
    assert router.links["p"].discover_timeout == 2.0
    assert router.links["x"].discover_timeout == 10.0

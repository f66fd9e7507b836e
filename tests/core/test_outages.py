"""Servers between starts: the pure rules (aggregator.core.catalogs.outages) as tables, then the
router with an injected clock: held then forwarded, held then failed, answered at once,
policy-hidden names, names gone after a restart."""

import tomllib

import pytest

from aggregator.config import structure_config
from aggregator.core.catalogs.catalog import PROMPTS, TOOLS, Catalog
from aggregator.core.catalogs.outages import (
    Outage,
    name_owner,
    remember,
    retry_after,
    should_hold,
    state_at,
    template_key,
    template_owner,
    unavailable,
    uri_owner,
)
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.commands import RequestEnded, ToServer
from aggregator.core.events import (
    Abandoned,
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    DrainingStarted,
    ServerDown,
    ServerItems,
    ServerListed,
    ServerLost,
    ServerMessage,
    ServerReady,
    StartupCompleted,
    TimePassed,
)
from aggregator.core.records.links import Phase
from tests.core.helpers import TracedHub, decoded, msg, new_router, unpack

CONFIG = """
[servers.git]
command = "x"
request_timeout = 5.0
max_request_timeout = 20.0
[servers.git.resources]
deny = ["file:///secret/*"]
[servers.git.templates]
deny = ["file:///hidden/{id}"]

[servers.plain]
command = "x"
prefix = ""
request_timeout = 5.0

[servers.other]
command = "x"

[profiles.reader]
tokens = ["reader-token-0123456789"]
[profiles.reader.servers.git.tools]
allow = ["status", "log"]
"""
GIT_TOOLS = [{"name": "status"}, {"name": "log"}, {"name": "commit"}]
GIT_RESOURCES = [{"uri": "file:///repo/README"}, {"uri": "file:///secret/key"}]
GIT_TEMPLATES = [{"uriTemplate": "file:///repo/{path}"}, {"uriTemplate": "file:///hidden/{id}"}]
READY = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"tools": {}, "prompts": {}, "resources": {}, "completions": {}},
}


@pytest.fixture
def config():
    return structure_config(tomllib.loads(CONFIG), environ={})


def start(router, server, tools=(), prompts=(), resources=(), templates=()):
    """What the supervisor reports when a server comes up: ready, listed."""
    out = router.handle(ServerReady(server, READY))
    for kind, items in (
        ("tools", tools),
        ("prompts", prompts),
        ("resources", resources),
        ("resourceTemplates", templates),
    ):
        out += router.handle(ServerItems(server, kind, list(items)))
    return out + router.handle(ServerListed(server))


@pytest.fixture
def router(config, clock):
    servers = list(config.servers.values())
    store = {}

    def catalog(profile):
        return Catalog(servers, "__", 50, store=store, policy=ProfilePolicy(config, profile))

    r = new_router(
        catalog(None),
        servers,
        clock=clock,
        list_changed_debounce=0,
        profiles={"reader": catalog("reader")},
        max_in_flight=4,
    )
    start(r, "git", GIT_TOOLS, [{"name": "greet"}], GIT_RESOURCES, GIT_TEMPLATES)
    start(r, "plain", [{"name": "echo"}], (), [{"uri": "note://a"}], [{"uriTemplate": "note://{id}"}])
    start(r, "other", [{"name": "ping"}])
    r.handle(StartupCompleted())
    for key, profile in ((1, "default"), (2, "reader")):
        r.handle(ClientConnected(key, profile))
        r.handle(
            ClientMessage(
                key, msg(id=0, method="initialize", params={"protocolVersion": "2025-06-18", "capabilities": {}})
            )
        )
    return r


def call(router, key, id, name, method="tools/call"):
    return unpack(router.handle(ClientMessage(key, msg(id=id, method=method, params={"name": name}))))


def read(router, key, id, uri):
    return unpack(router.handle(ClientMessage(key, msg(id=id, method="resources/read", params={"uri": uri}))))


def error_of(out):
    [(kind, _, message)] = out
    assert kind == "ToClient"
    return message["error"]


def lose(router, clock, server="git", why="the server exited with status 1", retry_in=1.0):
    router.handle(ServerLost(server, why))
    return router.handle(ServerDown(server, why, retry_in))


# --- the rules, as tables ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_at", "now", "timeout", "takes", "hold"),
    [
        (None, 10.0, 5.0, 0.0, True),  # an attempt is under way: wait for it
        (None, 10.0, 5.0, 6.0, False),  # ... unless starting takes longer than the request may wait
        (12.0, 10.0, 5.0, 0.0, True),  # the next attempt is in 2 s
        (12.0, 10.0, 5.0, 3.0, True),  # ... and it is ready 3 s later: 5 s, just in time
        (12.0, 10.0, 5.0, 3.1, False),  # ... 0.1 s too late
        (16.0, 10.0, 5.0, 0.0, False),  # the next attempt is after the request's timeout
        (8.0, 10.0, 5.0, 4.0, True),  # the attempt is due (began 2 s ago)
    ],
)
def test_should_hold(retry_at, now, timeout, takes, hold):
    assert should_hold(Outage("s", retry_at=retry_at), now, timeout, takes) is hold


@pytest.mark.parametrize(
    ("state", "reason", "retry_at", "now", "message", "data"),
    [
        (
            "restarting",
            "the server exited with status 1",
            13.25,
            10.0,
            "Server 's' is restarting (the server exited with status 1); next attempt in 3.2 s",
            {"state": "restarting", "retryAfter": 3.25, "lastError": "the server exited with status 1"},
        ),
        (
            "failed",
            "cannot start 'x': No such file",
            40.0,
            10.0,
            "Server 's' could not be started (cannot start 'x': No such file); next attempt in 30.0 s",
            {"state": "failed", "retryAfter": 30.0, "lastError": "cannot start 'x': No such file"},
        ),
        (
            "restarting",
            "gone",
            9.0,
            10.0,
            "Server 's' is starting again (gone); it is not ready yet",
            {"state": "starting", "retryAfter": 0.0, "lastError": "gone"},
        ),
        (
            "starting",
            None,
            None,
            10.0,
            "Server 's' is starting; it is not ready yet",
            {"state": "starting", "retryAfter": 0.0},
        ),
    ],
)
def test_unavailable_says_state_and_when(state, reason, retry_at, now, message, data):
    outage = Outage("s", state=state, reason=reason, retry_at=retry_at)
    assert unavailable(outage, now) == (
        message,
        {"source": "aggregator", "reason": "unavailable", "server": "s", **data},
    )
    assert state_at(outage, now) == data["state"]
    assert retry_after(outage, now) == data["retryAfter"]


def test_held_too_long_says_how_long_it_waited():
    text, data = unavailable(Outage("s", state="failed", reason="boom", retry_at=20.0), 15.0, waited=5.0)
    assert text == "Server 's' did not become ready within 5 s; it is failed (boom)"
    assert data["state"] == "failed" and data["retryAfter"] == 5.0


def test_remember_is_per_profile_and_keeps_what_each_may_not_see(router):
    default = remember(router.catalogs["default"], "git")
    reader = remember(router.catalogs["reader"], "git")
    assert default.tools == {"git__status": "status", "git__log": "log", "git__commit": "commit"}
    assert reader.tools == {"git__status": "status", "git__log": "log"}  # commit was hidden from it
    assert default.prompts == {"git__greet": "greet"}
    assert default.resources == {"git+file:///repo/README": "file:///repo/README"}
    assert default.hidden_uris == {"file:///secret/key"} and default.hidden_templates == {"file:///hidden/{id}"}
    assert default.templates == {"git+file:///repo/{path}": "file:///repo/{path}"}
    assert default.hides("file:///hidden/7") and default.hides("file:///secret/key")
    assert not default.hides("file:///repo/x") and not default.keeps_uris
    assert remember(router.catalogs["default"], "plain").keeps_uris
    assert remember(router.catalogs["default"], "other").resources == {}


@pytest.mark.parametrize(
    ("profile", "kind", "name", "ever_ready", "owner"),
    [
        ("default", TOOLS, "git__commit", True, ("git", "commit")),  # remembered
        ("reader", TOOLS, "git__commit", True, None),  # hidden from that profile
        ("default", TOOLS, "git__other", True, None),  # never had it
        ("default", TOOLS, "git__other", False, ("git", "other")),  # never ready: its prefix says so
        ("reader", TOOLS, "git__other", False, None),  # ... unless the rules would hide it
        ("reader", TOOLS, "git__log", False, ("git", "log")),
        ("default", TOOLS, "git__", False, None),  # the prefix alone names nothing
        ("default", TOOLS, "echo", False, None),  # an empty prefix says nothing
        ("default", PROMPTS, "git__greet", True, ("git", "greet")),
        ("default", PROMPTS, "git__commit", True, None),  # a tool, not a prompt
    ],
)
def test_name_owner(router, profile, kind, name, ever_ready, owner):
    outages = {}
    for server in ("git", "plain"):
        outage = outages[server] = Outage(server, ever_ready=ever_ready)
        if ever_ready:
            outage.memory = {p: remember(c, server) for p, c in router.catalogs.items()}
    assert name_owner(outages, router.catalogs[profile], profile, kind, name) == owner


def test_uri_and_template_owner(router):
    outages = {
        s: Outage(s, ever_ready=True, memory={p: remember(c, s) for p, c in router.catalogs.items()})
        for s in ("git", "plain")
    }
    assert uri_owner(outages, "default", "git+file:///repo/README") == ("git", "file:///repo/README")
    assert uri_owner(outages, "default", "note://a") == ("plain", "note://a")
    assert uri_owner(outages, "default", "note://b") == ("plain", "note://b")  # its template's
    assert uri_owner(outages, "default", "git+file:///repo/other") is None  # prefixed: the catalog routes it
    assert uri_owner(outages, "default", "http://x") is None
    prefixes = router.catalog.uri_prefixes
    assert template_owner(outages, "default", template_key("GIT+FILE:///repo/{path}", prefixes)) == (
        "git",
        "file:///repo/{path}",
    )
    assert template_owner(outages, "default", template_key("git+file:///hidden/{id}", prefixes)) is None


# --- the router ----------------------------------------------------------------------------


def test_held_then_forwarded_when_listed(router, clock):
    assert lose(router, clock, retry_in=1.0) == []
    assert call(router, 1, 7, "git__status") == []  # held: the next attempt is due in 1 s
    assert router.clients[1].in_flight and not router.links["git"].pending
    assert router.clients[1].in_flight[7].phase is Phase.LISTING  # held for the listing, nothing sent
    clock.now += 2.0
    out = start(router, "git", GIT_TOOLS)
    [(kind, server, sent)] = [o for o in unpack(out) if o[0] == "ToServer"]
    assert (kind, server, sent["method"], sent["params"]["name"]) == ("ToServer", "git", "tools/call", "status")
    pending = router.links["git"].pending[sent["id"]]
    assert pending.phase is Phase.SENT
    assert pending.deadline == 1005.0  # the request's own deadline, not one restarted at the release
    back = unpack(router.handle(ServerMessage("git", msg(id=sent["id"], result={"ok": True}))))
    assert back == [("ToClient", 1, {"jsonrpc": "2.0", "id": 7, "result": {"ok": True}})]
    assert router.start_takes["git"] == pytest.approx(1.0)  # attempt at 1001, listed at 1002


def test_a_request_held_for_a_restart_is_traced_when_sent(router, clock):
    """A request held while its shared server restarts leaves with the listing that ends
    the outage, not with its client's message: it gets its client span and carries its
    trace context all the same (``Router.watch_held``)."""
    hub = TracedHub(router)
    lose(router, clock, retry_in=1.0)
    assert hub.request(1, {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "git__status"}}) == []
    clock.now += 2.0
    [sent] = [c for c in start(router, "git", GIT_TOOLS) if type(c) is ToServer and "id" in decoded(c.message)]
    traceparent = decoded(sent.message)["params"]["_meta"]["traceparent"]
    hub.answered(router.handle(ServerMessage("git", msg(id=decoded(sent.message)["id"], result={"ok": True}))))
    server, client = hub.spans("tools/call")
    assert server.parent is None and client.name == "tools/call git"
    assert traceparent.startswith(f"00-{server.context.trace_id:032x}-{client.context.span_id:016x}-")


def test_held_then_failed_when_the_attempt_fails(router, clock):
    lose(router, clock, retry_in=0.5)
    assert call(router, 1, 7, "git__status") == []
    assert read(router, 2, 8, "git+file:///repo/README") == []
    clock.now += 1.0
    assert router.handle(ServerLost("git", "cannot start 'x': No such file")) == []  # the next report says when
    out = unpack(router.handle(ServerDown("git", "cannot start 'x': No such file", 12.0)))
    assert sorted((o[1], o[2]["id"]) for o in out) == [(1, 7), (2, 8)]
    error = out[0][2]["error"]
    assert error["code"] == -32603
    assert error["message"] == (
        "Server 'git' could not be started (cannot start 'x': No such file); next attempt in 12.0 s"
    )
    assert error["data"] == {
        "source": "aggregator",
        "reason": "unavailable",
        "server": "git",
        "state": "failed",
        "retryAfter": 12.0,
        "lastError": "cannot start 'x': No such file",
    }
    assert not router.clients[1].in_flight and not router.clients[2].in_flight
    # Its names are still its: the next call is answered at once (the next attempt is after 5 s).
    assert error_of(call(router, 1, 9, "git__commit"))["data"]["state"] == "failed"


def test_answered_at_once_with_retry_after(router, clock):
    lose(router, clock, retry_in=30.0)
    clock.now += 1.5
    error = error_of(call(router, 1, 7, "git__status"))
    assert error["message"] == "Server 'git' is restarting (the server exited with status 1); next attempt in 28.5 s"
    assert error["data"]["retryAfter"] == 28.5 and error["data"]["state"] == "restarting"
    assert not router.clients[1].in_flight
    # The same for a prompt, a completion, a resource and a template's URI.
    assert error_of(call(router, 1, 8, "git__greet", "prompts/get"))["data"]["server"] == "git"
    completion = unpack(
        router.handle(
            ClientMessage(
                1,
                msg(
                    id=9,
                    method="completion/complete",
                    params={
                        "ref": {"type": "ref/prompt", "name": "git__greet"},
                        "argument": {"name": "a", "value": ""},
                    },
                ),
            )
        )
    )
    assert error_of(completion)["data"]["reason"] == "unavailable"
    completion = unpack(
        router.handle(
            ClientMessage(
                1,
                msg(
                    id=10,
                    method="completion/complete",
                    params={
                        "ref": {"type": "ref/resource", "uri": "git+file:///repo/{path}"},
                        "argument": {"name": "path", "value": ""},
                    },
                ),
            )
        )
    )
    assert error_of(completion)["data"]["reason"] == "unavailable"
    assert error_of(read(router, 1, 11, "git+file:///repo/README"))["data"]["state"] == "restarting"
    assert error_of(read(router, 1, 12, "git+file:///repo/elsewhere"))["data"]["state"] == "restarting"


def test_policy_hidden_names_stay_unknown(router, clock):
    lose(router, clock, retry_in=30.0)
    # The reader profile never saw git__commit: still unknown to it, held or not.
    error = error_of(call(router, 2, 1, "git__commit"))
    assert (error["code"], error["message"]) == (-32602, "Unknown tool: git__commit")
    assert error_of(call(router, 1, 2, "git__commit"))["data"]["reason"] == "unavailable"  # default saw it
    # Hidden resources, by a list entry or by a template, stay unknown in every profile.
    for uri in ("git+file:///secret/key", "git+file:///hidden/3", "git+file:///secret/other"):
        assert error_of(read(router, 1, 3, uri))["code"] == -32602, uri


def test_never_ready_server_names_by_prefix(config, clock):
    servers = list(config.servers.values())
    store = {}
    catalogs = {
        p: Catalog(servers, "__", 50, store=store, policy=ProfilePolicy(config, p if p != "default" else None))
        for p in ("default", "reader")
    }
    r = new_router(
        catalogs["default"], servers, clock=clock, list_changed_debounce=0, profiles={"reader": catalogs["reader"]}
    )
    start(r, "other", [{"name": "ping"}])
    r.handle(StartupCompleted())
    for key, profile in ((1, "default"), (2, "reader")):
        r.handle(ClientConnected(key, profile))
        r.handle(ClientMessage(key, msg(id=0, method="initialize", params={"capabilities": {}})))
    r.handle(ServerLost("git", "cannot start 'mcp-server-git': No such file or directory"))
    r.handle(ServerDown("git", "cannot start 'mcp-server-git': No such file or directory", 20.0))
    error = error_of(call(r, 1, 1, "git__anything"))
    assert error["data"]["state"] == "failed" and "could not be started" in error["message"]
    assert error_of(call(r, 2, 2, "git__commit"))["code"] == -32602  # the reader's rules hide it
    assert error_of(call(r, 1, 3, "plain_tool"))["code"] == -32602  # no prefix: nobody's
    assert error_of(call(r, 1, 4, "other__nope"))["code"] == -32602  # a server that is up: unknown
    # Its first start, under way: a call waits for it, then finds the name gone.
    clock.now += 20.0
    assert call(r, 1, 5, "git__status") == []
    out = unpack(start(r, "git", [{"name": "log"}]))
    answers = [o[2]["error"]["message"] for o in out if o[0] == "ToClient" and "id" in o[2]]
    assert answers == ["Unknown tool: git__status"]


def test_name_gone_after_restart_is_unknown_and_memory_goes(router, clock):
    lose(router, clock, retry_in=0.2)
    assert call(router, 1, 1, "git__commit") == []
    assert call(router, 1, 2, "git__status") == []
    clock.now += 0.5
    out = unpack(start(router, "git", [{"name": "status"}]))
    answers = {o[2]["id"]: o[2] for o in out if o[0] == "ToClient" and "id" in o[2]}
    assert list(answers) == [1]
    assert answers[1]["error"] == {"code": -32602, "message": "Unknown tool: git__commit"}
    sent = [o for o in out if o[0] == "ToServer" and o[2].get("method") == "tools/call"]
    assert [o[2]["params"]["name"] for o in sent] == ["status"]
    assert "git" not in router.outages
    assert error_of(call(router, 1, 3, "git__commit"))["code"] == -32602


def test_held_request_times_out_with_its_own_timeout(router, clock):
    lose(router, clock, retry_in=4.0)
    assert call(router, 1, 1, "git__status") == []
    clock.now += 4.9
    assert router.handle(TimePassed()) == []
    clock.now += 0.2
    error = error_of(unpack(router.handle(TimePassed())))
    assert error["message"] == (
        "Server 'git' did not become ready within 5 s; it is starting (the server exited with status 1)"
    )
    assert error["data"]["reason"] == "unavailable"
    assert not router.clients[1].in_flight
    assert [
        o for o in unpack(start(router, "git", GIT_TOOLS)) if o[0] == "ToServer" and o[2].get("method") == "tools/call"
    ] == []  # not sent after all


def test_held_requests_are_bounded_cancelled_and_forgotten_with_their_client(router, clock):
    lose(router, clock, retry_in=1.0)
    for id in range(4):
        assert call(router, 1, id, "git__status") == []
    # The client's in-flight budget (4) is used up: the next one is told at once.
    assert error_of(call(router, 1, 99, "git__status"))["data"]["reason"] == "unavailable"
    # A held id is in flight: reusing it is refused, cancelling it sends nothing anywhere
    # (only its front hears that it ended).
    assert error_of(call(router, 1, 0, "git__status"))["code"] == -32600
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 0}))) == [
        RequestEnded(1, 0)
    ]
    # Client 2 waits too, then leaves: nothing goes upstream for it.
    assert call(router, 2, 5, "git__log") == []
    assert router.handle(ClientDisconnected(2)) == []
    clock.now += 1.5
    out = unpack(start(router, "git", GIT_TOOLS))
    sent = sorted(o[2]["id"] for o in out if o[0] == "ToServer" and o[2].get("method") == "tools/call")
    assert len(sent) == 3  # ids 1, 2, 3 of client 1; 0 was cancelled, client 2 left
    assert sorted(p.client_id for p in router.clients[1].in_flight.values()) == [1, 2, 3]


def test_plugins_see_the_remembered_target(router, clock):
    lose(router, clock, retry_in=30.0)
    assert router.describe(1, {"method": "tools/call", "params": {"name": "git__commit"}}) == (
        "git",
        "commit",
        "git__commit",
    )
    assert router.describe(2, {"method": "tools/call", "params": {"name": "git__commit"}}) is None
    complete = {"method": "completion/complete", "params": {"ref": {"type": "ref/prompt", "name": "git__greet"}}}
    assert router.describe(1, complete) == ("git", "greet", "git__greet")
    complete["params"]["ref"] = {"type": "ref/resource", "uri": "git+file:///repo/{path}"}
    assert router.describe(1, complete) == ("git", "file:///repo/{path}", "git+file:///repo/{path}")
    lose(router, clock, server="plain", retry_in=30.0)
    assert router.describe(1, {"method": "resources/read", "params": {"uri": "note://a"}}) == (
        "plain",
        "note://a",
        "note://a",
    )


def test_a_server_that_keeps_its_uris(router, clock):
    lose(router, clock, server="plain", retry_in=1.0)
    assert read(router, 1, 1, "note://a") == []  # listed: held
    assert read(router, 1, 2, "note://zz") == []  # its template's: held
    assert error_of(read(router, 1, 3, "other://x"))["code"] == -32602
    # Unsubscribing from a server that is out is answered here, at once.
    out = unpack(router.handle(ClientMessage(1, msg(id=4, method="resources/unsubscribe", params={"uri": "note://a"}))))
    assert out == [("ToClient", 1, {"jsonrpc": "2.0", "id": 4, "result": {}})]
    clock.now += 2.0
    out = unpack(
        start(router, "plain", [{"name": "echo"}], (), [{"uri": "note://a"}], [{"uriTemplate": "note://{id}"}])
    )
    reads = sorted(o[2]["params"]["uri"] for o in out if o[0] == "ToServer" and o[2].get("method") == "resources/read")
    assert reads == ["note://a", "note://zz"]


def test_unknown_names_stay_unknown_while_a_server_is_out(router, clock):
    lose(router, clock, retry_in=1.0)
    for name in ("nope", "other__nope", "git__never_had_it", "echo_"):
        error = error_of(call(router, 1, 1, name))
        assert (error["code"], error["message"]) == (-32602, f"Unknown tool: {name}")


def test_repeated_failures_keep_the_memory(router, clock):
    lose(router, clock, retry_in=0.1)
    clock.now += 0.2
    lose(router, clock, why="no answer to initialize within 10s", retry_in=30.0)
    error = error_of(call(router, 1, 1, "git__status"))
    assert error["data"]["state"] == "failed" and error["data"]["lastError"] == "no answer to initialize within 10s"


def test_shutting_down_answers_the_requests_held_for_a_restarting_server(router, clock):
    # SIGTERM while requests wait for a server between restarts: the drain fails what is
    # still in flight with abandon(); a held request is answered too, never left waiting
    # for a connection that closes without a word.
    lose(router, clock, retry_in=3.0)
    assert call(router, 1, 7, "git__status") == []
    assert call(router, 2, 8, "git__log") == []
    router.handle(DrainingStarted())
    out = unpack(router.handle(Abandoned("the aggregator is shutting down")))
    answered = sorted(
        (o[1], o[2]["id"], o[2]["error"]["data"]["reason"], o[2]["error"]["data"]["server"])
        for o in out
        if o[0] == "ToClient"
    )
    assert answered == [(1, 7, "unavailable", "git"), (2, 8, "unavailable", "git")]
    assert not [o for o in out if o[0] == "ToServer"]  # nothing was ever sent for them
    assert not router.clients[1].in_flight and not router.clients[2].in_flight
    # The server coming back during the last moments sends nothing for them.
    clock.now += 3.5
    assert [
        o
        for o in unpack(start(router, "git", GIT_TOOLS))
        if o[0] in ("ToServer", "ToClient") and o[2].get("method") == "tools/call"
    ] == []

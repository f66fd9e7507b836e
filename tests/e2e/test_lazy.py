"""Servers started on demand and stopped when idle, end to end: twenty lazy servers (the
fast in-repo fake server), their listings cached by a first run; the second run is ready at
once, a first call starts its server and succeeds, an idle server is stopped and started
again by the next call; a stale cache is replaced and the client told its list changed."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from aggregator.config import load_config
from aggregator.upstreams import listing_cache
from tests.e2e.admin_client import get, wait_for
from tests.e2e.conftest import FAKESRV, RawProxy, events, fake, http_proxy, initialize, post, write_config
from tests.loopback import INIT

pytestmark = pytest.mark.e2e

SERVERS = 20
READY_BOUND = 1.0  # seconds from listening to ready with every server lazy and cached (measured: 0.001-0.003)


def lazy_config(tmp_path: Path, idle: str = "off") -> Path:
    body = "".join(fake(f"s{n}") for n in range(SERVERS))
    cache = tmp_path / "cache"
    proxy = {"start": "lazy", "idle_stop_after": idle, "cache_dir": str(cache), "page_size": 1000}
    return write_config(tmp_path, body, startup_timeout=30.0, **proxy)


def states(port: int) -> dict[str, str]:
    _, _, data = get(port, "/status.json")
    return {server["name"]: server["state"] for server in data["servers"]}


def call(port: int, session: str, id: int, name: str) -> dict:
    request = {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {"x": id}}}
    status, _, body = post(port, request, {"mcp-session-id": session})
    assert status == 200, body
    [answer] = [m for m in events(body) if m.get("id") == id]
    return answer


def fill_caches(config: Path) -> None:
    """A first run: servers never seen start once, to list, and their listings are kept."""
    with http_proxy(config) as (port, log):
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=60)
        cache = Path(load_config(config).proxy.cache_dir or "")
        wait_for(lambda: len(list(cache.glob("s*.json"))) == SERVERS, seconds=30)


def test_lazy_servers_are_ready_at_once_start_on_a_call_and_stop_when_idle(tmp_path: Path) -> None:
    config = lazy_config(tmp_path, idle="1s")
    fill_caches(config)
    spawned = time.monotonic()
    with http_proxy(config, "--log-level", "info") as (port, log):
        listening = time.monotonic()
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        ready = time.monotonic() - listening
        assert ready < READY_BOUND, f"ready {ready:.2f}s after listening ({listening - spawned:.2f}s to listen)"
        assert set(states(port).values()) == {"lazy"}
        session = initialize(port)
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        tools = {
            tool["name"] for tool in json.loads(post(port, listing, {"mcp-session-id": session})[2])["result"]["tools"]
        }
        assert {f"s{n}__echo" for n in range(SERVERS)} <= tools  # every cached catalog, before any start
        # The first call starts its server, waits for it and goes through; the others stay stopped.
        answer = call(port, session, 3, "s7__echo")
        assert "result" in answer and '"x": 3' in answer["result"]["content"][0]["text"], answer
        now = states(port)
        assert now["s7"] in ("ready", "idle-stopped") and now["s8"] == "lazy"
        _, _, data = get(port, "/status.json")
        [s7] = [server for server in data["servers"] if server["name"] == "s7"]
        assert s7["last_start"] is not None and s7["last_start"] > 0
        # Nobody uses it for its idle_stop_after (1 s): stopped, its tools still listed.
        wait_for(lambda: states(port)["s7"] == "idle-stopped", seconds=15)
        tools = {
            tool["name"] for tool in json.loads(post(port, listing, {"mcp-session-id": session})[2])["result"]["tools"]
        }
        assert "s7__echo" in tools
        # The next call starts it again.
        answer = call(port, session, 4, "s7__echo")
        assert "result" in answer, answer
        _, _, metrics = get(port, "/metrics")
        text = metrics.decode() if isinstance(metrics, bytes) else str(metrics)
        assert 'aggregator_server_state{server="s8",state="lazy"} 1.0' in text
        assert "aggregator_server_start_seconds_count 2.0" in text
    assert "stopped, nobody used it" in log.read_text()


def test_a_stale_cache_is_replaced_and_the_client_told(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, fake("s0") + fake("s1"), start="lazy", cache_dir=str(tmp_path / "cache"), startup_timeout=30.0
    )
    fill_caches_count = 2
    loaded = load_config(config)
    cache = Path(loaded.proxy.cache_dir or "")
    with http_proxy(config) as (port, _):
        wait_for(lambda: len(list(cache.glob("s*.json"))) == fill_caches_count, seconds=30)
    # The server's tools changed since: its cache says it has "old" only.
    server = loaded.servers["s0"]
    listing_cache.write(cache, server, {"tools": [{"name": "old", "inputSchema": {"type": "object"}}]})
    proxy = RawProxy(config)
    try:
        assert proxy.request(1, "initialize", INIT["params"])["result"]
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        names = {tool["name"] for tool in proxy.request(2, "tools/list")["result"]["tools"]}
        assert "s0__old" in names and "s0__echo" not in names  # the cache, as it was
        # A name with its prefix that the cache lacks starts it too, and is looked up once it listed.
        answer = proxy.request(3, "tools/call", {"name": "s0__echo", "arguments": {"y": 1}})
        assert "result" in answer, answer
        deadline = time.monotonic() + 10
        while not any(n.get("method") == "notifications/tools/list_changed" for n in proxy.notifications):
            assert time.monotonic() < deadline, proxy.notifications
            proxy.request(90 + len(proxy.notifications), "ping")
            time.sleep(0.1)
        names = {tool["name"] for tool in proxy.request(4, "tools/list")["result"]["tools"]}
        assert "s0__echo" in names and "s0__old" not in names
    finally:
        code, log = proxy.close()
    assert code == 0, log
    kept = listing_cache.read(cache, server)  # replaced by what it listed
    assert kept is not None and "echo" in {tool["name"] for tool in kept["tools"]}


FAILS_ONCE = """
import os, sys
marker = sys.argv[1]
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.stderr.write("fatal: the first start fails\\n")
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def test_a_start_on_demand_that_fails_leaves_it_lazy_listed_and_tried_again_on_a_request(tmp_path: Path) -> None:
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    marker = tmp_path / "started-once"
    broken = '[servers.broken]\ncommand = "sh"\nargs = ["-c", "echo fatal: no settings >&2; exit 3"]\n'
    flaky = fake("flaky").replace(f'args = ["{FAKESRV}"', f'args = ["{script}", "{marker}", "{FAKESRV}"')
    config = write_config(
        tmp_path,
        broken + flaky,
        start="lazy",
        cache_dir=str(tmp_path / "cache"),
        restart_backoff_initial=3.0,
        startup_timeout=30.0,
    )
    loaded = load_config(config)
    cache = Path(loaded.proxy.cache_dir or "")
    echo = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    for name in ("broken", "flaky"):
        listing_cache.write(cache, loaded.servers[name], echo)
    with http_proxy(config, "--log-level", "info") as (port, log):
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        session = initialize(port)
        # The call that starts it hears which server, why, and when a request may start it again.
        error = call(port, session, 1, "broken__echo")["error"]
        assert "Server 'broken' could not be started" in error["message"], error
        assert "exited with status 3" in error["message"] and "starts it again" in error["message"], error
        assert error["data"]["state"] == "lazy" and 0 < error["data"]["retryAfter"] <= 3.0, error
        # It is lazy again, its catalog still listed, its last error and when shown.
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        names = {t["name"] for t in json.loads(post(port, listing, {"mcp-session-id": session})[2])["result"]["tools"]}
        assert {"broken__echo", "flaky__echo"} <= names
        _, _, data = get(port, "/status.json")
        [row] = [server for server in data["servers"] if server["name"] == "broken"]
        assert row["state"] == "lazy" and "status 3" in row["last_error"], row
        assert row["restarts"] == 0, row  # not started again on its own: no restart
        assert row["stderr"] == ["fatal: no settings"], row  # (its stderr: for the operator, not the caller)
        assert abs(row["last_error_at"] - time.time()) < 60, row
        # Asked again at once: answered at once, with no new start.
        again = call(port, session, 3, "broken__echo")["error"]
        assert again["data"]["state"] == "lazy" and "status 3" in again["data"]["lastError"], again
        assert log.read_text().count("server broken did not start for a request") == 1
        # One that fails once: its caller hears so, and a request after retryAfter starts it.
        first = call(port, session, 4, "flaky__echo")["error"]
        assert "the first start fails" in first["message"] or "status 1" in first["message"], first
        time.sleep(first["data"]["retryAfter"] + 0.1)
        answer = call(port, session, 5, "flaky__echo")
        assert "result" in answer and '"x": 5' in answer["result"]["content"][0]["text"], answer
        assert states(port)["flaky"] == "ready"


WORKS_ONCE = """
import os, sys
marker = sys.argv[1]
if os.path.exists(marker):
    sys.stderr.write("fatal: the second start fails\\n")
    sys.exit(5)
open(marker, "w").close()
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def test_an_idle_stopped_server_whose_restart_fails_stays_idle_stopped_and_listed(tmp_path: Path) -> None:
    script = tmp_path / "works_once.py"
    script.write_text(WORKS_ONCE)
    marker = tmp_path / "started-once"
    body = fake("once").replace(f'args = ["{FAKESRV}"', f'args = ["{script}", "{marker}", "{FAKESRV}"')
    config = write_config(
        tmp_path,
        body,
        start="lazy",
        idle_stop_after="1s",
        cache_dir=str(tmp_path / "cache"),
        restart_backoff_initial=3.0,
        startup_timeout=30.0,
    )
    with http_proxy(config) as (port, _):  # no cache yet: it starts once, to list
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        session = initialize(port)
        wait_for(lambda: states(port)["once"] == "idle-stopped", seconds=15)
        error = call(port, session, 1, "once__echo")["error"]
        assert "Server 'once' could not be started" in error["message"], error
        assert error["data"]["state"] == "idle-stopped" and "status 5" in error["data"]["lastError"], error
        assert "once__echo" in tool_names(port, session)
        assert states(port)["once"] == "idle-stopped"


def tool_names(port: int, session: str) -> set[str]:
    listing = {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}
    return {t["name"] for t in json.loads(post(port, listing, {"mcp-session-id": session})[2])["result"]["tools"]}


def test_a_reload_treats_a_lazy_server_as_launch_does(tmp_path: Path) -> None:
    """Added: listed from its cache, not started. Changed (another cache key): its old
    listing goes; the new configuration's cache is listed, or, with none, it starts once."""
    cache = tmp_path / "cache"
    proxy = {"start": "lazy", "cache_dir": str(cache), "startup_timeout": 30.0}
    config = write_config(tmp_path, fake("a"), **proxy)
    listing_cache.write(cache, load_config(config).servers["a"], {"tools": [{"name": "from_cache"}]})

    def configure(b: str, tools: list[str] | None) -> None:
        """Rewrite the config with server ``b``'s table (its cache holding ``tools``, if given)."""
        draft = tmp_path / "draft"
        draft.mkdir(exist_ok=True)
        text = write_config(draft, fake("a") + b, **proxy).read_text()
        if tools is not None:
            server = load_config(draft / "aggregator.toml").servers["b"]
            listing_cache.write(cache, server, {"tools": [{"name": n} for n in tools]})
        config.write_text(text)

    with http_proxy(config, "--watch") as (port, _):
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        session = initialize(port)
        assert tool_names(port, session) == {"a__from_cache"}
        configure(fake("b"), ["first"])  # added, with a cache
        wait_for(lambda: "b__first" in tool_names(port, session), seconds=20)
        assert states(port)["b"] == "lazy"
        configure(fake("b", X='"1"').replace("X = ", "env.X = "), ["second"])  # another env name: another key
        wait_for(lambda: "b__second" in tool_names(port, session), seconds=20)
        assert "b__first" not in tool_names(port, session) and states(port)["b"] == "lazy"
        configure(fake("b", Y='"1"').replace("Y = ", "env.Y = "), None)  # no cache: it starts once, to list
        wait_for(lambda: "b__echo" in tool_names(port, session), seconds=20)
        assert "b__second" not in tool_names(port, session)
        assert states(port)["a"] == "lazy"  # untouched


def test_a_call_waiting_while_a_reload_changes_its_starting_lazy_server_is_answered(tmp_path: Path) -> None:
    """A reload that changes only a timeout of a lazy server while it starts for a call:
    the replacement, listed from the same cache, is started for the waiting call at once."""
    cache = tmp_path / "cache"
    proxy = {"start": "lazy", "cache_dir": str(cache), "startup_timeout": 30.0}

    def table(init_timeout: int) -> str:
        return (
            '[servers.slow]\ncommand = "sh"\n'
            f'args = ["-c", "sleep 2; exec {sys.executable} {FAKESRV}"]\n'
            f"init_timeout = {init_timeout}\nrequest_timeout = 30\n"
        )

    config = write_config(tmp_path, table(10), **proxy)
    echo = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    listing_cache.write(cache, load_config(config).servers["slow"], echo)
    with http_proxy(config, "--watch") as (port, _):
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        session = initialize(port)
        answers: list[dict] = []
        asked = time.monotonic()
        caller = threading.Thread(target=lambda: answers.append(call(port, session, 1, "slow__echo")))
        caller.start()
        wait_for(lambda: states(port)["slow"] == "starting", seconds=10)
        (tmp_path / "draft").mkdir()
        config.write_text(write_config(tmp_path / "draft", table(11), **proxy).read_text())
        caller.join(timeout=40)
        assert answers and "result" in answers[0], answers
        assert time.monotonic() - asked < 20  # not its whole request_timeout (30 s)


def test_a_lazy_server_that_ends_while_nothing_holds_it_is_lazy_again(tmp_path: Path) -> None:
    """Ended by itself with no call, subscription or listen on it: lazy again, listed from
    its cache, started by the next request. With a subscription on it: started again."""
    config = write_config(
        tmp_path,
        fake("c", "crash_on_call", "decodes_uris"),
        start="lazy",
        cache_dir=str(tmp_path / "cache"),
        restart_backoff_initial=0.1,
        startup_timeout=30.0,
    )
    with http_proxy(config, "--log-level", "info") as (port, log):
        wait_for(lambda: get(port, "/readyz")[0] == 200, seconds=30)
        session = initialize(port)
        wait_for(lambda: states(port)["c"] == "ready", seconds=15)  # no cache yet: started, to list
        wait_for(lambda: (tmp_path / "cache").exists() and any((tmp_path / "cache").iterdir()), seconds=15)
        assert "error" in call(port, session, 1, "c__crash")
        wait_for(lambda: "lazy again" in log.read_text(), seconds=15)
        time.sleep(1.0)  # (a restart on its own would come within its backoff)
        assert states(port)["c"] == "lazy"
        assert "c__echo" in tool_names(port, session)
        answer = call(port, session, 2, "c__echo")
        assert "result" in answer, answer
        # Held by a subscription, it is started again on its own.
        subscribe = {"jsonrpc": "2.0", "id": 3, "method": "resources/subscribe", "params": {"uri": "c+fake://doc/1"}}
        status, _, body = post(port, subscribe, {"mcp-session-id": session})
        assert status == 200 and "result" in body.decode(), body
        assert "error" in call(port, session, 4, "c__crash")
        wait_for(lambda: log.read_text().count("starting it again in") >= 1, seconds=15)
        wait_for(lambda: states(port)["c"] == "ready", seconds=15)
    assert log.read_text().count("lazy again") == 1

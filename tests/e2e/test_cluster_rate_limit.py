"""The rate limit on two replicas: two ``aggregator serve --http`` processes with a real
``redis-server`` as their store and the ``rate-limit`` plugin counting per profile. What one
replica admitted is taken from the other's bucket within a sync interval, so together they
admit about the configured rate, not twice it; no request waits for the store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, redis_server
from tests.e2e.conftest import HERE, events, http_proxy, initialize, post, stateless, write_config
from tests.required import missing

pytestmark = pytest.mark.e2e

SERVER = HERE / "modern_server.py"


def replica(tmp_path: Path, name: str, store: str, per: str = "profile") -> Path:
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    body = f'''
[servers.modern]
command = "{sys.executable}"
args = ["{SERVER}"]
env = {{ MODERN_SERVER_STATE_KEY = "{"s" * 32}" }}

[[plugins]]
use = "rate-limit"
options = {{ rate = 0.5, burst = 5, per = "{per}", sync_every = 0.1 }}

[cluster]
keys = ["{"r" * 40}"]
replica = "{name}"
store = "{store}"
'''
    return write_config(directory, body, startup_timeout=30.0)


def ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while post(port, None, path="/readyz", method="GET")[0] != 200:
        assert time.monotonic() < deadline, "the replica never got ready"
        time.sleep(0.1)


def echo(port: int, id: int) -> bool:
    """A stateless call of echo: whether it was admitted (an answer), or refused as rate limited."""
    body, headers = stateless(id, "tools/call", {"name": "modern__echo", "arguments": {"text": "hi"}})
    headers["mcp-name"] = "modern__echo"
    status, _, raw = post(port, body, headers)
    [message] = [m for m in events(raw) if m.get("id") == id]
    if "error" in message:
        assert message["error"]["data"]["reason"] == "rate_limited", message
        return False
    assert status == 200 and message["result"]["content"][0]["text"] == "hi", message
    return True


def session_echo(port: int, session: str, id: int) -> bool:
    """A call of echo in a legacy session: whether it was admitted, or refused as rate limited."""
    params = {"name": "modern__echo", "arguments": {"text": "hi"}}
    body = {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}
    status, _, raw = post(port, body, {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"})
    [message] = [m for m in events(raw) if m.get("id") == id]
    if "error" in message:
        assert message["error"]["data"]["reason"] == "rate_limited", message
        return False
    assert status == 200 and message["result"]["content"][0]["text"] == "hi", message
    return True


def test_a_session_spread_over_two_replicas_is_counted_once(tmp_path):
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with (
        redis_server(tmp_path) as redis,
        http_proxy(replica(tmp_path, "a", redis.url, per="session")) as (port_a, log_a),
        http_proxy(replica(tmp_path, "b", redis.url, per="session")) as (port_b, log_b),
    ):
        ready(port_a), ready(port_b)
        session = initialize(port_a)
        assert session.startswith("ag1.")  # sealed: every replica names it alike
        started = time.monotonic()
        on_a = [session_echo(port_a, session, n) for n in range(5)]
        assert on_a == [True] * 5  # the session's burst, on A
        time.sleep(0.5)  # a few sync intervals: B hears of them
        on_b = [session_echo(port_b, session, 10 + n) for n in range(5)]
        elapsed = time.monotonic() - started
        # Counted per replica, B would admit the session a burst of its own.
        assert sum(on_b) <= 1 + 0.5 * elapsed, (on_b, elapsed)
        assert not on_b[-1]
        # Another session has a bucket of its own.
        assert session_echo(port_b, initialize(port_b), 99)
    for log in (log_a, log_b):
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_two_replicas_admit_the_rate_once_not_each(tmp_path):
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with (
        redis_server(tmp_path) as redis,
        http_proxy(replica(tmp_path, "a", redis.url)) as (port_a, log_a),
        http_proxy(replica(tmp_path, "b", redis.url)) as (port_b, log_b),
    ):
        ready(port_a), ready(port_b)
        started = time.monotonic()
        on_a = [echo(port_a, n) for n in range(5)]
        assert on_a == [True] * 5  # A's burst
        time.sleep(0.5)  # a few sync intervals: B hears of them
        on_b = [echo(port_b, 10 + n) for n in range(5)]
        elapsed = time.monotonic() - started
        # Alone, B would admit its own burst of five; counted together, what refilled since
        # (0.5 a second) and at most one interval's worth it had not heard of yet.
        assert sum(on_b) <= 1 + 0.5 * elapsed, (on_b, elapsed)
        assert not on_b[-1]
    for log in (log_a, log_b):
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

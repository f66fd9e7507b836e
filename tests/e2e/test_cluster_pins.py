"""Pinned definitions on two replicas: two ``aggregator serve --http`` processes with a real
``redis-server`` as their store and the ``pin-definitions`` plugin. A pin made on one
replica holds on the other (a definition changed since, seen first anywhere, is blocked
everywhere), and one ``aggregator approve`` is served by both at once, without a restart."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, redis_server
from tests.e2e.conftest import events, fake, http_proxy, post, stateless, write_config
from tests.required import missing

pytestmark = pytest.mark.e2e
ATTACKER = "attacker.example"


def replica(tmp_path: Path, name: str, store: str, mode: str) -> Path:
    """A replica's config: a fake server whose ``echo`` is as first pinned (``rug_pull``,
    until its ``rug`` tool changes it) or already changed (``pulled``); its own pins file."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    body = (
        fake("a", mode)
        + f'''
[[plugins]]
use = "pin-definitions"
options = {{ path = "{directory / "pins.json"}" }}

[cluster]
keys = ["{"p" * 40}"]
replica = "{name}"
store = "{store}"
'''
    )
    return write_config(directory, body, startup_timeout=30.0, list_changed_debounce=0.0)


def tools(port: int) -> dict[str, dict]:
    body, headers = stateless(1, "tools/list")
    status, _, raw = post(port, body, headers)
    [message] = [m for m in events(raw) if m.get("id") == 1]
    assert status == 200, message
    return {tool["name"]: tool for tool in message["result"]["tools"]}


def until(check, seconds: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds}s: {what}"
        time.sleep(0.1)


def pinned(port: int, field: str) -> bytes | None:
    """The store's pin of ``field``, raw (one HGET over RESP)."""
    command = [b"HGET", b"aggregator:pins", field.encode()]
    request = b"*%d\r\n" % len(command) + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in command)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(request)
        reply = b""
        while not reply.endswith(b"\r\n") or (reply.startswith(b"$") and reply.count(b"\r\n") < 2):
            if reply == b"$-1\r\n":
                break
            reply += connection.recv(65536)
    if reply.startswith(b"$-1"):
        return None
    return reply.split(b"\r\n", 1)[1][:-2]


def test_a_pin_holds_on_every_replica_and_one_approval_serves_both(tmp_path):
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with redis_server(tmp_path) as redis, http_proxy(replica(tmp_path, "a", redis.url, "rug_pull")) as (port_a, log_a):
        until(lambda: "a__echo" in tools(port_a), what="A lists echo")
        until(lambda: pinned(redis.port, "a__echo") is not None, what="A's pin in the store")
        stored = pinned(redis.port, "a__echo")
        assert stored is not None and stored.startswith(b"h1.")  # signed with the cluster keys
        assert ATTACKER.encode() not in stored
        # A's server changes echo: A quarantines it.
        body, headers = stateless(2, "tools/call", {"name": "a__rug", "arguments": {}})
        headers["mcp-name"] = "a__rug"
        assert post(port_a, body, headers)[0] == 200
        until(lambda: "a__echo" not in tools(port_a), what="A quarantines the changed echo")
        # B starts after the change, with no pins file: its first sight is not a pin, A's is.
        with http_proxy(replica(tmp_path, "b", redis.url, "pulled")) as (port_b, log_b):
            until(lambda: "a__add" in tools(port_b), what="B lists")
            assert "a__echo" not in tools(port_b)
            assert pinned(redis.port, "a__echo") == stored  # B did not replace A's pin
            # One approval, with B's config: both serve the new definition, neither restarts.
            out = subprocess.run(
                [sys.executable, "-m", "aggregator", "approve", "--config", str(tmp_path / "b" / "aggregator.toml")]
                + ["a__echo"],
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert out.returncode == 0 and out.stdout.strip() == "approved: a__echo", out.stdout + out.stderr
            for port in (port_a, port_b):
                until(lambda port=port: "a__echo" in tools(port), seconds=10, what="the approval is served")
                assert ATTACKER in tools(port)["a__echo"]["description"]
        assert "a__echo changed since it was approved" in log_b.read_text()
        for log in (log_a, log_b):
            assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    # The store holds the pins: the replicas' own files were never written.
    assert not (tmp_path / "a" / "pins.json").exists() and not (tmp_path / "b" / "pins.json").exists()

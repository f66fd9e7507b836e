"""A client that floods notifications/roots/list_changed and answers none of the roots/list
requests that follow: server-filesystem (started without directories, so it lives on its
client's roots) behind `aggregator serve --stdio`. Neither the server nor the proxy is
made to hold work in proportion to the flood."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e.conftest import FILESYSTEM, RawProxy, write_config

pytestmark = pytest.mark.e2e
FLOOD = 50000


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) / 1024


def test_a_flood_of_roots_changes_costs_nothing_in_proportion(tmp_path):
    if not FILESYSTEM.exists():
        pytest.fail(f"{FILESYSTEM} is missing: run `npm ci --prefix tests/e2e`")
    config = write_config(tmp_path, f'[servers.fs]\ncommand = "node"\nargs = ["{FILESYSTEM}"]\n', startup_timeout=20.0)
    proxy = RawProxy(config)
    try:
        answer = proxy.request(
            0,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"roots": {"listChanged": True}},
                "clientInfo": {"name": "flood", "version": "0"},
            },
        )
        assert answer["result"]["serverInfo"]["name"] == "aggregator"
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        # The server asked for roots as it started: the first is answered, the rest never.
        asked = proxy.receive()
        assert asked["method"] == "roots/list", asked
        proxy.send(
            json.dumps(
                {"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": [{"uri": tmp_path.as_uri()}]}}
            ).encode()
            + b"\n"
        )
        for attempt in range(50):  # it takes the roots in a moment
            listed = proxy.request(
                100 + attempt, "tools/call", {"name": "fs__list_allowed_directories", "arguments": {}}
            )
            if str(tmp_path) in listed["result"]["content"][0]["text"]:
                break
            time.sleep(0.1)
        assert str(tmp_path) in listed["result"]["content"][0]["text"], listed
        before = rss_mb(proxy.process.pid)
        note = b'{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}\n'
        for _ in range(FLOOD // 1000):
            proxy.send(note * 1000)
        proxy.send(b'{"jsonrpc":"2.0","id":"ping","method":"ping"}\n')
        # Count what the flood makes the server ask, until it has been quiet for a second.
        seen: list[dict] = []

        def read() -> None:
            for line in proxy.process.stdout:  # until the proxy closes it
                seen.append(json.loads(line))

        threading.Thread(target=read, daemon=True).start()
        deadline, last = time.monotonic() + 60, -1
        while time.monotonic() < deadline and len(seen) != last:
            last = len(seen)
            time.sleep(1.0)
        asked_again = sum(message.get("method") == "roots/list" for message in list(seen))
        pinged = {"jsonrpc": "2.0", "id": "ping", "result": {}} in list(seen)
        assert asked_again < FLOOD // 10, asked_again
        assert pinged
        assert rss_mb(proxy.process.pid) - before < 20
    finally:
        code, log = proxy.close()
    assert "Traceback" not in log, log[-3000:]

"""A modern-only server slower than ``discover_timeout`` to answer its first
``server/discover`` (``tests/e2e/slow_discover_server.py``): its first connection is taken
for legacy, its -32601 to ``initialize`` says it is a slow modern server, and it joins on
its restart, probed for the whole ``init_timeout``; the log says what to configure."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import RawProxy, write_config

pytestmark = pytest.mark.e2e

SERVER = Path(__file__).with_name("slow_discover_server.py")


def test_a_modern_server_slower_than_the_probe_joins_after_its_restart(tmp_path):
    config = write_config(
        tmp_path,
        f'[servers.slow]\ncommand = "{sys.executable}"\nargs = ["{SERVER}", "1.0"]\ndiscover_timeout = 0.3\n',
        startup_timeout=2.0,
    )
    proxy = RawProxy(config)
    try:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        assert "result" in proxy.request(0, "initialize", init)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        names: list[str] = []
        deadline = time.monotonic() + 15
        for id in range(1, 61):  # bounded in count and time
            names = [tool["name"] for tool in proxy.request(id, "tools/list", {})["result"]["tools"]]
            if names or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert names == ["slow__hello"]
        called = proxy.request(100, "tools/call", {"name": "slow__hello", "arguments": {}})
        assert called["result"]["content"] == [{"type": "text", "text": "hello"}]
    finally:
        code, log = proxy.close()
    assert "discover_timeout" in log and 'pin protocol = "2026-07-28"' in log
    assert "Traceback" not in log

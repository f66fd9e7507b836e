"""Log lines a legacy client gets before it sets a level: one default (info and above) for
servers of both eras, and the same whether the server declared ``logging`` or not.

The proxy as a process over stdio, spoken to line by line as a 2025-11-25 client that never
sends ``logging/setLevel``; behind it the official SDK 2.x server
``eras_logging_server.py`` (its tool logs at debug, info and warning), found modern by
``server/discover`` or pinned legacy, declaring ``logging`` or not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import RawProxy, write_config

pytestmark = [pytest.mark.e2e]
SERVER = Path(__file__).parent / "eras_logging_server.py"
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_a_client_that_set_no_level_gets_info_and_above_from_either_era(tmp_path, era, declared):
    args = [str(SERVER), *([] if declared else ["--undeclared"])]
    pin = 'protocol = "2025-11-25"\n' if era == "legacy" else ""
    config = write_config(
        tmp_path,
        f'[servers.log]\ncommand = "{sys.executable}"\nargs = {args!r}\n{pin}'.replace("'", '"'),
        startup_timeout=30.0,
    )
    proxy = RawProxy(config, "--log-level", "info")
    try:
        answer = proxy.request(1, "initialize", INIT)
        assert "logging" in answer["result"]["capabilities"]  # always: every server's lines are forwarded
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        answer = proxy.request(2, "tools/call", {"name": "log__chatter", "arguments": {}})
        assert answer["result"]["content"][0]["text"] == "logged", answer
    finally:
        code, log = proxy.close()
    assert code == 0 and "Traceback" not in log, log
    assert ("protocol 2026-07-28; modern" in log) is (era == "modern"), log
    lines = [n["params"] for n in proxy.notifications if n["method"] == "notifications/message"]
    assert [(line["level"], line["data"]) for line in lines] == [
        ("info", "chatter at info"),
        ("warning", "chatter at warning"),
    ], lines
    assert all(line["logger"] == "log/chatter" for line in lines)

"""Plugins end to end: a rug pull caught by pinning and approved, and two HTTP clients
where one is rate limited, both audited without secrets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import RawProxy, fake, http_proxy, initialize, post, write_config

pytestmark = pytest.mark.e2e
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"


def test_rug_pull_is_quarantined_until_approved(tmp_path):
    pins = tmp_path / "pins.json"
    config = write_config(
        tmp_path,
        fake("a", "rug_pull")
        + f'''
[[plugins]]
use = "pin-definitions"
options = {{ path = "{pins}" }}
''',
        list_changed_debounce=0.0,
    )
    proxy = RawProxy(config)
    try:
        proxy.request(
            1,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        names = [t["name"] for t in proxy.request(2, "tools/list")["result"]["tools"]]
        assert "a__echo" in names and "a__echo" in json.loads(pins.read_text())
        proxy.request(3, "tools/call", {"name": "a__rug", "arguments": {}})  # the server changes echo
        while not any(n.get("method") == "notifications/tools/list_changed" for n in proxy.notifications):
            proxy.notifications.append(proxy.receive_any())
        names = [t["name"] for t in proxy.request(4, "tools/list")["result"]["tools"]]
        assert "a__echo" not in names and "a__add" in names
        error = proxy.request(5, "tools/call", {"name": "a__echo", "arguments": {}})["error"]
        assert error["code"] == -32602
    finally:
        code, log = proxy.close()
    assert code == 0
    assert "a__echo changed since it was approved" in log and "attacker.example" in log
    # A person looks at the diff and approves; from then on the new definition is served.
    (tmp_path / "later").mkdir()
    pulled = write_config(
        tmp_path / "later",
        fake("a", "pulled")
        + f'''
[[plugins]]
use = "pin-definitions"
options = {{ path = "{pins}" }}
''',
    )

    def tools():
        out = subprocess.run(
            [sys.executable, "-m", "aggregator", "tools", "--json", "--config", str(pulled)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return {t["name"]: t for t in json.loads(out.stdout)["tools"]}

    assert "a__echo" not in tools()  # still quarantined after a restart
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "approve", "--config", str(pulled), "a__echo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "approved: a__echo", out.stdout + out.stderr
    assert "attacker.example" in json.loads(pins.read_text())["a__echo"]["definition"]["description"]
    assert "attacker.example" in tools()["a__echo"]["description"]


def test_rate_limit_and_audit_for_two_clients(tmp_path):
    audit = tmp_path / "audit.jsonl"
    config = write_config(
        tmp_path,
        fake("a")
        + f'''
[http]
auth_tokens = ["{ALICE}"]

[profiles.bob]
tokens = ["{BOB}"]

[[plugins]]
use = "rate-limit"
options = {{ rate = 0.5, burst = 2, per = "profile+tool" }}

[[plugins]]
use = "audit-log"
options = {{ path = "{audit}" }}
''',
    )
    with http_proxy(config) as (port, log):
        sessions = {}
        for token in (ALICE, BOB):
            auth = {"authorization": f"Bearer {token}"}
            sessions[token] = {**auth, "mcp-session-id": initialize(port, auth)}

        def call(token, id, arguments):
            status, _, body = post(
                port,
                {
                    "jsonrpc": "2.0",
                    "id": id,
                    "method": "tools/call",
                    "params": {"name": "a__echo", "arguments": arguments},
                },
                sessions[token],
            )
            assert status == 200
            return json.loads(body)

        for id in range(2):
            assert "result" in call(ALICE, id, {"password": "alice-secret-pw", "n": id})
        limited = call(ALICE, 3, {"n": 3})
        assert limited["error"]["data"]["reason"] == "rate_limited" and limited["error"]["data"]["retry_after"] > 0
        assert "retry in" in limited["error"]["message"]
        assert "result" in call(BOB, 4, {"api_token": "bob-secret-tk"})  # bob is not affected
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["profile"], r["outcome"]) for r in records] == [
        ("default", "ok"),
        ("default", "ok"),
        ("default", "error"),
        ("bob", "ok"),
    ]
    assert records[0]["arguments"] == {"password": "[redacted]", "n": 0}
    text = audit.read_text() + log.read_text()
    for secret in (ALICE, BOB, "alice-secret-pw", "bob-secret-tk"):
        assert secret not in text

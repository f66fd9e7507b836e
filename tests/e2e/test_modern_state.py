"""A modern server's ``requestState`` through ``aggregator serve --http``, in front of the
SDK 2.x server tests/e2e/modern_server.py (over stdio), spoken to with raw modern POSTs by
two bearer tokens: the caller gets the server's state wrapped in one of the proxy's, the
other token cannot finish the call with it, and the caller's own retry reaches the server
with the server's state unwrapped and completes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import TOKEN, events, http_proxy, post, write_config

pytestmark = pytest.mark.e2e

SERVER = Path(__file__).parent / "modern_server.py"
MODERN = "2026-07-28"
OTHER = f"{TOKEN}-other"


def config(tmp_path: Path) -> Path:
    body = f'''
[servers.modern]
command = "{sys.executable}"
args = ["{SERVER}"]

[http]
auth_tokens = ["{TOKEN}", "{OTHER}"]
'''
    return write_config(tmp_path, body, startup_timeout=20.0)


def ask_name(port: int, token: str, **extra: object) -> tuple[int, dict]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
    }
    params = {"name": "modern__ask_name", "arguments": {}, **extra, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "authorization": f"Bearer {token}",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "modern__ask_name",
    }
    status, _, payload = post(port, body, headers)
    [answer] = [m for m in events(payload) if m.get("id") == 1]
    return status, answer


def test_a_servers_state_is_bound_to_its_caller(tmp_path):
    with http_proxy(config(tmp_path)) as (port, log):
        status, answer = ask_name(port, TOKEN)
        assert status == 200, answer
        result = answer["result"]
        assert result["resultType"] == "input_required"
        state = result["requestState"]
        assert state.startswith("aggregator-rw2.")
        responses = {key: {"action": "accept", "content": {"name": "ada"}} for key in result["inputRequests"]}
        # Another token cannot use it.
        status, answer = ask_name(port, OTHER, requestState=state, inputResponses=responses)
        assert answer["error"]["code"] == -32602 and "another caller" in answer["error"]["message"]
        # Nor an edited copy.
        status, answer = ask_name(
            port, TOKEN, requestState=state[:-1] + ("A" if state[-1] != "A" else "B"), inputResponses=responses
        )
        assert answer["error"]["code"] == -32602
        # The caller's retry: the server verifies its own state (unwrapped) and completes.
        status, answer = ask_name(port, TOKEN, requestState=state, inputResponses=responses)
        assert status == 200, answer
        assert answer["result"]["content"][0]["text"] == "hello ada"
        assert "Traceback" not in log.read_text()

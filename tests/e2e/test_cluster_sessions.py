"""Two ``aggregator serve --http`` processes with the same ``[cluster] keys`` stand for two
replicas behind a balancer with no stickiness: the official Python SDK (2.x in legacy mode,
and 1.x) initializes on one and is served by both, through a round-robin balancer; a session
outlives a restart of its replica; keys rotate (the new one first, the old one still opens
what it sealed, then the old one removed: 404); a cursor and a requestState minted on one
replica are read by the other (a parked call held by the other one: a retryable error)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.conftest import HERE, ROOT, events, http_proxy, initialize, post, write_config
from tests.e2e.round_robin import round_robin
from tests.loopback import free_port

pytestmark = pytest.mark.e2e

SERVER = HERE / "modern_server.py"
ASKING = HERE / "sdk1_asking_server.py"
CLIENT = HERE / "cluster_client.py"
OLD = "old-cluster-key-" + "o" * 24
NEW = "new-cluster-key-" + "n" * 24
MODERN = "2026-07-28"
TOOLS = ["add", "ask_name", "bump", "cancellations", "echo", "grow", "roots", "slow", "summarize"]
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def replica(tmp_path: Path, name: str, keys: list[str], asking: Path | None = None) -> Path:
    """The config of replica ``name`` (its own directory, so its own log)."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    body = f'''
[servers.modern]
command = "{sys.executable}"
args = ["{SERVER}"]
env = {{ MODERN_SERVER_STATE_KEY = "{"s" * 32}" }}
'''
    if asking is not None:
        body += f'''
[servers.asking]
command = "{asking}"
args = ["{ASKING}"]
'''
    body += f"\n[cluster]\nkeys = {json.dumps(keys)}\nreplica = {json.dumps(name)}\n"
    return write_config(directory, body, startup_timeout=30.0, page_size=2)


def ready(port: int) -> int:
    """Wait until the replica says it is ready (``/readyz``), as a balancer's health check
    does before it sends it anything; its port."""
    deadline = time.monotonic() + 60
    while post(port, None, path="/readyz", method="GET")[0] != 200:
        assert time.monotonic() < deadline, "the replica never got ready"
        time.sleep(0.1)
    return port


def clean(log: Path) -> None:
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.parametrize("sdk", ["2.x", "1.x"])
def test_a_session_initialized_on_one_replica_is_served_by_both(tmp_path, python1, sdk):
    interpreter = sys.executable if sdk == "2.x" else str(python1)
    with (
        http_proxy(replica(tmp_path, "a", [OLD])) as (port_a, log_a),
        http_proxy(replica(tmp_path, "b", [OLD])) as (port_b, log_b),
        round_robin([ready(port_a), ready(port_b)]) as (port, balancer),
    ):
        out = subprocess.run(
            [interpreter, str(CLIENT), f"http://127.0.0.1:{port}/mcp", "3"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["version"] == "2025-11-25"
    for round_ in seen["rounds"]:
        # Five pages, each cursor sent to either replica: every tool once, in one order.
        assert sorted(round_["tools"]) == [f"modern__{name}" for name in TOOLS]
        assert round_["tools"] == seen["rounds"][0]["tools"]
        assert (round_["add"], round_["echo"], round_["prompt"]) == ("5", "héllo", "Ahoy, ada!")
        assert round_["prompts"] == ["modern__greeting"] and round_["read"] == "0"
    # initialize went to A; B served calls of the session it never saw opened.
    assert balancer.seen[0] == (0, "POST", "initialize")
    served_by_b = [rpc for index, verb, rpc in balancer.seen if index == 1 and verb == "POST" and rpc]
    assert {"tools/list", "tools/call", "prompts/get", "resources/read"} <= set(served_by_b), balancer.seen
    assert "adopted" in log_b.read_text()
    clean(log_a)
    clean(log_b)


def test_a_session_outlives_a_restart_and_keys_rotate(tmp_path):
    port_a, port_b = free_port(), free_port()
    with ExitStack() as a, ExitStack() as b:
        a.enter_context(http_proxy(replica(tmp_path, "a", [OLD]), port=port_a))
        _, log_b = b.enter_context(http_proxy(replica(tmp_path, "b", [OLD]), port=port_b))
        ready(port_a), ready(port_b)
        session = initialize(port_a)
        assert session.startswith("ag1.")
        headers = {"mcp-session-id": session}
        assert post(port_b, LIST, headers)[0] == 200
        # A restarts: the session goes on there.
        a.close()
        _, log_a = a.enter_context(http_proxy(replica(tmp_path, "a", [OLD]), port=port_a))
        status, _, body = post(ready(port_a), LIST, headers)
        assert status == 200 and len(events(body)[0]["result"]["tools"]) == 2
        # B restarts with a new key first: the old one still opens what it sealed.
        b.close()
        _, log_b = b.enter_context(http_proxy(replica(tmp_path, "b", [NEW, OLD]), port=port_b))
        assert post(ready(port_b), LIST, headers)[0] == 200
        newer = initialize(port_b)
        assert newer.split(".")[1] != session.split(".")[1]  # sealed with the new key
        assert post(port_a, LIST, {"mcp-session-id": newer})[0] == 404  # A does not have it yet
        # A restarts with the new key alone: the old key's sessions are gone, the new ones work.
        a.close()
        _, log_a = a.enter_context(http_proxy(replica(tmp_path, "a", [NEW]), port=port_a))
        status, _, body = post(ready(port_a), LIST, headers)
        assert status == 404 and b"Session not found" in body
        assert post(port_a, LIST, {"mcp-session-id": newer})[0] == 200
        clean(log_a)
        clean(log_b)


def modern(port: int, method: str, params: dict, capabilities: dict | None = None) -> dict:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {"mcp-protocol-version": MODERN, "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    status, _, payload = post(port, body, headers)
    [answer] = [m for m in events(payload) if m.get("id") == 1]
    return answer


def test_a_cursor_and_a_request_state_minted_on_one_replica_are_read_by_the_other(tmp_path, python1):
    with (
        http_proxy(replica(tmp_path, "a", [OLD], python1)) as (port_a, log_a),
        http_proxy(replica(tmp_path, "b", [OLD], python1)) as (port_b, log_b),
    ):
        ready(port_a), ready(port_b)
        # A cursor of A's pages B's list.
        first = modern(port_a, "tools/list", {})["result"]
        on_b = modern(port_b, "tools/list", {"cursor": first["nextCursor"]})["result"]
        on_a = modern(port_a, "tools/list", {"cursor": first["nextCursor"]})["result"]
        assert on_b["tools"] == on_a["tools"] and on_b["tools"][0]["name"] != first["tools"][0]["name"]
        # A modern server's state (its instances share their key), wrapped by A: unwrapped by
        # B, and the call completes there.
        asks = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}
        call = {"name": "modern__ask_name", "arguments": {}}
        asked = modern(port_a, "tools/call", call, asks)["result"]
        assert asked["resultType"] == "input_required" and asked["requestState"].startswith("aggregator-rw2.")
        responses = {key: {"action": "accept", "content": {"name": "ada"}} for key in asked["inputRequests"]}
        retry = {**call, "requestState": asked["requestState"], "inputResponses": responses}
        finished = modern(port_b, "tools/call", retry, asks)
        assert finished["result"]["content"][0]["text"] == "hello ada", finished
        # A legacy server's call parked on A: B verifies its state and says the call is A's.
        call = {"name": "asking__interview", "arguments": {"topic": "tea"}}
        parked = modern(port_a, "tools/call", call, asks)["result"]
        assert parked["resultType"] == "input_required" and parked["requestState"].startswith("aggregator-rs2.")
        responses = {key: {"action": "accept", "content": {"name": "ada"}} for key in parked["inputRequests"]}
        retry = {**call, "requestState": parked["requestState"], "inputResponses": responses}
        error = modern(port_b, "tools/call", retry, asks)["error"]
        assert error["code"] == -32603 and error["data"]["retryable"] is True and error["data"]["replica"] == "a"
        # A still holds it: the same retry there goes on (the server asks its next question).
        assert modern(port_a, "tools/call", retry, asks)["result"]["resultType"] == "input_required"
        # Forged: refused as ever, on either.
        forged = {**retry, "requestState": parked["requestState"][:-2] + "AA"}
        assert modern(port_b, "tools/call", forged, asks)["error"]["code"] == -32602
        clean(log_a)
        clean(log_b)

"""The tasks extension (``io.modelcontextprotocol/tasks``) through ``aggregator serve --http``,
in front of the SDK 2.x modern fixture (tests/conformance/modern_server.py, over stdio), spoken
to with raw modern POSTs by two bearer tokens: a task handle under the server's name, polled to
its inlined result, answered with ``tasks/update``, cancelled; another token's requests do not
find it; a caller that did not declare the extension gets -32021 and the tool runs at once."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import TOKEN, events, http_proxy, post, write_config

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).parents[1] / "conformance" / "modern_server.py"
MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
OTHER = f"{TOKEN}-other"
NAMED = {"tools/call": "name", "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        f'''
[servers.fix]
command = "{sys.executable}"
args = ["{FIXTURE}"]

[http]
auth_tokens = ["{TOKEN}", "{OTHER}"]
''',
        startup_timeout=20.0,
    )


def call(port: int, method: str, params: dict, *, token: str = TOKEN, tasks: bool = True) -> tuple[int, dict]:
    """One modern request; the HTTP status and the JSON-RPC answer."""
    capabilities = {"elicitation": {}, **({"extensions": {TASKS: {}}} if tasks else {})}
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {"authorization": f"Bearer {token}", "mcp-protocol-version": MODERN, "mcp-method": method}
    if method in NAMED:
        headers["mcp-name"] = params[NAMED[method]]
    status, _, payload = post(port, body, headers)
    [answer] = [m for m in events(payload) if m.get("id") == 1]
    return status, answer


def poll(port: int, task_id: str, until: tuple[str, ...]) -> dict:
    for _ in range(100):  # bounded: 100 polls of 0.1 s
        status, answer = call(port, "tasks/get", {"taskId": task_id})
        assert status == 200, answer
        if answer["result"]["status"] in until:
            return answer["result"]
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} never reached {until}")


def test_a_task_through_the_proxy_is_its_tokens_and_polled_to_its_result(tmp_path):
    with http_proxy(config(tmp_path)) as (port, log):
        status, answer = call(port, "server/discover", {})
        assert status == 200 and TASKS in answer["result"]["capabilities"]["extensions"], answer

        status, answer = call(port, "tools/call", {"name": "fix__slow_compute", "arguments": {"seconds": 0.3}})
        handle = answer["result"]
        assert (status, handle["resultType"]) == (200, "task"), answer
        task_id = handle["taskId"]
        assert task_id.startswith("fix/") and handle["status"] == "working"

        # Another token's requests do not find it; one without the extension is refused.
        status, answer = call(port, "tasks/get", {"taskId": task_id}, token=OTHER)
        assert (status, answer["error"]["code"]) == (400, -32602), answer
        status, answer = call(port, "tasks/get", {"taskId": task_id}, tasks=False)
        assert (status, answer["error"]["code"]) == (400, -32021), answer
        assert answer["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS: {}}}

        done = poll(port, task_id, ("completed", "failed", "cancelled"))
        assert (done["taskId"], done["status"]) == (task_id, "completed")
        assert "computed" in done["result"]["content"][0]["text"]

        # Input by tasks/update: the task asks, is answered, completes.
        _, answer = call(port, "tools/call", {"name": "fix__confirm_delete", "arguments": {"filename": "x.txt"}})
        asking = answer["result"]["taskId"]
        waiting = poll(port, asking, ("input_required",))
        [key] = waiting["inputRequests"]
        response = {"action": "accept", "content": {"confirm": True}}
        status, answer = call(port, "tasks/update", {"taskId": asking, "inputResponses": {key: response}})
        assert (status, answer["result"]["resultType"]) == (200, "complete"), answer
        done = poll(port, asking, ("completed", "failed", "cancelled"))
        assert done["status"] == "completed" and json.dumps(response) in done["result"]["content"][0]["text"]

        # Cancelled.
        _, answer = call(port, "tools/call", {"name": "fix__slow_compute", "arguments": {"seconds": 60}})
        long = answer["result"]["taskId"]
        status, answer = call(port, "tasks/cancel", {"taskId": long})
        assert (status, answer["result"]["resultType"]) == (200, "complete"), answer
        assert poll(port, long, ("cancelled",))["status"] == "cancelled"

        # Without the extension the tool runs at once; a required-task tool is -32021.
        status, answer = call(
            port, "tools/call", {"name": "fix__slow_compute", "arguments": {"seconds": 0}}, tasks=False
        )
        assert (status, answer["result"]["resultType"]) == (200, "complete"), answer
        status, answer = call(port, "tools/call", {"name": "fix__failing_job", "arguments": {}}, tasks=False)
        assert (status, answer["error"]["code"]) == (400, -32021), answer

"""Replicas of the proxy sharing ``[cluster] keys`` and a real redis-server, behind a
round-robin balancer with no stickiness: what a client sends for a call running on one
replica reaches it whichever replica the balancer picks (``fronts.http.relay``)."""

from __future__ import annotations

import base64
import http.client
import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, RedisServer, redis_server
from tests.e2e.conftest import HERE, ROOT, events, fake, http_proxy, initialize, post, write_config
from tests.e2e.round_robin import round_robin
from tests.loopback import INIT
from tests.required import missing

pytestmark = pytest.mark.e2e

CLIENT = HERE / "cluster_asking_client.py"
ASKING = HERE / "sdk1_asking_server.py"
KEY = "cluster-routing-key-" + "k" * 24


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


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with redis_server(tmp_path) as server:
        yield server


def replica(tmp_path: Path, name: str, store: str, python1: Path) -> Path:
    """The config of replica ``name`` (its own directory, so its own log), in front of the
    asking server."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    body = f'''
[servers.asking]
command = "{python1}"
args = ["{ASKING}"]

[cluster]
keys = {json.dumps([KEY])}
replica = {json.dumps(name)}
store = {json.dumps(store)}
'''
    return write_config(directory, body, startup_timeout=30.0)


def test_answers_to_a_servers_requests_reach_the_replica_whose_call_asked(tmp_path, python1, redis):
    calls = 4
    with ExitStack() as stack:
        replicas = [stack.enter_context(http_proxy(replica(tmp_path, n, redis.url, python1))) for n in ("a", "b")]
        port, balancer = stack.enter_context(round_robin([ready(p) for p, _ in replicas]))
        out = subprocess.run(
            [str(python1), str(CLIENT), f"http://127.0.0.1:{port}/mcp", str(calls)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr[-3000:] + replicas[0][1].read_text()[-2000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        for _, log in replicas:
            clean(log)
    expected = [[False, f"name=ada; sampled=SAY SOMETHING ABOUT TEA {n}; roots="] for n in range(calls)]
    assert seen["results"] == expected
    # Each request the client was asked names the replica whose call asked it.
    assert len(seen["asked"]) == 2 * calls  # roots/list: a shared server sees the proxy's roots
    assert all(type(id) is str and id.split(".")[0] in ("a", "b") for id in seen["asked"]), seen["asked"]
    # The balancer sent answers to the replica that did not ask (round robin, no stickiness).
    calls_on = [index for index, verb, rpc in balancer.seen if verb == "POST" and rpc == "tools/call"]
    answers_on = [index for index, verb, rpc in balancer.seen if verb == "POST" and rpc == ""]
    assert len(calls_on) == calls and len(answers_on) == 2 * calls
    assert {0, 1} <= set(answers_on), balancer.seen


def test_a_cancel_sent_to_another_replica_ends_the_call_where_it_runs(tmp_path, python1, redis):
    init = {
        **INIT,
        "params": {**INIT["params"], "capabilities": {"elicitation": {"form": {}}, "sampling": {}}},
    }
    with ExitStack() as stack:
        (port_a, log_a), (port_b, log_b) = [
            stack.enter_context(http_proxy(replica(tmp_path, n, redis.url, python1))) for n in ("a", "b")
        ]
        ready(port_a), ready(port_b)
        status, headers, _ = post(port_a, init)
        assert status == 200
        session = {"mcp-session-id": headers["mcp-session-id"]}
        assert post(port_b, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0] == 202
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
        call["params"] = {"name": "asking__interview", "arguments": {"topic": "tea"}}
        asked = threading.Event()

        def run_call() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port_a, timeout=20)
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", **session}
            connection.request("POST", "/mcp", body=json.dumps(call).encode(), headers=headers)
            response = connection.getresponse()
            while line := response.readline():  # until the proxy stops
                if b"elicitation/create" in line:
                    asked.set()
            connection.close()

        runs = threading.Thread(target=run_call, daemon=True)
        runs.start()
        # The call waits on A for its client's elicitation; its client cancels it through B.
        assert asked.wait(10), "the server never asked"
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "no"}}
        assert post(port_b, cancel, session)[0] == 202
        # A ended the call (its stream, which carried an event, stays open for its client to
        # close): the id is free again there, and a new call under it starts.
        deadline = time.monotonic() + 10
        while True:
            again = http.client.HTTPConnection("127.0.0.1", port_a, timeout=10)
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", **session}
            again.request("POST", "/mcp", body=json.dumps(call).encode(), headers=headers)
            status = again.getresponse().status
            again.close()
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 200, "the call went on after its client cancelled it on another replica"
        clean(log_a)
        clean(log_b)


def test_a_session_deleted_on_one_replica_is_adopted_by_none(tmp_path, python1, redis):
    tools = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    with ExitStack() as stack:
        (port_a, log_a), (port_b, log_b) = [
            stack.enter_context(http_proxy(replica(tmp_path, n, redis.url, python1))) for n in ("a", "b")
        ]
        ready(port_a), ready(port_b)
        served = {"mcp-session-id": initialize(port_a)}  # B serves it too
        unseen = {"mcp-session-id": initialize(port_a)}  # B never saw it
        assert post(port_b, tools, served)[0] == 200
        for session in (served, unseen):
            assert post(port_a, None, session, method="DELETE")[0] == 200
        # B ended the one it served when A said so; the other has a tombstone in the store.
        deadline = time.monotonic() + 5
        while post(port_b, tools, served)[0] != 404:
            assert time.monotonic() < deadline, "B still serves a session deleted on A"
            time.sleep(0.05)
        status, _, body = post(port_b, tools, unseen)
        assert status == 404 and b"Session not found" in body
        assert post(port_a, tools, unseen)[0] == 404
        assert "adopted" not in log_b.read_text().split("deleted on replica")[-1]
        clean(log_a)
        clean(log_b)


def test_a_stream_resumed_on_another_replica_gets_its_requests_retryable_error(tmp_path, python1, redis):
    init = {**INIT, "params": {**INIT["params"], "capabilities": {"elicitation": {"form": {}}, "sampling": {}}}}
    with ExitStack() as a, ExitStack() as b:
        port_a, log_a = a.enter_context(http_proxy(replica(tmp_path, "a", redis.url, python1)))
        port_b, log_b = b.enter_context(http_proxy(replica(tmp_path, "b", redis.url, python1)))
        ready(port_a), ready(port_b)
        status, headers, _ = post(port_a, init)
        session = {"mcp-session-id": headers["mcp-session-id"]}
        assert post(port_a, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0] == 202
        # A call waits on A for its client's elicitation; the client loses the stream.
        connection = http.client.HTTPConnection("127.0.0.1", port_a, timeout=10)
        call = {"jsonrpc": "2.0", "id": "call-7", "method": "tools/call"}
        call["params"] = {"name": "asking__interview", "arguments": {"topic": "tea"}}
        accept = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        connection.request("POST", "/mcp", body=json.dumps(call).encode(), headers={**accept, **session})
        response = connection.getresponse()
        last = ""
        while line := response.readline():
            if line.startswith(b"id: "):
                last = line[4:].strip().decode()
            if b"elicitation/create" in line:
                break
        connection.close()
        assert last.startswith("a.")  # the event id names the replica (and the request)
        resume = {**session, "accept": "text/event-stream", "content-type": None}

        def resumed() -> dict:
            status, _, body = post(port_b, None, {**resume, "last-event-id": last}, method="GET")
            assert status == 200, body
            [error] = events(body)
            assert error["id"] == "call-7" and error["error"]["code"] == -32603
            assert error["error"]["data"] == {
                "source": "aggregator",
                "reason": "unavailable",
                "retryable": True,
                "replica": "a",
            }
            return error

        # A is up, but its stream cannot be continued on B: the error says so.
        assert "cannot be resumed on this one ('b')" in resumed()["error"]["message"]
        # A stopped: resumed on B, the call gets its error, never silence.
        a.close()
        assert "stopped before it answered" in resumed()["error"]["message"]
        clean(log_a)
        clean(log_b)


def modern(port: int, method: str, params: dict, capabilities: dict) -> dict:
    """A 2026-07-28 request (no session) to one replica: its answer."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method, "mcp-name": params["name"]}
    status, _, payload = post(port, body, headers)
    [answer] = [m for m in events(payload) if m.get("id") == 1]
    return answer


def test_a_retry_for_a_call_parked_on_another_replica_is_served_there(tmp_path, python1, redis):
    asks = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}
    with ExitStack() as a, ExitStack() as b:
        port_a, log_a = a.enter_context(http_proxy(replica(tmp_path, "a", redis.url, python1)))
        port_b, log_b = b.enter_context(http_proxy(replica(tmp_path, "b", redis.url, python1)))
        ready(port_a), ready(port_b)
        # A legacy server's call, parked on A while it waits for its client's input; each
        # retry sent to B goes to A, and its answer comes back through B.
        call = {"name": "asking__interview", "arguments": {"topic": "tea"}}
        answer = modern(port_a, "tools/call", call, asks)["result"]
        answers = {
            "elicitation/create": {"action": "accept", "content": {"name": "ada"}},
            "sampling/createMessage": {"role": "assistant", "content": {"type": "text", "text": "hot"}, "model": "m"},
            "roots/list": {"roots": [{"uri": "file:///work/one"}]},
        }
        rounds = 0
        while answer.get("resultType") == "input_required":
            assert answer["requestState"].startswith("aggregator-rs2.") and ".a." in answer["requestState"]
            rounds += 1
            assert rounds <= 3, answer
            responses = {key: answers[asked["method"]] for key, asked in answer["inputRequests"].items()}
            retry = {**call, "requestState": answer["requestState"], "inputResponses": responses}
            answer = modern(port_b, "tools/call", retry, asks)
            assert "result" in answer, answer
            answer = answer["result"]
        assert answer["content"][0]["text"] == "name=ada; sampled=hot; roots=file:///work/one", answer
        assert rounds >= 2
        # A stopped: a retry of its call sent to B gets the retryable error, as ever.
        parked = modern(port_a, "tools/call", call, asks)["result"]
        a.close()
        responses = {key: answers[asked["method"]] for key, asked in parked["inputRequests"].items()}
        retry = {**call, "requestState": parked["requestState"], "inputResponses": responses}
        error = modern(port_b, "tools/call", retry, asks)["error"]
        assert error["code"] == -32603 and error["data"]["retryable"] is True and error["data"]["replica"] == "a"
        clean(log_a)
        clean(log_b)


def legacy_replica(tmp_path: Path, name: str, store: str) -> Path:
    """The config of replica ``name`` in front of the fake server ``a``."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    cluster = f"[cluster]\nkeys = {json.dumps([KEY])}\nreplica = {json.dumps(name)}\nstore = {json.dumps(store)}\n"
    return write_config(directory, fake("a") + cluster, startup_timeout=30.0)


def test_a_legacy_sse_sessions_posts_reach_the_replica_of_its_stream(tmp_path, redis):
    """HTTP+SSE behind round robin: the stream is on A, the POSTs land on B; each is handed
    to A, whose stream answers it, a cancel of a call running there too."""
    with ExitStack() as stack:
        (port_a, log_a), (port_b, log_b) = [
            stack.enter_context(http_proxy(legacy_replica(tmp_path, n, redis.url))) for n in ("a", "b")
        ]
        ready(port_a), ready(port_b)
        stream = http.client.HTTPConnection("127.0.0.1", port_a, timeout=20)
        stream.request("GET", "/sse", headers={"accept": "text/event-stream", "host": f"127.0.0.1:{port_a}"})
        response = stream.getresponse()
        assert response.status == 200
        seen: queue.Queue[str] = queue.Queue()

        def read() -> None:
            try:
                while line := response.readline():
                    if line.startswith(b"data: "):
                        seen.put(line[6:].decode().strip())
            except OSError:
                pass

        threading.Thread(target=read, daemon=True).start()
        endpoint = seen.get(timeout=10)
        assert endpoint.startswith("/messages?session_id=")

        def answer(id: int) -> dict:
            while True:
                message = json.loads(seen.get(timeout=10))
                if message.get("id") == id:
                    return message

        def send(message: dict) -> int:
            return post(port_b, message, path=endpoint)[0]

        assert send(INIT) == 202
        assert answer(INIT["id"])["result"]["serverInfo"]
        assert send({"jsonrpc": "2.0", "method": "notifications/initialized"}) == 202
        hang = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "a__hang", "arguments": {}}}
        assert send(hang) == 202
        time.sleep(0.5)  # the call runs on A
        busy = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "a__pid", "arguments": {}}}
        assert send(busy) == 202
        assert "error" in answer(7), "a second call under an id in flight was taken"
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "no"}}
        assert send(cancel) == 202
        # A cancelled the call: the id is free again there, and a new call under it is answered.
        deadline = time.monotonic() + 10
        while True:
            assert send(busy) == 202
            reply = answer(7)
            if "result" in reply or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "result" in reply, reply
        # An id this replica never issued, nor any other: not found, as ever.
        assert post(port_b, busy, path="/messages?session_id=nobody")[0] == 404
        # An id naming A that A does not serve (made up, or of a stream gone): A says so, 404.
        made_up = "/messages?session_id=" + base64.urlsafe_b64encode(b"a").decode().rstrip("=") + "~made-up"
        status, _, body = post(port_b, busy, path=made_up)
        assert status == 404 and b"Session not found" in body, body
        # A body that cannot be read: a parse error, not a session to open again.
        status, _, body = post(port_b, b"{not json", path=endpoint)
        assert status == 400 and json.loads(body)["error"]["code"] == -32700, body
        stream.close()
        clean(log_a)
        clean(log_b)

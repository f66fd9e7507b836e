"""Three replicas behind nginx and HAProxy, run from the shipped example configs
(``examples/cluster/``) as they are: round robin with no stickiness, the official Python
SDK 2.x client calling a tool many times, one replica SIGKILLed in the middle of it. Every
call either succeeds or ends with an error the client sees (counted and reported), never
silence; the replica killed is started again and takes its share. A replica that gets
SIGTERM leaves the rotation at once (the replicas share ``[cluster] keys``: it stops
listening, so that nginx tries another replica for a new session, and no client sees a
503), finishes what it serves and exits 0.

Needs nginx and haproxy (skipped without them; the README's test command installs them).
Every wait is bounded: the calls by count, each by its timeout, the run by its time.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.cluster_harness import Replica, balanced, fill, readiness, replicas
from tests.e2e.conftest import ROOT, fake, write_config

pytestmark = pytest.mark.e2e
CLIENT = Path(__file__).parent / "cluster_load_client.py"
CALLS = 300
CONCURRENCY = 8
KILL_AFTER = 75  # calls ended before a replica is killed


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` (0 if it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def load(url: str, calls: int, kill: Replica | None = None, mode: str = "2026-07-28", seconds: float = 60.0) -> dict:
    """Run the SDK client against ``url`` in ``mode``; SIGKILL ``kill`` once ``KILL_AFTER``
    calls ended. The client's tally, with when the kill came (``killed_at``: calls ended by then)."""
    argv = [sys.executable, str(CLIENT), url, mode, str(calls), str(CONCURRENCY), str(seconds)]
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
    killed_at = None
    tally = None
    deadline = time.monotonic() + seconds + 30
    try:
        assert client.stdout is not None
        while tally is None:
            left = deadline - time.monotonic()
            assert left > 0, "the client did not finish in time"
            readable, _, _ = select.select([client.stdout], [], [], left)
            if not readable:
                continue
            line = client.stdout.readline()
            assert line, "the client ended without a tally:\n" + (client.stderr.read() if client.stderr else "")[-3000:]
            seen = json.loads(line)
            if "done" not in seen:
                tally = seen
            elif kill is not None and killed_at is None and seen["done"] >= KILL_AFTER:
                kill.kill()
                killed_at = seen["done"]
        assert client.wait(timeout=10) == 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=5)
    tally["killed_at"] = killed_at
    return tally


def config(tmp_path: Path) -> Path:
    # One fake stdio server per replica (each its own child): its pid names the replica.
    # The same keys on every replica: a session opened on one is served by any.
    keys = f'[cluster]\nkeys = ["{"k" * 40}"]\n'
    return write_config(tmp_path, fake("a") + keys, startup_timeout=20.0, drain_timeout=5.0)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
def test_a_replica_killed_under_load_costs_at_most_its_calls_in_flight(tmp_path, balancer, mode):
    with balanced(balancer, config(tmp_path), tmp_path) as (url, backends):
        tally = load(url, CALLS, kill=backends[1], mode=mode)
        report = f"{balancer}, {mode}: {tally}"
        print(report)
        errors = sum(tally["errors"].values())
        # Every call is accounted for: none was left unanswered, none silently lost.
        assert tally["not_made"] == 0 and tally["ok"] + errors == CALLS, report
        assert tally["killed_at"] is not None, report
        # Only what the killed replica had in flight may fail; the rest went elsewhere.
        assert errors <= CONCURRENCY, report
        # Round robin: every replica served some, the killed one before it died.
        assert len(tally["pids"]) == 3, report
        assert backends[1].exit_codes == [-9]

        # Started again (same port), it takes its share once the balancer sees it.
        backends[1].start()
        deadline = time.monotonic() + 30
        while True:
            again = load(url, 60)
            served_by = {parent_of(int(pid)) for pid in again["pids"]}
            if backends[1].pid in served_by or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert backends[1].pid in served_by and again["ok"] == 60, again


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}},
}
SESSIONS_EACH = 100  # new sessions each of the drain test's four openers opens, at most
ACCEPT = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def post(url: str, message: dict, timeout: float = 10.0, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """POST one JSON-RPC message; its status, headers and body (an HTTP error status too)."""
    data = json.dumps(message).encode()
    request = urllib.request.Request(url, data=data, headers={**ACCEPT, **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def going_away(error: BaseException) -> bool:
    """Whether ``error`` is what a connection to a replica that stops listening, or exits,
    may end with: refused, or reset (a transport outcome, tried again elsewhere; never an
    HTTP status, which says what the replica decided)."""
    if isinstance(error, urllib.error.HTTPError):
        return False
    if isinstance(error, urllib.error.URLError):
        error = error.reason if isinstance(error.reason, BaseException) else error
    return isinstance(error, (ConnectionError, urllib.error.URLError))


def test_a_draining_replica_leaves_the_rotation_and_exits_0(tmp_path):
    with balanced("nginx", config(tmp_path), tmp_path) as (url, backends):
        leaving = backends[0]
        leaving.process.send_signal(15)  # SIGTERM: drain
        # The replicas share [cluster] keys: it stops listening at once (not ready to any
        # balancer), and a new session that would have come to it is refused before
        # anything was sent, so that a balancer sends it elsewhere.
        deadline = time.monotonic() + 5
        while readiness(leaving.port)[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert readiness(leaving.port)[0] == 0
        try:
            status, _, body = post(f"http://{leaving.address}/mcp", INITIALIZE, timeout=5)
        except OSError as error:
            assert going_away(error), repr(error)
        else:
            raise AssertionError(f"a draining replica took a new connection: {status} {body[:200]!r}")
        assert leaving.process.wait(timeout=15) == 0
        assert "draining: not ready" in leaving.tail(20000)
        assert "stopped listening" in leaving.tail(20000)
        # The balancer sends every call to the two left.
        tally = load(url, 60)
        assert tally["ok"] == 60 and len(tally["pids"]) == 2, tally


def test_behind_nginx_a_draining_replica_costs_no_new_session_and_finishes_its_calls(tmp_path):
    """SIGTERM one replica while new sessions keep coming through nginx: none gets 503 (or
    any error), and the call in flight on it finishes."""
    with balanced("nginx", config(tmp_path), tmp_path) as (url, backends):
        leaving = backends[0]
        direct = f"http://{leaving.address}/mcp"
        status, headers, _ = post(direct, INITIALIZE)
        assert status == 200
        session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        post(direct, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **session)
        slow = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "a__slow", "arguments": {"seconds": 2}},
        }
        in_flight: dict[str, object] = {}

        def call_slowly() -> None:
            try:
                in_flight["answer"] = post(direct, slow, timeout=15, **session)
            except OSError as error:  # reported by the assertion below
                in_flight["answer"] = error

        statuses: Counter[str] = Counter()
        stop = threading.Event()

        def open_sessions() -> None:
            # Bounded, and paced: fewer than the 256 sessions a replica takes (http.max_sessions).
            for _ in range(SESSIONS_EACH):
                if stop.is_set():
                    return
                try:
                    statuses[str(post(url, INITIALIZE)[0])] += 1
                except OSError as error:
                    statuses[type(error).__name__] += 1
                time.sleep(0.04)

        threads = [threading.Thread(target=call_slowly)] + [threading.Thread(target=open_sessions) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)  # the slow call is in flight, and new sessions are being opened
            leaving.process.send_signal(15)
            assert leaving.process.wait(timeout=15) == 0
            time.sleep(0.5)  # and some more, once it has gone
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        status, _, body = in_flight["answer"]  # type: ignore[misc]
        assert status == 200 and b"slept" in body, body
        assert set(statuses) == {"200"} and statuses["200"] >= 20, statuses
        assert "stopped listening" in leaving.tail(20000)


def test_a_draining_replica_closes_the_connections_waiting_between_requests(tmp_path):
    """A balancer's pooled connection that waits for its next request is closed at the
    drain's start (with shared keys), so that the balancer drops it and its next request
    goes to a replica that stays, instead of meeting this one as it closes. A connection
    in a request is served to its end."""
    with replicas(1, config(tmp_path), tmp_path) as (leaving,):
        pooled = socket.create_connection(("127.0.0.1", leaving.port), timeout=10)
        with pooled:
            pooled.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert pooled.recv(65536).startswith(b"HTTP/1.1 200"), "the pooled connection's first answer"
            direct = f"http://{leaving.address}/mcp"
            status, headers, _ = post(direct, INITIALIZE)
            assert status == 200
            session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
            slow = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "a__slow", "arguments": {"seconds": 4}},
            }
            answer: dict[str, object] = {}
            caller = threading.Thread(target=lambda: answer.update(reply=post(direct, slow, timeout=20, **session)))
            caller.start()
            try:
                time.sleep(0.5)  # the slow call is in flight: the drain waits for it
                signalled = time.monotonic()
                leaving.process.send_signal(15)
                pooled.settimeout(3)
                assert pooled.recv(65536) == b"", "the waiting connection was closed"
                closed_after = time.monotonic() - signalled
                assert closed_after < 2.5, closed_after
                assert leaving.process.poll() is None, "closed by the drain, not by the process ending"
            finally:
                caller.join(timeout=30)
        status, _, body = answer["reply"]  # type: ignore[misc]
        assert status == 200 and b"slept" in body, body
        assert leaving.process.wait(timeout=15) == 0


def test_the_templating_fills_the_addresses_and_nothing_else():
    template = (ROOT / "examples" / "cluster" / "nginx.conf").read_text()
    values = {"LISTEN": "127.0.0.1:1", "REPLICA_1": "127.0.0.1:2", "REPLICA_2": "127.0.0.1:3", "REPLICA_3": "a:4"}
    filled = fill(template, values)
    assert "server 127.0.0.1:2 " in filled and "listen 127.0.0.1:1;" in filled
    # nginx's own variables are left alone.
    assert "$http_host" in filled and "$proxy_add_x_forwarded_for" in filled
    with pytest.raises(AssertionError, match="unfilled"):
        fill(template, {"LISTEN": "127.0.0.1:1"})

"""Three replicas behind nginx and HAProxy, run from the shipped example configs
(``examples/cluster/``) as they are: round robin with no stickiness, the official Python
SDK 2.x client calling a tool many times, one replica SIGKILLed in the middle of it. Every
call either succeeds or ends with an error the client sees (counted and reported), never
silence; the replica killed is started again and takes its share. A replica that gets
SIGTERM leaves the rotation at once (``/readyz`` 503, new work 503 with Retry-After),
finishes what it serves and exits 0.

Needs nginx and haproxy (skipped without them; the README's test command installs them).
Every wait is bounded: the calls by count, each by its timeout, the run by its time.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.cluster_harness import Replica, balanced, fill, readiness
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


def test_a_draining_replica_leaves_the_rotation_and_exits_0(tmp_path):
    with balanced("nginx", config(tmp_path), tmp_path) as (url, backends):
        leaving = backends[0]
        leaving.process.send_signal(15)  # SIGTERM: drain
        # Not ready at once, saying why; new work is sent elsewhere (503 + Retry-After).
        deadline = time.monotonic() + 5
        while readiness(leaving.port)[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.02)
        status, body = readiness(leaving.port)
        if status == 503:  # (nothing in flight: it may have exited already)
            assert body["status"] == "draining", body
            request = urllib.request.Request(
                f"http://{leaving.address}/mcp",
                data=json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}},
                    }
                ).encode(),
                headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
            )
            try:
                urllib.request.urlopen(request, timeout=5)  # noqa: S310
                raise AssertionError("a draining replica admitted a new session")
            except urllib.error.HTTPError as refused:
                assert refused.code == 503 and refused.headers["retry-after"] == "1"
            except urllib.error.URLError:
                pass  # it exited meanwhile
        assert leaving.process.wait(timeout=15) == 0
        assert "draining: not ready" in leaving.tail(20000)
        # The balancer sends every call to the two left.
        tally = load(url, 60)
        assert tally["ok"] == 60 and len(tally["pids"]) == 2, tally


def test_the_templating_fills_the_addresses_and_nothing_else():
    template = (ROOT / "examples" / "cluster" / "nginx.conf").read_text()
    values = {"LISTEN": "127.0.0.1:1", "REPLICA_1": "127.0.0.1:2", "REPLICA_2": "127.0.0.1:3", "REPLICA_3": "a:4"}
    filled = fill(template, values)
    assert "server 127.0.0.1:2 " in filled and "listen 127.0.0.1:1;" in filled
    # nginx's own variables are left alone.
    assert "$http_host" in filled and "$proxy_add_x_forwarded_for" in filled
    with pytest.raises(AssertionError, match="unfilled"):
        fill(template, {"LISTEN": "127.0.0.1:1"})

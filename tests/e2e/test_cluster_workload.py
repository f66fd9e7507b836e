"""A mixed workload on three replicas behind nginx (``examples/cluster/nginx.conf`` as it is),
sharing ``[cluster] keys`` and a real ``redis-server`` store, in front of one
``modern_server.py`` over Streamable HTTP (tools, a subscribable resource, a prompt,
progress, a tool asking for sampling, and a result past ``max_result_tokens``).

Three official SDK clients at once (``cluster_workload_client.py``): 2.x pinned to
2026-07-28, 2.x in legacy mode, 1.x; each runs every kind of operation, round after round.
In the middle of it one replica is SIGKILLed and later another one restarted (SIGTERM, then
started again on its port). Every operation succeeds or gets an error its client may retry
(and then succeeds when sent again); no answer reaches another client (each carries a marker
of its own); every legacy session's ``Mcp-Session-Id`` still works at the end.

Bounded: a fixed number of rounds, each operation by its timeout, the run by its time.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, redis_server
from tests.e2e.cluster_harness import NGINX, Replica, modern_server, need, nginx, replicas
from tests.e2e.conftest import HERE, ROOT, post, write_config
from tests.required import missing

pytestmark = pytest.mark.e2e

CLIENT = HERE / "cluster_workload_client.py"
SERVER = HERE / "modern_server.py"
WORKERS = 2  # clients of each kind
ROUNDS = 4  # rounds of the eight operations per client
SECONDS = 150.0
KILL_AT = 30  # operations ended (of all clients) before a replica is SIGKILLed
RESTART_AT = 90  # ... before another one is restarted
PING = {"jsonrpc": "2.0", "id": 9, "method": "ping"}


def config(directory: Path, server: str, store: str) -> Path:
    body = f'''
[proxy.discovery]
max_result_tokens = 500

[servers.modern]
url = "{server}"

[cluster]
keys = ["{"w" * 40}"]
store = "{store}"
'''
    return write_config(directory, body, startup_timeout=20.0, drain_timeout=5.0)


def clients(url: str, python1: Path) -> dict[str, subprocess.Popen[str]]:
    started = {}
    for kind, interpreter in (("modern", sys.executable), ("legacy", sys.executable), ("sdk1", str(python1))):
        argv = [interpreter, str(CLIENT), url, kind, str(WORKERS), str(ROUNDS), str(SECONDS)]
        started[kind] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
    return started


def run(running: dict[str, subprocess.Popen[str]], backends: list[Replica]) -> tuple[dict[str, dict], list[str]]:
    """Read every client's progress; SIGKILL ``backends[1]`` at ``KILL_AT`` operations ended
    and restart ``backends[2]`` at ``RESTART_AT``. Each client's tally, and what was done when."""
    done = dict.fromkeys(running, 0)
    tallies: dict[str, dict] = {}
    timeline: list[str] = []
    deadline = time.monotonic() + SECONDS + 60
    streams = {process.stdout: kind for kind, process in running.items()}
    while len(tallies) < len(running):
        left = deadline - time.monotonic()
        assert left > 0, f"the clients did not finish in time: {done}"
        readable, _, _ = select.select([s for s, kind in streams.items() if kind not in tallies], [], [], left)
        for stream in readable:
            kind = streams[stream]
            line = stream.readline()
            if not line:
                error = running[kind].stderr.read()[-3000:]
                raise AssertionError(f"the {kind} client ended without a tally:\n{error}")
            seen = json.loads(line)
            if "done" not in seen:
                tallies[kind] = seen
                continue
            done[kind] = seen["done"]
            total = sum(done.values())
            if total >= KILL_AT and not any("SIGKILL" in t for t in timeline):
                backends[1].kill()
                timeline.append(f"SIGKILL {backends[1].name} at {total} operations ended")
            if total >= RESTART_AT and not any("restart" in t for t in timeline):
                code = backends[2].terminate()
                backends[2].start()
                timeline.append(f"restart {backends[2].name} (SIGTERM: exit {code}) at {total} operations ended")
    for process in running.values():
        assert process.wait(timeout=10) == 0
    return tallies, timeline


def report(tallies: dict[str, dict], timeline: list[str]) -> str:
    lines = [*timeline]
    for kind, tally in tallies.items():
        sessions = [len(s) for s in tally["sessions"]]
        lines.append(f"{kind}: reconnects {tally['reconnects']}, session ids {sessions}, HTTP {tally['statuses']}")
        for operation, outcomes in tally["counts"].items():
            lines.append(f"  {operation:<12} {json.dumps(outcomes, sort_keys=True)}")
        for what, samples in tally["samples"].items():
            lines.append(f"  e.g. {what}: {samples[0]}")
    return "\n".join(lines)


def test_a_mixed_workload_of_three_clients_survives_a_replica_killed_and_one_restarted(tmp_path, python1):
    need(NGINX)
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with ExitStack() as stack:
        store = stack.enter_context(redis_server(tmp_path))
        server = stack.enter_context(modern_server(tmp_path))
        backends = stack.enter_context(replicas(3, config(tmp_path, server, store.url), tmp_path))
        url = stack.enter_context(nginx(backends, tmp_path))
        tallies, timeline = run(clients(url, python1), backends)
        text = report(tallies, timeline)
        print("\n" + text)
        # Every legacy session still answers through the balancer, on each replica in turn.
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        lost = [
            (kind, session[:20], status)
            for kind in ("legacy", "sdk1")
            for sessions in tallies[kind]["sessions"]
            for session in sessions
            for status in [post(port, PING, {"mcp-session-id": session})[0] for _ in backends]
            if status != 200
        ]
    assert len(timeline) == 2, text
    assert not lost, f"sessions lost: {lost}\n{text}"
    for kind in ("legacy", "sdk1"):
        # One session id per connection, kept to its end; a new one only where the SDK itself
        # ended its connection after a transport error (the 1.x SDK may, on a 502), and the
        # earlier one is still served above.
        used = sum(len(sessions) for sessions in tallies[kind]["sessions"])
        assert used == WORKERS + tallies[kind]["reconnects"], text
    for kind, tally in tallies.items():
        for operation, outcomes in tally["counts"].items():
            # No answer reached another client.
            assert not outcomes.get("crossed"), f"{kind} {operation}: an answer crossed\n{text}"
            # Each failed only with an error it may retry, and then succeeded.
            assert not outcomes.get("failed"), f"{kind} {operation} failed\n{text}"
            retried = outcomes.get("retryable", 0) + outcomes.get("timeout", 0)
            assert outcomes.get("retried_ok", 0) <= retried, f"{kind} {operation}\n{text}"
            assert outcomes.get("ok", 0) + outcomes.get("retried_ok", 0) == WORKERS * ROUNDS, (
                f"{kind} {operation}\n{text}"
            )

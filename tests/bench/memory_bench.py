"""Benchmark: what floods cost the proxy in memory, with default limits.

    python -m tests.bench.memory_bench [--quick]

Each case starts a fresh ``aggregator serve`` (stdio or HTTP) in front of
``tests/fakesrv.py``, waits until it is idle, then floods it the way a careless client or
server would, and reports how much the proxy's peak RSS (``VmHWM``) grew over its RSS
before the flood. The target is at most 48 MB per case. Loopback only; every wait is
bounded in time. ``--quick`` runs smaller floods (a smoke run).

Cases:
- prompt reader (stdio, HTTP): a server sends N log notifications during one call; the
  client reads them as they come and gets its answer.
- stopped reader (stdio, HTTP GET stream): the same flood to a client that reads nothing
  (over HTTP: lines of no request, which reach the GET stream of a session that asked for
  logs); it is dropped once more than ``proxy.client_buffer_bytes`` wait for it.
- idle HTTP sessions: 50 sessions that asked for logs but have no GET stream, while 1,000
  log lines of 100 bytes that belong to no request reach them all (each session keeps a
  bounded backlog).
- stalled HTTP GET streams: 50 sessions that asked for logs open a GET stream and never
  read it while N log lines of 100 bytes of no request reach them all; each stays under
  its own budget, together they pass ``proxy.total_client_buffer_bytes``, so those that
  have read nothing for a moment are dropped, the longest stalled first; another session
  reads its POST stream and gets its answer.
- roots spam: a client sends ``notifications/roots/list_changed`` without end to a server
  that reads nothing (blocked in a call); the server is told once until it asks for the
  roots again, so nothing piles up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.loopback import free_port, wait_listening

ROOT = Path(__file__).parents[2]
FAKESRV = ROOT / "tests" / "fakesrv.py"
LIMIT_MB = 48
# Fifty clients that each stay under their own budget are bounded by the total of all
# clients (proxy.total_client_buffer_bytes, 32 MiB): RSS grows by about 2.5 times it, since
# stalled clients fill for half a second before they count as stopped.
STALLED_LIMIT_MB = 96
CASE_TIME_LIMIT = 120.0
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"roots": {"listChanged": True}},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}


def memory_of(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def write_config(directory: Path) -> Path:
    path = directory / "aggregator.toml"
    path.write_text(f"""[proxy]
startup_timeout = 10.0

[servers.a]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(FAKESRV))}]
""")
    return path


class Proxy:
    """The proxy as a process; ``peak`` keeps the highest VmHWM seen while it ran."""

    def __init__(self, directory: Path, front: str) -> None:
        self.log = open(directory / f"proxy-{front}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.port = free_port()
        argv = [sys.executable, "-m", "aggregator", "serve", "--config", str(write_config(directory))]
        argv += ["--stdio"] if front == "stdio" else ["--http", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT)
        self.peak = 0
        self.before = 0  # RSS once idle, before the flood
        self._watching = True
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while self._watching and self.process.poll() is None:
            self.peak = max(self.peak, memory_of(self.process.pid).get("VmHWM", 0))
            time.sleep(0.02)

    def rss(self) -> int:
        return memory_of(self.process.pid)["VmRSS"]

    def settle(self) -> int:
        """Wait until RSS stops moving (startup done); return it."""
        last, deadline = 0, time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = self.rss()
            if abs(now - last) < 256 * 1024:
                return now
            last = now
        return last

    def quiet(self) -> None:
        """Wait until the proxy uses no CPU for a moment (it has handled what it was sent)."""
        last, deadline = -1, time.monotonic() + CASE_TIME_LIMIT
        while time.monotonic() < deadline:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            if ticks == last:
                return
            last = ticks
            time.sleep(0.3)

    def stop(self) -> None:
        self._watching = False
        self._watcher.join(timeout=2)
        self.peak = max(self.peak, memory_of(self.process.pid).get("VmHWM", 0))
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


# --- stdio ----------------------------------------------------------------------------------


def stdio_send(proxy: Proxy, message: dict) -> None:
    proxy.process.stdin.write(json.dumps(message).encode() + b"\n")
    proxy.process.stdin.flush()


def stdio_read_until(proxy: Proxy, id: int) -> tuple[dict, int]:
    """Read promptly (big reads) until the answer to ``id``; return it and the lines seen."""
    fd = proxy.process.stdout.fileno()
    buffer, lines, marker = b"", 0, b'"id":%d,' % id
    deadline = time.monotonic() + CASE_TIME_LIMIT
    while time.monotonic() < deadline:
        data = os.read(fd, 1 << 20)
        if not data:
            raise RuntimeError("the proxy closed its stdout")
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        lines += len(complete)
        for line in complete:
            if marker in line[:40]:
                return json.loads(line), lines
    raise RuntimeError(f"no answer to {id} within {CASE_TIME_LIMIT}s")


def stdio_initialize(proxy: Proxy) -> None:
    stdio_send(proxy, {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-06-18"}})
    stdio_read_until(proxy, 1)
    stdio_send(proxy, {"jsonrpc": "2.0", "method": "notifications/initialized"})


def flood(id: int, count: int, size: int = 0, after: bool = False) -> dict:
    """A call that makes the server log ``count`` lines: during the call (they belong to it
    and go to its caller only) or, with ``after``, after its answer (they belong to no
    request and go to every session that asked for logs with logging/setLevel)."""
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "a__flood", "arguments": {"count": count, "size": size, "after": after}},
    }


def case_prompt_stdio(proxy: Proxy, n: int) -> str:
    stdio_initialize(proxy)
    proxy.before = proxy.settle()
    stdio_send(proxy, flood(2, n))
    answer, lines = stdio_read_until(proxy, 2)
    assert answer["result"]["content"][0]["text"] == "flooded", answer
    return f"answered after {lines - 1:,} notifications"


def case_stopped_stdio(proxy: Proxy, n: int) -> str:
    stdio_initialize(proxy)
    proxy.before = proxy.settle()
    stdio_send(proxy, flood(2, n))
    # Read nothing more; the proxy drops this client (and, its only front, exits).
    try:
        proxy.process.wait(timeout=CASE_TIME_LIMIT)
    except subprocess.TimeoutExpired:
        return "still connected (not dropped)"
    return "dropped"


def case_roots_spam(proxy: Proxy, n: int) -> str:
    stdio_initialize(proxy)
    proxy.before = proxy.settle()
    stdio_send(
        proxy,
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "a__slow", "arguments": {"seconds": 60}},
        },
    )
    chunk = json.dumps({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}).encode() + b"\n"
    for _ in range(n // 1000):
        proxy.process.stdin.write(chunk * 1000)
    proxy.process.stdin.flush()
    stdio_send(proxy, {"jsonrpc": "2.0", "id": 3, "method": "ping"})
    answer, _ = stdio_read_until(proxy, 3)
    assert answer["result"] == {}, answer
    return f"{n:,} sent; ping answered"


# --- HTTP -----------------------------------------------------------------------------------


def http_request(port: int, body: dict, session: str | None = None) -> tuple[int, dict, bytes]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CASE_TIME_LIMIT)
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "host": f"127.0.0.1:{port}",
    }
    if session:
        headers["mcp-session-id"] = session
    connection.request("POST", "/mcp", body=json.dumps(body), headers=headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def http_initialize(port: int, wants_logs: bool = False) -> str:
    status, headers, body = http_request(port, INIT)
    assert status == 200, body
    session = headers["mcp-session-id"]
    if wants_logs:  # lines of no request go only to sessions that asked for logs
        status, _, body = http_request(
            port, {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}}, session
        )
        assert status == 200 and b'"result"' in body, body
    return session


def http_broadcast(proxy: Proxy, caller: str, id: int, count: int, size: int = 0) -> None:
    """Make the server log ``count`` lines of no request, and return once the proxy has
    routed them all. (Not by a second call to the server: while a call of one session is
    in flight on a shared stdio server, its lines are taken as that session's.)"""
    status, _, body = http_request(proxy.port, flood(id, count, size, after=True), caller)
    assert status == 200 and b'"text":"flooded"' in body, body[-300:]
    proxy.quiet()


def case_prompt_http(proxy: Proxy, n: int) -> str:
    wait_listening(proxy.port, seconds=30)
    session = http_initialize(proxy.port)
    proxy.before = proxy.settle()
    status, _, body = http_request(proxy.port, flood(2, n), session)
    assert status == 200 and b'"text":"flooded"' in body, body[-300:]
    return f"answered after {body.count(b'data: {') - 1:,} notifications"


def case_stopped_http(proxy: Proxy, n: int) -> str:
    wait_listening(proxy.port, seconds=30)
    stopped = http_initialize(proxy.port, wants_logs=True)
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nAccept: text/event-stream\r\n"
            f"Mcp-Session-Id: {stopped}\r\n\r\n".encode()
        )
        prompt = http_initialize(proxy.port)
        proxy.before = proxy.settle()
        http_broadcast(proxy, prompt, 2, n)
        gone = http_request(proxy.port, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, stopped)[0] == 404
    return "dropped; the prompt session got its answer" if gone else "not dropped"


def case_idle_sessions(proxy: Proxy, n: int) -> str:
    wait_listening(proxy.port, seconds=30)
    for _ in range(50):
        http_initialize(proxy.port, wants_logs=True)
    caller = http_initialize(proxy.port)
    proxy.before = proxy.settle()
    http_broadcast(proxy, caller, 2, n, size=100)
    return f"{n:,} lines to 50 sessions"


def case_stalled_get_streams(proxy: Proxy, n: int) -> str:
    wait_listening(proxy.port, seconds=30)
    sessions = [http_initialize(proxy.port, wants_logs=True) for _ in range(50)]
    sockets = []
    try:
        for session in sessions:
            sock = socket.create_connection(("127.0.0.1", proxy.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nAccept: text/event-stream\r\n"
                f"Mcp-Session-Id: {session}\r\n\r\n".encode()
            )
            sockets.append(sock)
        caller = http_initialize(proxy.port)
        proxy.before = proxy.settle()
        for id in range(2, 2 + 2 * (n // 5000), 2):
            http_broadcast(proxy, caller, id, 5000, size=100)
        gone = sum(
            http_request(proxy.port, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, session)[0] == 404
            for session in sessions
        )
    finally:
        for sock in sockets:
            sock.close()
    return f"{gone} of 50 dropped; the caller answered" if gone else "not dropped"


CASES: list[tuple[str, str, Callable[[Proxy, int], str], int, int]] = [
    # name, front, run, messages (full), messages (--quick)
    ("prompt reader, stdio: N log notifications", "stdio", case_prompt_stdio, 100_000, 20_000),
    ("prompt reader, HTTP POST stream: N", "http", case_prompt_http, 100_000, 20_000),
    ("stopped reader, stdio: N", "stdio", case_stopped_stdio, 200_000, 150_000),
    ("stopped reader, HTTP GET stream: N", "http", case_stopped_http, 200_000, 150_000),
    ("50 idle HTTP sessions: N broadcast lines of 100 B", "http", case_idle_sessions, 1_000, 1_000),
    ("50 stalled HTTP GET streams: N broadcast lines of 100 B", "http", case_stalled_get_streams, 100_000, 50_000),
    ("roots/list_changed spam, server not reading: N", "stdio", case_roots_spam, 1_000_000, 200_000),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller floods (a smoke run)")
    args = parser.parse_args()
    failed = 0
    print(f"{'case':58} {'RSS before':>11} {'peak growth':>12}  outcome", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, front, run, full, quick in CASES:
            proxy = Proxy(Path(tmp), front)
            count = quick if args.quick else full
            name = name.replace("N", f"{count:,}")
            try:
                outcome = run(proxy, count)
            except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
                outcome = f"FAILED: {exc!r}"[:200]
            finally:
                proxy.stop()
            growth = (proxy.peak - proxy.before) / 1e6
            limit = STALLED_LIMIT_MB if run is case_stalled_get_streams else LIMIT_MB
            ok = growth <= limit and not outcome.startswith(("FAILED", "not", "still"))
            failed += not ok
            print(
                f"{name:58} {proxy.before / 1e6:9.1f}MB {growth:10.1f}MB  {outcome}{'' if ok else '  <-- over'}",
                flush=True,
            )
    print(f"target: peak growth <= {LIMIT_MB} MB per case ({STALLED_LIMIT_MB} MB for the 50 stalled GET streams)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

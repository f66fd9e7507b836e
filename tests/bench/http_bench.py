"""Benchmark: tools/call over Streamable HTTP, through the proxy and direct, in one run.

    python -m tests.bench.http_bench [--quick]

Direct: the echo server's own HTTP front (``http_echo_server``). Through the proxy:
``aggregator serve --http`` in front of the same echo server over stdio. A small driver
on raw sockets (keep-alive, one request per connection at a time) measures the median
latency at 1 in flight and the throughput at 16 in flight (16 connections), medians of
interleaved runs; then what 200 idle sessions cost the proxy in memory. Then the
protocol-era row: proxy CPU per ``tools/call`` for a legacy session against modern
(2026-07-28) stateless calls (each a POST without a session, with its ``_meta`` envelope
and the MCP-Protocol-Version, Mcp-Method and Mcp-Name headers), against one proxy in front
of the fast (batched) echo server, interleaved (``--era`` runs that row alone). Every loop
is bounded in count and time.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tests.bench.stdio_bench import envelope_parse_us
from tests.loopback import free_port, wait_listening

ROOT = Path(__file__).parents[2]
TIME_LIMIT = 20.0


class Connection:
    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def request_bytes(self, body: bytes, session: str | None) -> bytes:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
        )
        if session == MODERN:
            head += MODERN_HEADERS
        elif session:
            head += f"Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        return head.encode() + b"\r\n" + body

    def try_response(self) -> tuple[dict[str, str], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end == -1:
            return None
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return None
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        return headers, body

    def call(self, body: bytes, session: str | None) -> tuple[dict[str, str], bytes]:
        self.sock.sendall(self.request_bytes(body, session))
        while True:
            response = self.try_response()
            if response is not None:
                return response
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("connection closed")
            self.buffer += data


INIT = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
)


# In place of a session id: the call is a modern (2026-07-28) stateless one, a POST with no
# session whose body carries the `_meta` envelope and whose headers mirror the body.
MODERN = "modern"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}
MODERN_HEADERS = "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: s0__tool0\r\n"


def call_body(tool: str, id: int, session: str | None = None) -> bytes:
    params: dict = {"name": tool, "arguments": {"x": "hello"}}
    if session == MODERN:
        params["_meta"] = MODERN_META
    return orjson.dumps({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})


def open_session(port: int) -> str:
    headers, _ = Connection(port).call(INIT, None)
    return headers["mcp-session-id"]


def latency_ms(port: int, session: str, tool: str, count: int) -> float:
    connection = Connection(port)
    samples = []
    deadline = time.monotonic() + TIME_LIMIT
    for i in range(count):
        start = time.perf_counter()
        _, body = connection.call(call_body(tool, i, session), session)
        samples.append(time.perf_counter() - start)
        assert b'"result"' in body, body
        if time.monotonic() > deadline:
            break
    return statistics.median(samples) * 1000


def throughput(port: int, session: str, tool: str, count: int, in_flight: int = 16, counted: bool = False):
    """Calls per second with `in_flight` connections; with `counted`, (rate, calls done)."""
    selector = selectors.DefaultSelector()
    connections = [Connection(port) for _ in range(in_flight)]
    sent = done = 0
    deadline = time.monotonic() + TIME_LIMIT
    start = time.perf_counter()
    for connection in connections:
        connection.sock.setblocking(False)
        selector.register(connection.sock, selectors.EVENT_READ, connection)
        connection.sock.send(connection.request_bytes(call_body(tool, sent, session), session))
        sent += 1
    while done < sent:
        for key, _ in selector.select(timeout=5):
            connection = key.data
            connection.buffer += connection.sock.recv(65536)
            while (response := connection.try_response()) is not None:
                assert b'"result"' in response[1], response
                done += 1
                if sent < count and time.monotonic() < deadline:
                    connection.sock.send(connection.request_bytes(call_body(tool, sent, session), session))
                    sent += 1
    elapsed = time.perf_counter() - start
    for connection in connections:
        selector.unregister(connection.sock)
        connection.sock.close()
    return (done / elapsed, done) if counted else done / elapsed


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_ns(pid: int) -> int:
    """CPU time of all of a process's threads, in ns (``schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total


def start_proxy(config: Path, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)]
    return subprocess.Popen([*argv, "--log-level", "warning"], cwd=ROOT, stdin=subprocess.DEVNULL)


def era_cost(directory: Path, n_calls: int, repeats: int) -> dict:
    """Proxy CPU per tools/call, 16 in flight, one proxy in front of the fast echo server:
    a legacy session's calls and modern stateless calls, interleaved (alternating which
    goes first). Returns the per-repeat figures (µs) and their ratios."""
    config = directory / "era.toml"
    config.write_text(
        f'[proxy]\nmax_in_flight_per_session = 256\n[servers.s0]\ncommand = "{sys.executable}"\n'
        f'args = ["-m", "tests.bench.echo_server", "--batched"]\ncwd = "{ROOT}"\n'
    )
    port = free_port()
    proxy = start_proxy(config, port)
    cpu: dict[str, list[float]] = {"legacy": [], "modern": []}
    ratios = []
    try:
        wait_listening(port, seconds=30)
        sessions = {"legacy": open_session(port), "modern": MODERN}
        _, answer = Connection(port).call(call_body("s0__tool0", 1, MODERN), MODERN)
        assert orjson.loads(answer)["result"]["resultType"] == "complete", answer
        for session in sessions.values():
            throughput(port, session, "s0__tool0", 2000)  # warm up
        for i in range(repeats):
            order = list(sessions.items())
            for name, session in order if i % 2 == 0 else order[::-1]:
                before = cpu_ns(proxy.pid)
                _, calls = throughput(port, session, "s0__tool0", n_calls, counted=True)
                cpu[name].append((cpu_ns(proxy.pid) - before) / calls / 1e3)
            ratios.append(cpu["modern"][-1] / cpu["legacy"][-1])
    finally:
        proxy.terminate()
        proxy.wait(timeout=15)
    return {"cpu": cpu, "ratios": ratios}


def print_era(era: dict) -> None:
    legacy, modern = statistics.median(era["cpu"]["legacy"]), statistics.median(era["cpu"]["modern"])
    ratios = era["ratios"]
    ratio = statistics.median(ratios)
    print(
        f"proxy CPU per tools/call, 16 in flight: legacy session {legacy:.1f} us, modern stateless "
        f"{modern:.1f} us, modern/legacy {ratio:.3f}x (spread {min(ratios):.3f}-{max(ratios):.3f} over "
        f"{len(ratios)} runs)   target <= 1.02x {'ok' if ratio <= 1.02 else 'MISSED'}"
    )
    print(f"  of the difference, reading the longer body (its _meta envelope): {envelope_parse_us():.2f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--era", action="store_true", help="only the modern/legacy CPU row (more repeats)")
    args = parser.parse_args()
    n_latency, n_calls, repeats = (300, 2000, 1) if args.quick else (2000, 20000, 5)
    if args.era:
        repeats = 3 if args.quick else 11
        print(f"{os.cpu_count()} cores, median of {repeats} interleaved runs")
        with tempfile.TemporaryDirectory() as tmp:
            print_era(era_cost(Path(tmp), n_calls, repeats))
        return 0
    direct_port, proxy_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        config.write_text(
            f'[proxy]\nmax_in_flight_per_session = 256\n[servers.s0]\ncommand = "{sys.executable}"\n'
            f'args = ["-m", "tests.bench.echo_server"]\ncwd = "{ROOT}"\n'
        )
        direct = subprocess.Popen([sys.executable, "-m", "tests.bench.http_echo_server", str(direct_port)], cwd=ROOT)
        proxy = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator",
                "serve",
                "--http",
                f"127.0.0.1:{proxy_port}",
                "--config",
                str(config),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_listening(direct_port, seconds=30)
            wait_listening(proxy_port, seconds=30)
            sessions = {"direct": open_session(direct_port), "proxy": open_session(proxy_port)}
            targets = {"direct": (direct_port, "tool0"), "proxy": (proxy_port, "s0__tool0")}
            latency = {k: [] for k in targets}
            rate = {k: [] for k in targets}
            for name, (port, tool) in targets.items():
                latency_ms(port, sessions[name], tool, 200)  # warm up
            for _ in range(repeats):
                for name, (port, tool) in targets.items():
                    latency[name].append(latency_ms(port, sessions[name], tool, n_latency))
                    rate[name].append(throughput(port, sessions[name], tool, n_calls))
            before = rss_mb(proxy.pid)
            for _ in range(200):
                open_session(proxy_port)
            idle_cost = rss_mb(proxy.pid) - before
        finally:
            for process in (direct, proxy):
                process.terminate()
                process.wait(timeout=15)
    lat = {k: statistics.median(v) for k, v in latency.items()}
    thr = {k: statistics.median(v) for k, v in rate.items()}
    added = lat["proxy"] - lat["direct"]
    ratio = thr["proxy"] / thr["direct"]
    print(f"{os.cpu_count()} cores, median of {repeats} interleaved runs")
    print(
        f"median latency, 1 in flight: direct {lat['direct']:.3f} ms, proxy {lat['proxy']:.3f} ms, "
        f"added {added:.3f} ms   target <= 0.15 ms {'ok' if added <= 0.15 else 'MISSED'}"
    )
    print(
        f"throughput, 16 in flight: direct {thr['direct']:,.0f}/s, proxy {thr['proxy']:,.0f}/s, "
        f"{ratio:.2f}x   target >= 0.25x {'ok' if ratio >= 0.25 else 'MISSED'}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        print_era(era_cost(Path(tmp), n_calls, repeats))
    print(f"200 idle sessions: +{idle_cost:.1f} MB   target <= 20 MB {'ok' if idle_cost <= 20 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: time to ready and memory with many servers, all eager against all lazy.

    python -m tests.bench.lazy_bench [--quick] [--servers N] [--runs N]

One run: ``aggregator serve --http`` on 127.0.0.1 with N servers (50 by default; the
fast in-repo ``tests/fakesrv.py``, a Python process each), configured all ``start =
"eager"`` and all ``start = "lazy"``, interleaved, each case ``--runs`` times (medians).
A first eager run fills the listing cache (every server lists once), so the lazy runs
start none. Measured for each: seconds from spawning the proxy to ``/readyz`` answering
200, the proxy's own RSS then, and the RSS of the proxy and every process under it
(the servers). Then, in the lazy case, the latency of the first ``tools/call`` to one
server (it starts it) against the next one. Every wait is bounded in time; every process
it starts is stopped.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.loopback import INIT, free_port, wait_listening

ROOT = Path(__file__).parents[2]
FAKESRV = ROOT / "tests" / "fakesrv.py"
READY_LIMIT = 120.0  # seconds a proxy may take to be ready before the case fails


def write_config(directory: Path, servers: int, start: str, cache: Path) -> Path:
    lines = [
        "[proxy]",
        f'start = "{start}"',
        f'cache_dir = "{cache}"',
        "startup_timeout = 100.0",
        "page_size = 10000",
    ]
    for n in range(servers):
        lines += [f"[servers.s{n}]", f'command = "{sys.executable}"', f'args = ["{FAKESRV}"]']
    path = directory / f"{start}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on (from /proc)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 10_000:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def request(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    sent = {"host": f"127.0.0.1:{port}", "accept": "application/json, text/event-stream", **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["content-type"] = "application/json"
    connection.request(method, path, body=data, headers=sent)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, payload


def ready_status(port: int) -> int:
    try:
        return request(port, "GET", "/readyz")[0]
    except OSError:
        return 0


def one_run(config: Path, call: bool = False) -> dict[str, float]:
    """Start the proxy on ``config``; how long until ready, and its memory then. ``call``:
    also time a first call to one server and the next."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        argv = [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_listening(port, process, seconds=READY_LIMIT)
            deadline = started + READY_LIMIT
            while ready_status(port) != 200:
                assert time.monotonic() < deadline, "not ready in time"
                time.sleep(0.01)
            out = {"ready": time.monotonic() - started}
            time.sleep(0.5)  # let the servers that start settle before memory is read
            everyone = [process.pid, *descendants(process.pid)]
            out["proxy_rss"] = rss(process.pid) / 1e6
            out["total_rss"] = sum(rss(pid) for pid in everyone) / 1e6
            out["processes"] = len(everyone)
            if call:
                out.update(first_calls(port))
            return out
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def first_calls(port: int) -> dict[str, float]:
    _, headers, _ = request(port, "POST", "/mcp", INIT)
    session = {"mcp-session-id": headers["mcp-session-id"]}
    times = []
    for id in (2, 3):
        call = {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "s1__echo", "arguments": {}}}
        began = time.monotonic()
        status, _, body = request(port, "POST", "/mcp", call, session)
        assert status == 200 and b'"result"' in body, body[:300]
        times.append(time.monotonic() - began)
    return {"first_call": times[0], "next_call": times[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 servers, one run each")
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    servers, runs = (10, 1) if args.quick else (args.servers, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        cache = directory / "cache"
        eager = write_config(directory, servers, "eager", cache)
        lazy = write_config(directory, servers, "lazy", cache)
        one_run(eager)  # fills the cache: every server lists once
        assert len(list(cache.glob("*.json"))) == servers, "the cache was not filled"
        results: dict[str, list[dict[str, float]]] = {"eager": [], "lazy": []}
        for _ in range(runs):
            results["eager"].append(one_run(eager))
            results["lazy"].append(one_run(lazy, call=True))
    print(f"{servers} servers (tests/fakesrv.py), medians of {runs} run(s):")
    print(f"{'':<8} {'ready':>9} {'proxy RSS':>10} {'total RSS':>10} {'processes':>9}")
    for mode, rows in results.items():

        def median(key: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(row[key] for row in rows)

        print(
            f"{mode:<8} {median('ready'):>8.2f}s {median('proxy_rss'):>8.1f}MB"
            f" {median('total_rss'):>8.1f}MB {median('processes'):>9.0f}"
        )
    lazy_rows = results["lazy"]
    first = statistics.median(row["first_call"] for row in lazy_rows)
    following = statistics.median(row["next_call"] for row in lazy_rows)
    print(f"lazy: first call to a server (starts it) {first * 1000:.0f} ms, the next {following * 1000:.1f} ms")


if __name__ == "__main__":
    main()

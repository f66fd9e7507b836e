"""Benchmark: the network fronts and the HTTP upstream leg, against fast direct servers, in one run.

    python -m tests.bench.http_bench [--quick] [--against TREE] [--era | --leg]

The direct baseline is ``fast_http_echo``: the echo server behind a plain asyncio HTTP/1.1
front parsed by httptools, with no framework; a slow baseline would flatter any proxy.
In one run, interleaved and repeated (medians reported), one driver on raw keep-alive
sockets (``http_load``) measures:

- the HTTP front: that fast server directly, against ``aggregator serve --http`` in front
  of the same echo server over stdio (the batched one: it costs the proxy least);
- the floor under any trio proxy (``trio_floor``): trio and httptools answering each call,
  and forwarding it to the batched echo server over stdio, nothing else;
- the HTTP upstream leg: the fast server directly, against the proxy's HTTP front in front
  of it as a Streamable HTTP upstream; and the proxy's CPU per call for the leg alone:
  ``aggregator serve --stdio`` driven over stdio with the HTTP upstream, against the same
  with the stdio upstream;
- the WebSocket front and the legacy HTTP+SSE transport, through the same proxy;
- with ``--against TREE`` (another checkout of this project, for example the last
  release): every front of the proxy built from TREE too, in the same run.

For each: median and p99 latency at 1 in flight, calls per second at 1 and at 16 in flight
(16 connections), and the proxy's CPU per call at 16 in flight (``schedstat`` of all its
threads). Then the proxy's RSS. ``--era`` measures only the protocol-era row: proxy CPU per
``tools/call`` for a legacy session against modern (2026-07-28) stateless calls; ``--leg``
only the HTTP upstream leg's CPU rows (with ``--against``, that tree's leg too).
Every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from tests.bench import http_load as load
from tests.bench.stdio_bench import Peer, envelope_parse_us
from tests.bench.stdio_bench import throughput as stdio_throughput
from tests.loopback import free_port, wait_listening

ROOT = Path(__file__).parents[2]
FRONT = 4  # the proxy's HTTP front, in the targets of run_fronts


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


def upstream_config(directory: Path, name: str, http_url: str | None = None) -> Path:
    """A proxy config with one server: the batched echo server over stdio, or ``http_url``."""
    config = directory / f"{name}.toml"
    args = '["-m", "tests.bench.echo_server", "--batched"]'
    server = f'url = "{http_url}"' if http_url else f'command = "{sys.executable}"\nargs = {args}\ncwd = "{ROOT}"'
    config.write_text(f"[proxy]\nmax_in_flight_per_session = 256\n[servers.s0]\n{server}\n")
    return config


def start_proxy(config: Path, port: int, ws_port: int | None = None, tree: Path = ROOT) -> subprocess.Popen:
    argv = [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)]
    if ws_port is not None:
        argv += ["--ws", f"127.0.0.1:{ws_port}"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen([*argv, "--log-level", "warning"], cwd=tree, stdin=subprocess.DEVNULL, env=env)


class Target:
    """One thing driven: a server directly, or the proxy over one of its fronts."""

    def __init__(self, name: str, process: subprocess.Popen, port: int, tool: str, kind: str = "http") -> None:
        self.name, self.process, self.port, self.tool, self.kind = name, process, port, tool, kind
        self.session: str | None = None
        self.samples: list[float] = []
        self.rates: list[float] = []
        self.cpu: list[float] = []

    def ready(self) -> None:
        wait_listening(self.port, seconds=30)
        if self.kind == "http":
            self.session = load.open_session(self.port)

    def measure(self, n_latency: int, n_calls: int) -> None:
        if self.kind == "http":
            self.samples += load.http_latencies(self.port, self.session, self.tool, n_latency)
        before = cpu_ns(self.process.pid)
        if self.kind == "http":
            rate, calls = load.http_throughput(self.port, self.session, self.tool, n_calls)
        elif self.kind == "ws":
            rate, calls = load.ws_throughput(self.port, self.tool, n_calls)
        else:
            rate, calls = load.sse_throughput(self.port, self.tool, n_calls)
        self.cpu.append((cpu_ns(self.process.pid) - before) / calls / 1e3)
        self.rates.append(rate)

    def p(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@contextlib.contextmanager
def processes() -> Iterator[Callable[[subprocess.Popen], subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    try:
        yield lambda process: started.append(process) or process
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_fronts(directory: Path, against: Path | None, n_latency: int, n_calls: int, repeats: int) -> list[Target]:
    with processes() as keep:
        fast_port = free_port()
        fast = keep(subprocess.Popen([sys.executable, "-m", "tests.bench.fast_http_echo", str(fast_port)], cwd=ROOT))
        targets = [Target("direct (asyncio + httptools)", fast, fast_port, "tool0")]
        plain_port = free_port()
        argv = [sys.executable, "-m", "tests.bench.fast_http_echo", str(plain_port), "--streams"]
        targets.append(
            Target("direct (plain asyncio streams)", keep(subprocess.Popen(argv, cwd=ROOT)), plain_port, "tool0")
        )
        floors = (("floor: trio + httptools, answering", []), ("floor: trio + httptools, to stdio", ["--forward"]))
        for label, extra in floors:
            floor_port = free_port()
            argv = [sys.executable, "-m", "tests.bench.trio_floor", str(floor_port), *extra]
            targets.append(Target(label, keep(subprocess.Popen(argv, cwd=ROOT)), floor_port, "tool0"))
        trees = [("proxy", ROOT)] + ([(f"proxy from {against}", against)] if against else [])
        stdio_up = upstream_config(directory, "front")
        for label, tree in trees:
            port, ws_port = free_port(), free_port()
            proxy = keep(start_proxy(stdio_up, port, ws_port, tree))
            targets.append(Target(f"{label}: HTTP front", proxy, port, "s0__tool0"))
            targets.append(Target(f"{label}: WebSocket front", proxy, ws_port, "s0__tool0", "ws"))
            targets.append(Target(f"{label}: legacy SSE front", proxy, port, "s0__tool0", "sse"))
        http_up = upstream_config(directory, "leg", http_url=f"http://127.0.0.1:{fast_port}/mcp")
        port = free_port()
        targets.append(Target("proxy: HTTP front, HTTP upstream", keep(start_proxy(http_up, port)), port, "s0__tool0"))
        for target in targets:
            target.ready()
        for target in targets:
            target.measure(200, 2000)  # warm up
            target.samples.clear(), target.rates.clear(), target.cpu.clear()
        for i in range(repeats):
            for target in targets if i % 2 == 0 else targets[::-1]:
                target.measure(n_latency, n_calls)
        front = targets[FRONT]
        front.rss = rss_mb(front.process.pid)  # type: ignore[attr-defined]
        for _ in range(200):
            load.open_session(front.port)
        front.idle_cost = rss_mb(front.process.pid) - front.rss  # type: ignore[attr-defined]
    return targets


def run_leg(directory: Path, n_calls: int, repeats: int, against: Path | None = None) -> dict[str, list[float]]:
    """Proxy CPU per call over stdio (16 in flight) with the HTTP upstream and with the stdio
    one (and with the HTTP upstream, the proxy of ``against``)."""
    with processes() as keep:
        fast_port = free_port()
        keep(subprocess.Popen([sys.executable, "-m", "tests.bench.fast_http_echo", str(fast_port)], cwd=ROOT))
        wait_listening(fast_port, seconds=30)
        configs = {
            "HTTP upstream": upstream_config(directory, "leg-http", http_url=f"http://127.0.0.1:{fast_port}/mcp"),
            "stdio upstream": upstream_config(directory, "leg-stdio"),
        }
        runs = [(name, config, ROOT) for name, config in configs.items()]
        if against is not None:
            runs.append((f"HTTP upstream, proxy from {against}", configs["HTTP upstream"], against))
        peers = {}
        for name, config, tree in runs:
            argv = ["env", "-C", str(tree), f"PYTHONPATH={tree}", sys.executable, "-m", "aggregator", "serve"]
            peers[name] = Peer([*argv, "--stdio", "--config", str(config), "--log-level", "warning"]).initialize()
        cpu: dict[str, list[float]] = {name: [] for name in peers}
        try:
            for peer in peers.values():
                stdio_throughput(peer, "s0__tool0", 2000)
            for i in range(repeats):
                for name, peer in list(peers.items())[:: 1 if i % 2 == 0 else -1]:
                    before = peer.cpu_ns()
                    _, calls = stdio_throughput(peer, "s0__tool0", n_calls)
                    cpu[name].append((peer.cpu_ns() - before) / calls / 1e3)
        finally:
            for peer in peers.values():
                peer.close()
    return cpu


def report(targets: list[Target], leg: dict[str, list[float]], repeats: int) -> None:
    med = statistics.median
    direct = targets[0]
    print(f"{os.cpu_count()} cores; medians of {repeats} interleaved runs; 16 in flight = 16 connections")
    print(f"{'':46} {'p50 ms':>8} {'p99 ms':>8} {'1 in flight/s':>14} {'16 in flight/s':>15} {'CPU us/call':>12}")
    for target in targets:
        p50 = f"{target.p(0.5):.3f}" if target.samples else "-"
        p99 = f"{target.p(0.99):.3f}" if target.samples else "-"
        one = f"{len(target.samples) / sum(target.samples):,.0f}" if target.samples else "-"
        ratio = med(target.rates) / med(direct.rates)
        many = f"{med(target.rates):,.0f} ({ratio:.2f}x)"
        print(f"{target.name:46} {p50:>8} {p99:>8} {one:>14} {many:>15} {med(target.cpu):>12.1f}")
    plain, front, upstream = targets[1], targets[FRONT], targets[-1]
    floor, floor_proxy = targets[2], targets[3]
    added, added99 = front.p(0.5) - direct.p(0.5), front.p(0.99) - direct.p(0.99)
    print(f"HTTP front: added latency at 1 in flight p50 {added:.3f} ms, p99 {added99:.3f} ms (target p50 <= 0.15 ms)")
    ratio, plain_ratio = med(front.rates) / med(direct.rates), med(front.rates) / med(plain.rates)
    print(
        f"HTTP front, 16 in flight: {ratio:.2f}x direct with httptools, {plain_ratio:.2f}x plain asyncio "
        f"(target >= 0.5x), proxy CPU {med(front.cpu):.1f} us/call (target <= 100)"
    )
    print(
        f"the floor (trio + httptools, nothing else): answering {med(floor.rates) / med(direct.rates):.2f}x direct, "
        f"forwarding to stdio {med(floor_proxy.rates) / med(direct.rates):.2f}x direct, "
        f"{med(floor_proxy.cpu):.1f} us/call, added p50 {floor_proxy.p(0.5) - direct.p(0.5):.3f} ms"
    )
    print(
        f"HTTP upstream: added p50 {upstream.p(0.5) - direct.p(0.5):.3f} ms; 16 in flight "
        f"{med(upstream.rates) / med(direct.rates):.2f}x direct"
    )
    print_leg(leg)
    print(f"proxy RSS after the run: {front.rss:.1f} MB; 200 idle sessions: +{front.idle_cost:.1f} MB (<= 20 MB)")  # type: ignore[attr-defined]


def print_leg(leg: dict[str, list[float]]) -> None:
    med = statistics.median
    http_leg, stdio_leg = med(leg["HTTP upstream"]), med(leg["stdio upstream"])
    print(
        f"proxy CPU per call over stdio, 16 in flight: HTTP upstream {http_leg:.1f} us, stdio upstream "
        f"{stdio_leg:.1f} us: the HTTP leg costs {http_leg - stdio_leg:+.1f} us more than the stdio one"
        f" (whole proxy with it: target <= 100 us)"
    )
    for name, figures in leg.items():
        if name.startswith("HTTP upstream, proxy from"):
            print(f"proxy CPU per call over stdio, 16 in flight, {name}: {med(figures):.1f} us")


def era_cost(directory: Path, n_calls: int, repeats: int) -> dict:
    """Proxy CPU per tools/call, 16 in flight, one proxy in front of the fast echo server:
    a legacy session's calls and modern stateless calls, interleaved."""
    port = free_port()
    cpu: dict[str, list[float]] = {"legacy": [], "modern": []}
    ratios = []
    with processes() as keep:
        proxy = keep(start_proxy(upstream_config(directory, "era"), port))
        wait_listening(port, seconds=30)
        sessions = {"legacy": load.open_session(port), "modern": load.MODERN}
        _, answer = load.HttpClient(port, load.MODERN, "s0__tool0").post(load.call_body("s0__tool0", 1, load.MODERN))
        assert orjson.loads(answer)["result"]["resultType"] == "complete", answer
        for session in sessions.values():
            load.http_throughput(port, session, "s0__tool0", 2000)  # warm up
        for i in range(repeats):
            order = list(sessions.items())
            for name, session in order if i % 2 == 0 else order[::-1]:
                before = cpu_ns(proxy.pid)
                _, calls = load.http_throughput(port, session, "s0__tool0", n_calls)
                cpu[name].append((cpu_ns(proxy.pid) - before) / calls / 1e3)
            ratios.append(cpu["modern"][-1] / cpu["legacy"][-1])
    return {"cpu": cpu, "ratios": ratios}


def print_era(era: dict) -> None:
    legacy, modern = statistics.median(era["cpu"]["legacy"]), statistics.median(era["cpu"]["modern"])
    ratios = era["ratios"]
    ratio = statistics.median(ratios)
    print(
        f"proxy CPU per tools/call, 16 in flight: legacy session {legacy:.1f} us, modern stateless "
        f"{modern:.1f} us, modern/legacy {ratio:.3f}x (spread {min(ratios):.3f}-{max(ratios):.3f} over "
        f"{len(ratios)} runs)"
    )
    print(f"  of the difference, reading the longer body (its _meta envelope): {envelope_parse_us():.2f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    parser.add_argument("--era", action="store_true", help="only the modern/legacy CPU row (more repeats)")
    parser.add_argument("--leg", action="store_true", help="only the HTTP upstream leg's CPU rows")
    parser.add_argument("--against", type=Path, help="another checkout whose proxy is measured in the same run")
    args = parser.parse_args()
    n_latency, n_calls, repeats = (300, 2000, 1) if args.quick else (2000, 20000, 5)
    with tempfile.TemporaryDirectory() as tmp:
        if args.era:
            repeats = 3 if args.quick else 11
            print(f"{os.cpu_count()} cores, median of {repeats} interleaved runs")
            print_era(era_cost(Path(tmp), n_calls, repeats))
            return 0
        against = args.against.resolve() if args.against else None
        if args.leg:
            print(f"{os.cpu_count()} cores, median of {repeats} interleaved runs of {n_calls} calls")
            print_leg(run_leg(Path(tmp), n_calls, repeats, against))
            return 0
        targets = run_fronts(Path(tmp), against, n_latency, n_calls, repeats)
        leg = run_leg(Path(tmp), n_calls, repeats, against)
    report(targets, leg, repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: one proxy process against 1, 2 and 3 replicas behind nginx, in one run.

    python -m tests.bench.cluster_bench [--quick] [--calls N] [--repeats R] [--store URL]

Every target is driven the same way: ``tools/call`` as 2026-07-28 stateless requests (any
replica serves any of them), 64 in flight on 64 keep-alive connections, by one driver on
raw sockets (``http_load``). Each proxy is ``aggregator serve --http`` in front of its own
batched echo server over stdio (``echo_server --batched``: the fastest upstream in the
repository, so the proxy, not the server, is measured). The targets:

- the upstream's own speed, for scale: the same echo server behind a plain asyncio
  HTTP/1.1 front parsed by httptools (``fast_http_echo``), directly;
- one proxy process, directly: the baseline the ratios are taken against;
- 1, 2 and 3 replicas behind nginx, run from ``examples/cluster/nginx.conf`` with the
  addresses filled in as ``envsubst`` does (for fewer than three replicas the ``server``
  lines of those not run are left out, the only other change).

Runs are interleaved and repeated; medians are reported: calls per second, calls per
second per core (``os.cpu_count()``: on a machine with fewer cores than processes the
replicas share them, and the balancer takes its part), the ratio to the single process,
and the CPU per call of the proxies and nginx together (``schedstat``). With ``--store``
(a ``redis://`` URL) the three replicas run a second time with ``[cluster] store`` set to
it, and the store's cost is the ratio of their throughput with it to without it. Every
loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench import http_load as load
from tests.bench.http_bench import cpu_ns, processes, upstream_config
from tests.e2e.cluster_harness import EXAMPLES, NGINX, fill
from tests.loopback import free_port, wait_listening

ROOT = Path(__file__).parents[2]
IN_FLIGHT = 64
TOOL = "s0__tool0"


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (nginx's workers)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def nginx_config(replicas: list[int], listen: int) -> str:
    """``examples/cluster/nginx.conf`` for ``replicas`` (ports): the addresses filled in, and
    the ``server`` lines of the replicas not run left out."""
    text = (EXAMPLES / "nginx.conf").read_text()
    values = {"LISTEN": f"127.0.0.1:{listen}"}
    for index in range(3):
        name = f"REPLICA_{index + 1}"
        if index < len(replicas):
            values[name] = f"127.0.0.1:{replicas[index]}"
        else:
            values[name] = "unused"
            text = "\n".join(line for line in text.splitlines() if f"server ${{{name}}}" not in line) + "\n"
    return fill(text, values)


class Target:
    """What one row measures: a port to drive, and the processes whose CPU it costs."""

    def __init__(self, name: str, port: int, session: str | None, tool: str, pids: list[int]) -> None:
        self.name, self.port, self.session, self.tool, self.pids = name, port, session, tool, pids
        self.rates: list[float] = []
        self.cpu: list[float] = []

    def measure(self, calls: int) -> None:
        pids = self.pids + [child for pid in self.pids for child in children(pid) if self.name.startswith("nginx")]
        before = sum(cpu_ns(pid) for pid in pids)
        rate, done = load.http_throughput(self.port, self.session, self.tool, calls, in_flight=IN_FLIGHT)
        self.cpu.append((sum(cpu_ns(pid) for pid in pids) - before) / done / 1e3)
        self.rates.append(rate)


def proxy_config(directory: Path, name: str, store: str | None) -> Path:
    """The benchmark's proxy config (one batched echo server), with the store if given."""
    config = upstream_config(directory, name)
    text = config.read_text().replace("[servers.s0]", "[http]\nmax_stateless_per_principal = 256\n\n[servers.s0]")
    if store is not None:
        text += f'\n[cluster]\nstore = "{store}"\n'
    config.write_text(text)
    return config


def run(directory: Path, calls: int, repeats: int, store: str | None) -> list[Target]:
    with processes() as keep:

        def proxy(config: Path) -> tuple[int, int]:
            port = free_port()
            argv = [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config"]
            process = keep(subprocess.Popen([*argv, str(config), "--log-level", "warning"], cwd=ROOT))
            wait_listening(port, process, seconds=30)
            return port, process.pid

        def balancer(name: str, replicas: list[tuple[int, int]]) -> Target:
            prefix = directory / name.replace(" ", "-")
            prefix.mkdir()
            port = free_port()
            (prefix / "nginx.conf").write_text(nginx_config([p for p, _ in replicas], port))
            argv = [NGINX, "-p", f"{prefix}/", "-c", "nginx.conf", "-g", f"daemon off; pid {prefix}/nginx.pid;"]
            process = keep(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
            wait_listening(port, process, seconds=10)
            return Target(name, port, load.MODERN, TOOL, [process.pid] + [pid for _, pid in replicas])

        fast_port = free_port()
        fast = keep(subprocess.Popen([sys.executable, "-m", "tests.bench.fast_http_echo", str(fast_port)], cwd=ROOT))
        wait_listening(fast_port, fast, seconds=30)
        targets = [Target("upstream alone (asyncio + httptools)", fast_port, load.open_session(fast_port), "tool0", [])]
        config = proxy_config(directory, "replica", None)
        replicas = [proxy(config) for _ in range(3)]
        single = replicas[0]
        targets.append(Target("one proxy process, directly", single[0], load.MODERN, TOOL, [single[1]]))
        for count in (1, 2, 3):
            targets.append(balancer(f"nginx + {count} replica{'s' if count > 1 else ''}", replicas[:count]))
        if store is not None:
            stored = [proxy(proxy_config(directory, f"stored{index}", store)) for index in range(3)]
            targets.append(balancer("nginx + 3 replicas, with the store", stored))
        for target in targets:
            target.measure(2000)  # warm up
            target.rates.clear(), target.cpu.clear()
        for i in range(repeats):
            for target in targets if i % 2 == 0 else targets[::-1]:
                target.measure(calls)
    return targets


def report(targets: list[Target]) -> None:
    cores = os.cpu_count() or 1
    base = statistics.median(targets[1].rates)
    print(f"tools/call, {IN_FLIGHT} in flight, 2026-07-28 stateless; {cores} cores; medians")
    print(f"{'':40} {'calls/s':>9} {'per core':>9} {'vs one':>7} {'CPU/call':>10}")
    for target in targets:
        rate = statistics.median(target.rates)
        cpu = f"{statistics.median(target.cpu):.1f} us" if target.pids else ""
        print(f"{target.name:40} {rate:9,.0f} {rate / cores:9,.0f} {rate / base:6.2f}x {cpu:>10}")
    stored = [target for target in targets if target.name.endswith("with the store")]
    if stored:
        without = statistics.median(targets[-2].rates)
        print(f"the store's cost: {statistics.median(stored[0].rates) / without:.2f}x the throughput without it")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per measurement (default 20,000)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs (default 5)")
    parser.add_argument("--store", help="a redis:// URL: the three replicas run with it as their store too")
    args = parser.parse_args()
    if not os.access(NGINX, os.X_OK):
        print(f"{NGINX} is not installed", file=sys.stderr)
        return 2
    calls, repeats = (3000, 1) if args.quick else (args.calls, args.repeats)
    with tempfile.TemporaryDirectory() as directory:
        report(run(Path(directory), calls, repeats, args.store))
    return 0


if __name__ == "__main__":
    sys.exit(main())

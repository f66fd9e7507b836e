"""Benchmark: tools/call through the proxy against the same upstream driven directly.

    python -m tests.bench.stdio_bench [--quick]

In one run it drives, over stdio: the upstream directly; the upstream behind a bare trio
pass-through that only remaps ids (the floor any proxy hop costs, for calibration); and
the upstream behind `aggregator serve --stdio`. Runs are interleaved and repeated, and
medians are reported as ratios against the direct upstream. Two upstreams: a typical one
that answers line by line (as hand-written servers and the SDKs do), and a batched one
so fast that the proxy's own cost dominates. Also: proxy CPU per call, tools/list with 50
upstreams against 1 (same 500 tools in total), the proxy's RSS with 10 upstreams, and
the protocol-era row: proxy CPU per call for a legacy session against modern (2026-07-28)
stateless calls, each carrying its ``_meta`` envelope (``--era`` runs that row alone).
Every loop is bounded in count and time. Not part of the default test run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).parents[2]
TIME_LIMIT = 30.0  # seconds, per measurement


class Peer:
    """A stdio MCP peer (an upstream, a pass-through or the proxy) driven over pipes.

    It writes each request on its own, as a client library does.
    """

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        self.out = self.process.stdin.fileno()
        self.inp = self.process.stdout.fileno()
        self.buffer = b""
        self.next_id = 1

    def send(self, method: str, params: dict | None = None) -> int:
        id = self.next_id
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        os.write(self.out, orjson.dumps(message) + b"\n")
        return id

    def receive(self) -> list[dict]:
        while b"\n" not in self.buffer:
            data = os.read(self.inp, 1 << 16)
            if not data:
                raise RuntimeError("peer closed its stdout")
            self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [orjson.loads(line) for line in lines if line.strip()]

    def call(self, method: str, params: dict | None = None) -> dict:
        id = self.send(method, params)
        while True:
            for message in self.receive():
                if message.get("id") == id:
                    return message

    def initialize(self) -> Peer:
        answer = self.call(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
        )
        assert "result" in answer, answer
        os.write(self.out, b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        return self

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu_ns(self) -> int:
        """CPU time of all its threads, in ns (``schedstat``: finer than ``cpu_seconds``' ticks)."""
        total = 0
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
        return total

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def latency_ms(peer: Peer, tool: str, count: int) -> float:
    samples = []
    deadline = time.monotonic() + TIME_LIMIT
    for _ in range(count):
        start = time.perf_counter()
        answer = peer.call("tools/call", {"name": tool, "arguments": {"x": "hello"}})
        samples.append(time.perf_counter() - start)
        assert "result" in answer, answer
        if time.monotonic() > deadline:
            break
    return statistics.median(samples) * 1000


# What a modern (2026-07-28) client puts in every request instead of an initialize.
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}


def throughput(peer: Peer, tool: str, count: int, in_flight: int = 16, meta: dict | None = None) -> tuple[float, int]:
    """Calls per second with `in_flight` outstanding; returns (rate, calls done). With
    `meta`, each call carries it as its `_meta` (a modern stateless call)."""
    params = {"name": tool, "arguments": {"x": "hello"}}
    if meta is not None:
        params["_meta"] = meta
    sent = done = 0
    deadline = time.monotonic() + TIME_LIMIT
    start = time.perf_counter()
    while sent < min(in_flight, count):
        peer.send("tools/call", params)
        sent += 1
    while done < sent:
        for message in peer.receive():
            if "id" not in message:
                continue
            assert "result" in message, message
            done += 1
            if sent < count and time.monotonic() < deadline:
                peer.send("tools/call", params)
                sent += 1
    return done / (time.perf_counter() - start), done


def list_latency_ms(peer: Peer, count: int) -> float:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        answer = peer.call("tools/list")
        samples.append(time.perf_counter() - start)
        assert len(answer["result"]["tools"]) == 100, answer
    return statistics.median(samples) * 1000


RULES = "\n".join(
    [
        "[policy.tools]",
        "deny = [" + ", ".join(f'"*secret{i}*"' for i in range(10)) + "]",
        "[policy.resources]",
        "deny = [" + ", ".join(f'"private{i}://*"' for i in range(5)) + "]",
        "[policy.prompts]",
        "allow = [" + ", ".join(f'"p{i}*"' for i in range(5)) + "]",
        "",
    ]
)


def write_config(directory: Path, upstreams: int, tools: int, *flags: str, rules: bool = False) -> Path:
    lines = ["[proxy]", "startup_timeout = 60.0", "page_size = 100", ""]
    if rules:
        lines.append(RULES)
    args = ", ".join(f'"{a}"' for a in ["-m", "tests.bench.echo_server", str(tools), *flags])
    for i in range(upstreams):
        lines += [f"[servers.s{i}]", f'command = "{sys.executable}"', f"args = [{args}]", f'cwd = "{ROOT}"', ""]
    path = directory / f"bench-{upstreams}-{tools}{''.join(flags)}{'-rules' if rules else ''}.toml"
    path.write_text("\n".join(lines))
    return path


def aggregator(config: Path) -> Peer:
    return Peer(
        [sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config), "--log-level", "warning"]
    ).initialize()


def compare(directory: Path, flags: list[str], n_latency: int, n_calls: int, repeats: int) -> dict:
    """Direct vs bare pass-through vs aggregator, on one kind of upstream."""
    upstream = [sys.executable, "-m", "tests.bench.echo_server", *flags]
    peers = {
        "direct": (Peer(upstream).initialize(), "tool0"),
        "bare": (Peer([sys.executable, "-m", "tests.bench.bare_passthrough", *upstream]).initialize(), "tool0"),
        "proxy": (aggregator(write_config(directory, 1, 10, *flags)), "s0__tool0"),
    }
    latency = {name: [] for name in peers}
    rate = {name: [] for name in peers}
    cpu_us = []
    try:
        for peer, tool in peers.values():
            latency_ms(peer, tool, 200)  # warm up
        for _ in range(repeats):
            for name, (peer, tool) in peers.items():
                latency[name].append(latency_ms(peer, tool, n_latency))
                before = peer.cpu_seconds()
                calls_per_s, calls = throughput(peer, tool, n_calls)
                rate[name].append(calls_per_s)
                if name == "proxy":
                    cpu_us.append((peer.cpu_seconds() - before) / calls * 1e6)
    finally:
        for peer, _ in peers.values():
            peer.close()
    median = statistics.median
    return {
        "latency": {k: median(v) for k, v in latency.items()},
        "rate": {k: median(v) for k, v in rate.items()},
        "cpu_us": median(cpu_us),
    }


def policy_cost(directory: Path, n_latency: int, n_calls: int, repeats: int) -> dict:
    """The same proxy with and without 20 allow/deny rules, interleaved."""
    peers = {
        "plain": aggregator(write_config(directory, 1, 10)),
        "rules": aggregator(write_config(directory, 1, 10, rules=True)),
    }
    latency = {name: [] for name in peers}
    rate = {name: [] for name in peers}
    try:
        for peer in peers.values():
            latency_ms(peer, "s0__tool0", 200)
        for _ in range(repeats):
            for name, peer in peers.items():
                latency[name].append(latency_ms(peer, "s0__tool0", n_latency))
                rate[name].append(throughput(peer, "s0__tool0", n_calls)[0])
    finally:
        for peer in peers.values():
            peer.close()
    return {
        "latency": {k: statistics.median(v) for k, v in latency.items()},
        "rate": {k: statistics.median(v) for k, v in rate.items()},
    }


def era_cost(directory: Path, n_calls: int, repeats: int) -> dict:
    """Proxy CPU per tools/call, 16 in flight, against the same fast upstream: a legacy
    session (initialize once, then calls) and a modern connection (no initialize, each
    call with its own `_meta`), each its own proxy process (a stdio connection serves one
    era), interleaved. Returns the per-repeat figures (µs) and their ratios."""
    config = write_config(directory, 1, 10, "--batched")
    legacy = aggregator(config)
    modern = Peer(
        [sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config), "--log-level", "warning"]
    )
    cpu: dict[str, list[float]] = {"legacy": [], "modern": []}
    ratios = []
    try:
        answer = modern.call("tools/call", {"name": "s0__tool0", "arguments": {"x": "hello"}, "_meta": MODERN_META})
        assert answer["result"]["resultType"] == "complete", answer
        for peer, meta in ((legacy, None), (modern, MODERN_META)):
            throughput(peer, "s0__tool0", 2000, meta=meta)  # warm up
        for i in range(repeats):
            order = [("legacy", legacy, None), ("modern", modern, MODERN_META)]
            for name, peer, meta in order if i % 2 == 0 else order[::-1]:
                before = peer.cpu_ns()
                _, calls = throughput(peer, "s0__tool0", n_calls, meta=meta)
                cpu[name].append((peer.cpu_ns() - before) / calls / 1e3)
            ratios.append(cpu["modern"][-1] / cpu["legacy"][-1])
    finally:
        legacy.close()
        modern.close()
    return {"cpu": cpu, "ratios": ratios}


def envelope_parse_us(repeats: int = 7, count: int = 50_000) -> float:
    """What the longer request alone costs the proxy to read: its message decoding
    (``decode_message``, the same code the proxy runs) on this benchmark's modern request
    minus its legacy one, in this process (µs, median of ``repeats``)."""
    from aggregator.jsonrpc.codec import decode_message

    params = {"name": "s0__tool0", "arguments": {"x": "hello"}}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    legacy = orjson.dumps({**call, "params": params})
    modern = orjson.dumps({**call, "params": {**params, "_meta": MODERN_META}})

    def per_call(raw: bytes) -> float:
        start = time.perf_counter_ns()
        for _ in range(count):
            decode_message(raw)
        return (time.perf_counter_ns() - start) / count / 1e3

    return statistics.median(per_call(modern) - per_call(legacy) for _ in range(repeats))


def print_era(label: str, era: dict) -> None:
    """The era row: medians, the ratio's median and its spread over the repeats."""
    legacy, modern = statistics.median(era["cpu"]["legacy"]), statistics.median(era["cpu"]["modern"])
    ratios = era["ratios"]
    ratio = statistics.median(ratios)
    print(
        f"{label}: proxy CPU per tools/call, 16 in flight: legacy session {legacy:.1f} us, "
        f"modern stateless {modern:.1f} us, modern/legacy {ratio:.3f}x "
        f"(spread {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} runs)   "
        f"target <= 1.02x {'ok' if ratio <= 1.02 else 'MISSED'}"
    )
    print(f"  of the difference, reading the longer request (its _meta envelope): {envelope_parse_us():.2f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    parser.add_argument("--era", action="store_true", help="only the modern/legacy CPU row (more repeats)")
    args = parser.parse_args()
    n_latency, n_calls, n_list, repeats = (300, 3000, 100, 1) if args.quick else (2000, 20000, 500, 5)
    if args.era:
        repeats = 3 if args.quick else 11
    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, median of {repeats} interleaved runs\n")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if args.era:
            print_era("stdio", era_cost(directory, n_calls, repeats))
            return 0
        era = era_cost(directory, n_calls, repeats)
        results = {
            "typical upstream (line by line)": compare(directory, [], n_latency, n_calls, repeats),
            "fast upstream (batched)": compare(directory, ["--batched"], n_latency, n_calls, repeats),
        }
        policy = policy_cost(directory, n_latency, n_calls, repeats)
        one = aggregator(write_config(directory, 1, 500))
        list_one = list_latency_ms(one, n_list)
        one.close()
        many = aggregator(write_config(directory, 50, 10))
        list_many = list_latency_ms(many, n_list)
        many.close()
        ten = aggregator(write_config(directory, 10, 10))
        latency_ms(ten, "s9__tool0", 500)
        rss = ten.rss_mb()
        ten.close()

    for label, r in results.items():
        lat, rate = r["latency"], r["rate"]
        added, bare_added = lat["proxy"] - lat["direct"], lat["bare"] - lat["direct"]
        ratio, bare_ratio = rate["proxy"] / rate["direct"], rate["bare"] / rate["direct"]
        print(label)
        print(f"  {'':34} {'direct':>10} {'bare hop':>10} {'aggregator':>11}")
        print(
            f"  {'median latency, 1 in flight (ms)':34} {lat['direct']:>10.3f} {lat['bare']:>10.3f}"
            f" {lat['proxy']:>11.3f}"
        )
        print(
            f"  {'  added by the hop (ms)':34} {'':>10} {bare_added:>10.3f} {added:>11.3f}"
            f"   target <= 0.10 {'ok' if added <= 0.10 else 'MISSED'}"
        )
        print(
            f"  {'throughput, 16 in flight (calls/s)':34} {rate['direct']:>10,.0f} {rate['bare']:>10,.0f}"
            f" {rate['proxy']:>11,.0f}"
        )
        print(
            f"  {'  ratio to direct':34} {'':>10} {bare_ratio:>9.2f}x {ratio:>10.2f}x"
            f"   target >= 0.35x {'ok' if ratio >= 0.35 else 'MISSED'}"
        )
        print(
            f"  {'proxy CPU per call, 16 in flight':34} {'':>10} {'':>10} {r['cpu_us']:>8.1f} us"
            f"   target <= 30 us {'ok' if r['cpu_us'] <= 30 else 'MISSED'}\n"
        )
    print(
        f"tools/list (100 of 500 tools) median: 1 upstream {list_one:.3f} ms, 50 upstreams "
        f"{list_many:.3f} ms: {list_many / list_one:.2f}x   target <= 2x "
        f"{'ok' if list_many / list_one <= 2 else 'MISSED'}"
    )
    print_era("protocol eras (fast upstream)", era)
    print(f"proxy RSS with 10 upstreams: {rss:.1f} MB   target <= 40 MB {'ok' if rss <= 40 else 'MISSED'}")
    plain, ruled = policy["rate"]["plain"], policy["rate"]["rules"]
    print(
        f"20 allow/deny rules: throughput {ruled:,.0f}/s vs {plain:,.0f}/s without ({ruled / plain:.2f}x), "
        f"latency {policy['latency']['rules']:.3f} vs {policy['latency']['plain']:.3f} ms   "
        f"target within 10% {'ok' if ruled / plain >= 0.9 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

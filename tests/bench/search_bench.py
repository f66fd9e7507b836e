"""Benchmark: tool search's quality and speed, through the proxy, against real servers.

    python -m tests.bench.search_bench [--quick] [--misses]

Quality: ``aggregator serve --stdio`` in search mode in front of the seven real servers of
``tests/real_servers.py`` (56 tools); every query of the two labeled sets
(``tool_queries.json``, ``tool_queries_heldout.json``: how a user or a model would ask,
each with the tools that would serve it) goes to ``find_tools`` (limit 5), and recall@1
and recall@5 are reported per set and together. recall@k of one query is the share of
its relevant tools in the first k (of at most k of them).

Speed: the same proxy in front of one echo server listing N tools made from those real
tools (each copy numbered), N = 1,000 and 10,000: the first ``find_tools`` after the
catalog changed (it builds the index), then the median and p99 of many, end to end over
stdio, and of the search alone in-process over the same tools.

Also the token sizes of the seven servers' tools/list in each mode. Bounded in count and
time; not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aggregator.core.catalogs.discovery import SEARCH_LIST_TOKENS
from aggregator.core.catalogs.tokens import tools_list_tokens
from aggregator.core.catalogs.tool_search import ToolIndex
from tests.bench.stdio_bench import Peer
from tests.real_servers import missing, servers_toml

HERE = Path(__file__).parent
SETS = {"written first": HERE / "tool_queries.json", "held out": HERE / "tool_queries_heldout.json"}


def proxy(config: Path) -> Peer:
    return Peer([sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config)]).initialize()


def find(peer: Peer, query: str, limit: int = 5) -> list[str]:
    answer = peer.call("tools/call", {"name": "find_tools", "arguments": {"query": query, "limit": limit}})
    return [tool["name"] for tool in answer["result"]["structuredContent"]["tools"]]


def recall(found: list[str], relevant: set[str], k: int) -> float:
    return len(relevant & set(found[:k])) / min(k, len(relevant))


def quality(peer: Peer, show_misses: bool) -> dict[str, tuple[float, float, int]]:
    out: dict[str, tuple[float, float, int]] = {}
    every: list[tuple[float, float]] = []
    for name, path in SETS.items():
        scores = []
        for query in json.loads(path.read_text()):
            found, relevant = find(peer, query["query"]), set(query["relevant"])
            scores.append((recall(found, relevant, 1), recall(found, relevant, 5)))
            if show_misses and not relevant & set(found):
                print(f"  miss ({name}): {query['query']!r}: wanted {sorted(relevant)}, got {found[:3]}")
        out[name] = (statistics.mean(s[0] for s in scores), statistics.mean(s[1] for s in scores), len(scores))
        every += scores
    out["both"] = (statistics.mean(s[0] for s in every), statistics.mean(s[1] for s in every), len(every))
    return out


def all_tools(peer: Peer) -> list[dict]:
    tools, cursor = [], None
    for _ in range(1000):
        result = peer.call("tools/list", {"cursor": cursor} if cursor else {})["result"]
        tools += result["tools"]
        cursor = result.get("nextCursor")
        if not cursor:
            break
    return tools


def speed(directory: Path, real: Path, count: int, calls: int) -> dict[str, float]:
    config = directory / f"many-{count}.toml"
    args = json.dumps(["-m", "tests.bench.echo_server", str(count), "--batched", "--tools-from", str(real)])
    config.write_text(
        f'[proxy.discovery]\nmode = "search"\n[servers.s]\ncommand = "{sys.executable}"\nargs = {args}\n'
        f'cwd = "{HERE.parents[1]}"\n'
    )
    queries = [q["query"] for path in SETS.values() for q in json.loads(path.read_text())]
    peer = proxy(config)
    try:
        started = time.perf_counter()
        find(peer, queries[0])
        first = time.perf_counter() - started
        samples = []
        deadline = time.monotonic() + 60
        for i in range(calls):
            started = time.perf_counter()
            find(peer, queries[i % len(queries)])
            samples.append(time.perf_counter() - started)
            if time.monotonic() > deadline:
                break
    finally:
        peer.close()
    tools = [{**t, "name": f"s__{t['name']}_{i}"} for i, t in enumerate(json.loads(real.read_text()) * 200)][:count]
    index = ToolIndex(tools, ["s"] * len(tools), {"s": ""})
    alone = []
    for i in range(min(calls, 2000)):
        started = time.perf_counter()
        index.search(queries[i % len(queries)], 5)
        alone.append(time.perf_counter() - started)
    ordered = sorted(samples)
    return {
        "first": first * 1000,
        "p50": statistics.median(samples) * 1000,
        "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
        "alone": statistics.median(alone) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed calls")
    parser.add_argument("--misses", action="store_true", help="print each query whose tools were not in the top 5")
    args = parser.parse_args()
    gone = missing()
    if gone:
        print(f"real servers missing (the README's test command installs them): {gone}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = directory / "real.toml"
        config.write_text(
            '[proxy]\nstartup_timeout = 30.0\n[proxy.discovery]\nmode = "search"\n' + servers_toml(directory)
        )
        everything = directory / "everything.toml"
        everything.write_text("[proxy]\nstartup_timeout = 30.0\n" + servers_toml(directory))
        peer = proxy(everything)
        try:
            tools = all_tools(peer)
        finally:
            peer.close()
        real = directory / "real-tools.json"
        real.write_text(json.dumps(tools))
        peer = proxy(config)
        try:
            found = quality(peer, args.misses)
        finally:
            peer.close()
        calls = 200 if args.quick else 1000
        timings = {count: speed(directory, real, count, calls) for count in (1000, 10_000)}
    print(f"tool search over {len(tools)} tools of 7 real servers (find_tools, limit 5, through the proxy):")
    for name, (r1, r5, n) in found.items():
        print(f"  {name:>14}: {n:3} queries  recall@1 {r1:.3f}  recall@5 {r5:.3f}  (target recall@5 >= 0.9)")
    print(
        f"tools/list of the 7 servers: {tools_list_tokens(tools):,} tokens listing all, {SEARCH_LIST_TOKENS:,} in "
        "search mode (estimated: UTF-8 bytes / 4)"
    )
    for count, t in timings.items():
        target = 2 if count == 1000 else 10
        print(
            f"find_tools at {count:,} tools: first (builds the index) {t['first']:.1f} ms; then p50 {t['p50']:.2f} ms, "
            f"p99 {t['p99']:.2f} ms end to end over stdio (target p50 <= {target} ms); the search alone "
            f"{t['alone']:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

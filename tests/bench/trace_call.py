"""Trace: which of the proxy's modules one ``tools/call`` runs through, and how often control moves between them.

    python -m tests.bench.trace_call [--tree DIR] [--runs 5] [--settle SECONDS]

It starts ``python -m aggregator serve --http 127.0.0.1:PORT`` from the tree DIR (default:
this checkout) in front of the batched echo server (``tests/bench/echo_server.py``) over
stdio, opens a Streamable HTTP session on one keep-alive connection and warms it up with 50
calls. Then, for each run, SIGUSR1 turns on ``sys.setprofile`` in the proxy's main thread
(where trio runs), one ``tools/call`` is sent and its answer read, and after ``--settle``
(5 ms: the call's own tail is done by then, a timer it arms for later is not) SIGUSR2 turns
the profile off and has the proxy write what it recorded.

Recorded: at each Python ``call`` event the module of the called frame, at each ``return``
event the module of the frame control returns to, when its name starts with ``aggregator``
(trio's code and the stdlib's are skipped). Reported: the distinct modules executed, each
with how often control entered it, and the moves: transitions between consecutive different
modules once repeats are collapsed. Nothing is subtracted, so an idle timer that fires in
the window counts too: hence several runs, each count given as minimum and median.

It relies only on the command line and on module names, so it runs unchanged against another
checkout (``--tree /work/base``): with DIR/.venv/bin/python if there is one, else with this
interpreter, either way with PYTHONPATH=DIR and DIR as the working directory; the file the
proxy imported ``aggregator`` from is checked. It stops only the process it started, listens
only on 127.0.0.1, and is not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).parents[2]
TOOL = "s0__tool0"
OUT_VARIABLE = "AGGREGATOR_TRACE_OUT"

# Runs in the proxy's process: handlers first, then the command line as `python -m aggregator`.
CHILD = f"""
import os, runpy, signal, sys
import aggregator
print(aggregator.__file__, flush=True)
out = os.environ[{OUT_VARIABLE!r}]
seen = []
def record(frame, event, arg):
    if event == "return":
        frame = frame.f_back
    elif event != "call":
        return
    if frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith("aggregator"):
            seen.append(name)
def on(signum, frame):
    seen.clear()
    sys.setprofile(record)
    open(out + ".on", "w").close()
def off(signum, frame):
    sys.setprofile(None)
    with open(out + ".part", "w") as file:
        file.write("\\n".join(seen))
    os.replace(out + ".part", out)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, off)
sys.argv = ["aggregator", *sys.argv[1:]]
runpy.run_module("aggregator", run_name="__main__", alter_sys=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(ready: Callable[[], bool], what: str, process: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"the proxy exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {seconds:.0f} s")
        time.sleep(0.0005)


class Client:
    """One keep-alive connection speaking Streamable HTTP; answers must carry Content-Length."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.session: str | None = None
        self.next_id = 1

    def post(self, message: dict) -> tuple[dict[str, str], bytes]:
        body = orjson.dumps(message)
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
        )
        if self.session is not None:
            head += f"Mcp-Session-Id: {self.session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        while (end := self.buffer.find(b"\r\n\r\n")) == -1 or len(self.buffer) < end + 4 + length(self.buffer[:end]):
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("the proxy closed the connection")
            self.buffer += data
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        size = length(self.buffer[:end])
        answer, self.buffer = self.buffer[end + 4 : end + 4 + size], self.buffer[end + 4 + size :]
        return headers, answer

    def request(self, method: str, params: dict) -> dict:
        id, self.next_id = self.next_id, self.next_id + 1
        headers, body = self.post({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        self.session = headers.get("mcp-session-id", self.session)
        answer = orjson.loads(body)
        if "result" not in answer or answer["result"].get("isError"):
            raise RuntimeError(f"{method} failed: {answer}")
        return answer

    def initialize(self) -> None:
        self.request(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "trace", "version": "0"}},
        )
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self) -> dict:
        return self.request("tools/call", {"name": TOOL, "arguments": {"x": "hello"}})


def connect(port: int, process: subprocess.Popen, seconds: float = 30.0) -> Client:
    """A client with an open session. The proxy probes its port (listens and closes) before it
    listens for good, so an early connection may be refused or reset: it is tried again."""
    deadline = time.monotonic() + seconds
    while True:
        client = None
        try:
            client = Client(port)
            client.initialize()
            return client
        except ConnectionError:
            if client is not None:
                client.sock.close()
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    if head.startswith(b"HTTP/1.1 2") and b"text/event-stream" in head.lower():
        raise RuntimeError("the proxy answered with an event stream; this driver reads JSON answers only")
    return 0


def trace(tree: Path, runs: int, warmup: int, settle: float, directory: Path) -> list[list[str]]:
    config = directory / "trace.toml"
    args = orjson.dumps(["-m", "tests.bench.echo_server", "--batched"]).decode()
    command, cwd = orjson.dumps(sys.executable).decode(), orjson.dumps(str(ROOT)).decode()
    config.write_text(f"[servers.s0]\ncommand = {command}\nargs = {args}\ncwd = {cwd}\n")
    python = tree / ".venv" / "bin" / "python"
    port, out = free_port(), directory / "trace.out"
    argv = [str(python) if python.exists() else sys.executable, "-c", CHILD, "serve"]
    argv += ["--http", f"127.0.0.1:{port}", "--config", str(config), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(tree), OUT_VARIABLE: str(out)}
    stdout, stderr = directory / "stdout", directory / "stderr"
    with stdout.open("wb") as out_file, stderr.open("wb") as err_file:
        proxy = subprocess.Popen(argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file)
    sequences = []
    try:
        client = connect(port, proxy)
        imported = Path(stdout.read_text().splitlines()[0]).resolve()
        if not imported.is_relative_to(tree):
            raise RuntimeError(f"the proxy imported aggregator from {imported}, not from {tree}")
        print(f"aggregator from {imported}")
        for _ in range(warmup):
            client.call()
        marker = Path(f"{out}.on")
        for _ in range(runs):
            time.sleep(0.2)  # apart from the warm-up and the last run
            os.kill(proxy.pid, signal.SIGUSR1)
            wait_for(marker.exists, "tracing", proxy)
            client.call()
            time.sleep(settle)
            os.kill(proxy.pid, signal.SIGUSR2)
            wait_for(out.exists, "trace dump", proxy)
            sequences.append(out.read_text().split())
            out.unlink()
            marker.unlink()
        client.sock.close()
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
        if len(sequences) < runs:
            sys.stderr.write(stderr.read_text()[-2000:])
    return sequences


def collapse(sequence: list[str]) -> list[str]:
    return [name for i, name in enumerate(sequence) if i == 0 or name != sequence[i - 1]]


def report(sequences: list[list[str]]) -> None:
    runs = [collapse(sequence) for sequence in sequences]
    modules = [len(set(run)) for run in runs]
    moves = [max(len(run) - 1, 0) for run in runs]
    events = [len(sequence) for sequence in sequences]
    for i in range(len(runs)):
        print(f"run {i + 1}: {modules[i]} modules, {moves[i]} moves, {events[i]} events")
    for label, counts in (("modules", modules), ("moves", moves), ("events", events)):
        print(f"{label}: min {min(counts)}, median {statistics.median(counts):g}")
    least = min(range(len(runs)), key=lambda i: (moves[i], modules[i]))
    print(f"\nmodules of run {least + 1} (the fewest moves), with how often control entered each:")
    for name, entered in sorted(Counter(runs[least]).items(), key=lambda item: (-item[1], item[0])):
        print(f"  {entered:4d}  {name}")
    everywhere = set.intersection(*(set(run) for run in runs))
    some = sorted(set.union(*(set(run) for run in runs)) - everywhere)
    if some:
        print(f"\nin some runs only (timers, or the edges of the window): {', '.join(some)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose proxy is traced (default: this)")
    parser.add_argument("--runs", type=int, default=5, help="traced calls, each in its own window (default: 5)")
    parser.add_argument("--warmup", type=int, default=50, help="calls before the first window (default: 50)")
    parser.add_argument(
        "--settle", type=float, default=0.005, help="seconds between the answer and the end of the window"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        sequences = trace(options.tree.resolve(), options.runs, options.warmup, options.settle, Path(directory))
    report(sequences)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

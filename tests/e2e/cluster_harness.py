"""Replicas of the proxy behind a balancer, as real processes on 127.0.0.1.

``Replica`` is one ``aggregator serve --http`` process on a port of its own (its log in the
test's directory), which a test may SIGKILL by its pid and start again on the same port.
``replicas(n, config, tmp)`` starts ``n`` of them with the same config and waits until
each answers ``/readyz`` with 200. ``nginx(...)`` and ``haproxy(...)`` run the shipped
example configs (``examples/cluster/``) AS THEY ARE: the only change is the addresses,
filled in the documented way (nginx: the ``${NAME}`` placeholders, as ``envsubst`` with
the names listed fills them, ``fill``; HAProxy: the same names in its environment, which
it reads itself). nginx runs as the test user with its prefix (``-p``), pid file, logs and
temporary files in the test's directory. Each yields the balancer's URL.

Every wait is bounded; every process started here is stopped here, by its pid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.loopback import free_port, wait_listening
from tests.required import missing

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "cluster"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
# The placeholders of the example configs: the balancer's address and each replica's.
PLACEHOLDERS = ("LISTEN", "REPLICA_1", "REPLICA_2", "REPLICA_3")


def need(binary: str) -> None:
    """Skip the test when ``binary`` is not installed (the README's test command installs it)."""
    if not os.access(binary, os.X_OK):
        missing(binary, "apt-get install nginx haproxy")


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``${NAME}`` of ``values`` replaced, and nothing else changed:
    what ``envsubst '${LISTEN} ${REPLICA_1} ...'`` does. A placeholder left unfilled fails."""
    filled = re.sub(r"\$\{([A-Z_0-9]+)\}", lambda m: values.get(m[1], m[0]), template)
    left = [name for name in PLACEHOLDERS if "${" + name + "}" in filled]
    assert not left, f"placeholders left unfilled: {left}"
    return filled


def readiness(port: int, timeout: float = 2.0) -> tuple[int, dict]:
    """GET /readyz of the process on ``port``: its status and body (0 if nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=timeout) as response:  # noqa: S310
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except OSError:
        return 0, {}


class Replica:
    """One proxy process on its own port of 127.0.0.1."""

    def __init__(self, name: str, config: Path, directory: Path, port: int | None = None) -> None:
        self.name = name
        self.config = config
        self.port = port or free_port()
        self.log = directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []  # of every process that ended, in order

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, ready_within: float = 30.0) -> None:
        """Start the process (again, on the same port) and wait until it is ready."""
        assert self.process is None or self.process.poll() is not None, f"{self.name} runs already"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "aggregator", "serve", "--http", self.address, "--config", str(self.config)]
                + ["--log-level", "info"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
            )
        self.wait_ready(ready_within)

    def wait_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, f"{self.name} exited:\n{self.tail()}"
            if readiness(self.port, 1.0)[0] == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.name} was not ready within {seconds}s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL, by its pid: no drain, no goodbye (its stdio servers die with it)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.exit_codes.append(self.process.wait(timeout=10))

    def terminate(self, within: float = 30.0) -> int:
        """SIGTERM (drain), by its pid; its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=within)
        self.exit_codes.append(code)
        return code

    def stop(self) -> None:
        """Stop it if it still runs: SIGTERM, then SIGKILL after 15 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.exit_codes.append(self.process.wait(timeout=15))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.exit_codes.append(self.process.wait(timeout=5))

    def tail(self, size: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


@contextmanager
def replicas(count: int, config: Path, directory: Path) -> Iterator[list[Replica]]:
    """``count`` replicas with the same config, each ready; stopped (SIGTERM) at the end."""
    started = [Replica(f"replica{index + 1}", config, directory) for index in range(count)]
    try:
        for replica in started:
            replica.start()
        yield started
    finally:
        for replica in started:
            replica.stop()


def _addresses(backends: list[Replica], listen_port: int) -> dict[str, str]:
    assert len(backends) == 3, "the example configs name three replicas"
    values = {"LISTEN": f"127.0.0.1:{listen_port}"}
    values.update({f"REPLICA_{index + 1}": replica.address for index, replica in enumerate(backends)})
    return values


@contextmanager
def _process(argv: list[str], log: Path, port: int, env: dict[str, str] | None = None) -> Iterator[None]:
    with open(log, "ab") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env)
    try:
        try:
            wait_listening(port, process, seconds=10)
        except AssertionError:
            raise AssertionError(f"{argv[0]} did not start:\n{log.read_text(errors='replace')[-3000:]}") from None
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextmanager
def modern_server(directory: Path) -> Iterator[str]:
    """``tests/e2e/modern_server.py`` over Streamable HTTP on a free port: one server every
    replica shares (a change made through one is announced on every connection); its URL."""
    port = free_port()
    argv = [sys.executable, str(ROOT / "tests" / "e2e" / "modern_server.py"), "http", str(port)]
    with _process(argv, directory / "modern_server.log", port):
        yield f"http://127.0.0.1:{port}/mcp"


@contextmanager
def nginx(backends: list[Replica], directory: Path) -> Iterator[str]:
    """nginx with ``examples/cluster/nginx.conf`` in front of three replicas; its URL."""
    need(NGINX)
    prefix = directory / "nginx"
    prefix.mkdir()
    port = free_port()
    template = (EXAMPLES / "nginx.conf").read_text()
    (prefix / "nginx.conf").write_text(fill(template, _addresses(backends, port)))
    argv = [NGINX, "-p", f"{prefix}/", "-c", "nginx.conf", "-g", f"daemon off; pid {prefix}/nginx.pid;"]
    with _process(argv, prefix / "stderr.log", port):
        yield f"http://127.0.0.1:{port}/mcp"


@contextmanager
def haproxy(backends: list[Replica], directory: Path) -> Iterator[str]:
    """HAProxy with ``examples/cluster/haproxy.cfg`` in front of three replicas; its URL."""
    need(HAPROXY)
    port = free_port()
    env = {**os.environ, **_addresses(backends, port)}
    argv = [HAPROXY, "-db", "-f", str(EXAMPLES / "haproxy.cfg"), "-p", str(directory / "haproxy.pid")]
    with _process(argv, directory / "haproxy.log", port, env):
        yield f"http://127.0.0.1:{port}/mcp"


BALANCERS = {"nginx": nginx, "haproxy": haproxy}


@contextmanager
def balanced(balancer: str, config: Path, directory: Path) -> Iterator[tuple[str, list[Replica]]]:
    """Three replicas behind ``balancer`` ("nginx" or "haproxy"): its URL and the replicas."""
    need(NGINX if balancer == "nginx" else HAPROXY)
    with ExitStack() as stack:
        backends = stack.enter_context(replicas(3, config, directory))
        url = stack.enter_context(BALANCERS[balancer](backends, directory))
        yield url, backends

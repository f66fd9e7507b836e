"""End-to-end fixtures: real servers, the proxy as a subprocess, the official SDK as client."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.loopback import INIT, free_port, wait_listening
from tests.real_servers import make_git_repo

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
EVERYTHING = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FILESYSTEM = HERE / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
PYTHON1 = ROOT / ".venv-mcp1" / "bin" / "python"  # the official Python SDK 1.x
MANY = HERE / "sdk1_many.py"
FAKESRV = ROOT / "tests" / "fakesrv.py"


@pytest.fixture(scope="session")
def everything_js() -> Path:
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: run `npm ci --prefix tests/e2e` (the README's test command does)")
    return EVERYTHING


@pytest.fixture(scope="session")
def python1() -> Path:
    if not PYTHON1.exists():
        pytest.fail(f"{PYTHON1} is missing: the README's test command creates it (mcp==1.30.0)")
    return PYTHON1


@pytest.fixture
def filesystem_js() -> Path:
    if not FILESYSTEM.exists():
        pytest.fail(f"{FILESYSTEM} is missing: run `npm ci --prefix tests/e2e`")
    return FILESYSTEM


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    return make_git_repo(tmp_path / "repo")


def fake(name: str, *modes: str, **extra: str) -> str:
    lines = [
        f"[servers.{name}]",
        f'command = "{sys.executable}"',
        "args = [" + ", ".join(f'"{a}"' for a in [str(FAKESRV), *modes]) + "]",
    ]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def time_and_git(git_repo: Path) -> str:
    """Config tables for the two PyPI reference servers."""
    return f'''
[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[servers.git]
command = "mcp-server-git"
args = ["--repository", "{git_repo}"]
'''


def write_config(tmp_path: Path, body: str, **proxy: object) -> Path:
    head = "[proxy]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in proxy.items())
    path = tmp_path / "aggregator.toml"
    path.write_text(head + body)
    return path


def proxy_argv(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config), *extra]


class RawProxy:
    """The proxy as a subprocess, spoken to line by line."""

    def __init__(self, config: Path, *extra: str) -> None:
        # stderr to a file: a pipe nobody reads would stall a chatty proxy.
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            proxy_argv(config, *extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr
        )
        self.notifications: list[dict] = []
        os.set_blocking(self.process.stdout.fileno(), True)

    def send(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def request(self, id, method, params=None):
        message = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message).encode() + b"\n")
        return self.receive()

    def receive(self):
        """The next response, keeping notifications seen on the way in ``self.notifications``."""
        while True:
            message = self.receive_any()
            if "id" in message:
                return message
            self.notifications.append(message)

    def receive_any(self):
        line = self.process.stdout.readline()
        assert line, "proxy closed stdout; stderr:\n" + self.log()
        return json.loads(line)

    def close(self, timeout: float = 15) -> tuple[int, str]:
        self.process.stdin.close()
        code = self.process.wait(timeout=timeout)
        return code, self.log()

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")


def websocket_requester(socket):
    """An async request(id, method, params) over a trio-websocket connection."""

    async def request(id, method, params):
        await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        while True:
            message = json.loads(await socket.get_message())
            if message.get("id") == id:
                return message

    return request


TOKEN = "s3cret-token-for-tests-0123456789"


@contextmanager
def http_proxy(config: Path, *extra: str, port: int | None = None):
    """``aggregator serve --http`` on ``port`` (a free one if None) of 127.0.0.1; yields the port
    and the log file. It must exit cleanly when terminated."""
    port = port or free_port()
    log = config.parent / "proxy.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator",
                "serve",
                "--http",
                f"127.0.0.1:{port}",
                "--config",
                str(config),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_listening(port, process)
            yield port, log
        finally:
            process.terminate()
            assert process.wait(timeout=15) == 0, log.read_text()


def run_per_session_everything(
    tmp_path: Path, everything_js: Path, python1: Path, script: Path, timeout: float, pass_log: bool = False
) -> dict:
    """Run ``script`` (an SDK 1.x client taking the proxy's URL, and the proxy's log path when
    ``pass_log``) against ``aggregator serve --http`` with one per-session server-everything;
    return the JSON the script prints last."""
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
isolation = "per-session"
''',
        startup_timeout=20.0,
    )
    with http_proxy(config, "--log-level", "info") as (port, log):
        argv = [str(python1), str(script), f"http://127.0.0.1:{port}/mcp", *([str(log)] if pass_log else [])]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        assert run.returncode == 0, run.stderr[-3000:] + log.read_text()[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])


def post(port, body, headers=None, path="/mcp", method="POST"):
    """One HTTP request (a POST of JSON by default) on a new connection: status, headers, body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    base = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "host": f"127.0.0.1:{port}",
    }
    base.update(headers or {})
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=data, headers={k: v for k, v in base.items() if v is not None})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, payload


def initialize(port, headers=None):
    """Initialize a Streamable HTTP session; its id."""
    status, response_headers, body = post(port, INIT, headers)
    assert status == 200, body
    return response_headers["mcp-session-id"]


def events(body: bytes) -> list[dict]:
    """The messages of a Streamable HTTP answer: one JSON body, or the data of its events."""
    if body.startswith(b"{"):
        return [json.loads(body)]
    return [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ") and line[6:].strip()]


def stateless(id, method, params=None):
    """A 2026-07-28 request without a session, and the headers it must carry: (body, headers)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": id, "method": method, "params": {**(params or {}), "_meta": meta}}
    return body, {"mcp-protocol-version": "2026-07-28", "mcp-method": method}

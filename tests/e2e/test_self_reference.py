"""A config that lists the aggregator serving it, and children that must die with the proxy.

Real processes throughout. Every process a test starts carries a marker in its environment
(the proxy through its own environment, each server through its config's ``env``), so
that what a test counts and cleans up is only what it started, orphans included.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import trio

from aggregator.core.catalogs.nesting import CHAIN_VARIABLE, MAX_DEPTH, chain_value
from aggregator.upstreams import child_process
from tests.e2e.conftest import FAKESRV, fake, post, write_config
from tests.loopback import INIT, free_port, wait_listening

pytestmark = pytest.mark.e2e
MARK = "AGG_LOOP_TEST"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")


def marked(marker: str) -> list[int]:
    """The pids of the processes whose environment holds this test's marker.

    A child between fork and exec is still a copy of its parent (same command line, same
    environment block) and would count twice for a moment: such a copy is left out. A
    real child always differs from its parent, if only by the config chain it is given.
    """
    needle = f"{MARK}={marker}\0".encode()
    found: dict[int, tuple[int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
                if needle in environ:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    found[int(entry.name)] = (ppid, environ + (entry / "cmdline").read_bytes())
            except (OSError, ValueError, IndexError):
                continue
    return [pid for pid, (ppid, image) in found.items() if ppid not in found or found[ppid][1] != image]


def aggregators(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"aggregator" in argv and b"serve" in argv:
            found.append(pid)
    return found


def kill_leftovers(marker: str) -> list[int]:
    """SIGKILL whatever this test started that is still there; return those pids."""
    left = marked(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def wait_until_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not marked(marker):
            return []
        time.sleep(0.05)
    return marked(marker)


def aggregator_entry(config: Path, marker: str, *extra: str) -> dict:
    return {
        "command": sys.executable,
        "args": ["-m", "aggregator", "serve", "--stdio", "--config", str(config), *extra],
        "env": {MARK: marker},
    }


def fake_entry(marker: str, *modes: str) -> dict:
    return {"command": sys.executable, "args": [str(FAKESRV), *modes], "env": {MARK: marker}}


def toml_of(servers: dict[str, dict], **proxy: float) -> str:
    lines = ["[proxy]", *(f"{key} = {value}" for key, value in proxy.items())]
    for name, entry in servers.items():
        lines += ["", f"[servers.{name}]"] + [
            f"{key} = {json.dumps(value)}" for key, value in entry.items() if key != "env"
        ]
        lines += [f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in entry['env'].items())} }}"]
    return "\n".join(lines) + "\n"


class Proxy:
    """``aggregator serve --stdio`` as a process carrying the marker, read with deadlines."""

    def __init__(self, config: Path, marker: str, *extra: str) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = {**os.environ, MARK: marker}
        env.pop(CHAIN_VARIABLE, None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )
        self._buffer = b""

    def request(self, id: int, method: str, params: dict | None = None, timeout: float = 20) -> dict:
        message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self._line(deadline)
            answer = json.loads(line)
            if answer.get("id") == id:
                return answer

    def _line(self, deadline: float) -> bytes:
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "no answer in time; stderr:\n" + self.log()
            if select.select([fd], [], [], left)[0]:
                data = os.read(fd, 65536)
                assert data, "the proxy closed stdout; stderr:\n" + self.log()
                self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def initialize(self) -> dict:
        answer = self.request(
            0,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "loop-test", "version": "0"}},
        )
        self.process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.process.stdin.flush()
        return answer

    def tool_names(self) -> set[str]:
        return {tool["name"] for tool in self.request(1, "tools/list")["result"]["tools"]}

    def close(self, timeout: float = 20) -> int:
        self.process.stdin.close()
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=5)

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")


def watch_counts(marker: str, seconds: float) -> tuple[int, int]:
    """The most processes, and the most aggregators, seen with the marker at once."""
    most = most_aggregators = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = marked(marker)
        most = max(most, len(pids))
        most_aggregators = max(most_aggregators, len(aggregators(pids)))
        time.sleep(0.1)
    return most, most_aggregators


def refusal(config: Path, *chain: Path) -> str:
    shown = " -> ".join(os.path.realpath(p) for p in chain)
    return (
        f"aggregator: refusing to start: config {os.path.realpath(config)} is already being served by a parent"
        f" aggregator, and a config must not list the aggregator serving it (chain: {shown})"
    )


@linux_only
def test_a_config_that_lists_itself_is_refused_and_the_rest_serves(tmp_path):
    marker = uuid.uuid4().hex
    config = tmp_path / "aggregator.toml"
    config.write_text(toml_of({"me": aggregator_entry(config, marker), "a": fake_entry(marker)}))
    proxy = Proxy(config, marker, "--log-level", "info")
    try:
        assert "result" in proxy.initialize()
        assert proxy.tool_names() >= {"a__echo", "a__add"}
        answer = proxy.request(2, "tools/call", {"name": "a__add", "arguments": {"a": 2, "b": 3}})
        assert "result" in answer, answer
        # The proxy, its fake server, at most one copy of itself (refusing, about to exit).
        most, most_aggregators = watch_counts(marker, 4.0)
        assert most <= 3 and most_aggregators <= 2, (most, most_aggregators)
        assert proxy.process.poll() is None
    finally:
        code = proxy.close()
        left = kill_leftovers(marker)
    log = proxy.log()
    assert code == 0, log
    assert not left, f"outlived the proxy: {left}"
    assert refusal(config, config, config) in log
    attempts = log.count("server me did not start: the server exited with status 1")
    assert 1 <= attempts <= 10, log  # the restart backoff holds: no tight loop
    assert "Traceback" not in log

    # check and tools show the server that did not start, with the reason as its stderr tail.
    env = {**os.environ, MARK: marker}
    env.pop(CHAIN_VARIABLE, None)
    try:
        check = subprocess.run(
            [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        left = kill_leftovers(marker)
    assert check.returncode == 1
    assert "  me                   down     the server exited with status 1" in check.stdout
    # The stderr tail is cut at 300 characters: what matters comes first.
    assert f"[stderr] {refusal(config, config, config)}"[:300] in check.stdout
    assert "a                    ready" in check.stdout
    assert not left


@linux_only
def test_a_client_file_served_directly_that_starts_the_aggregator_on_itself(tmp_path):
    """A Claude Desktop file that lists the aggregator serving that very file, served
    through a symlink: paths are compared resolved."""
    marker = uuid.uuid4().hex
    real = tmp_path / "claude_desktop_config.json"
    link = tmp_path / "link" / "mcp.json"
    link.parent.mkdir()
    link.symlink_to(real)
    real.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "aggregator": aggregator_entry(real, marker),
                    "files": fake_entry(marker),
                }
            }
        )
    )
    proxy = Proxy(link, marker, "--log-level", "info")
    try:
        assert "result" in proxy.initialize()
        names = proxy.tool_names()
        assert "files__echo" in names and not any(name.startswith("aggregator__") for name in names)
        most, most_aggregators = watch_counts(marker, 3.0)
        assert most <= 3 and most_aggregators <= 2, (most, most_aggregators)
    finally:
        code = proxy.close()
        left = kill_leftovers(marker)
    log = proxy.log()
    assert code == 0 and not left, (left, log)
    assert refusal(real, real, real) in log  # link resolved: the same file, named once


@linux_only
def test_two_configs_that_serve_each_other(tmp_path):
    marker = uuid.uuid4().hex
    a, b = tmp_path / "a.toml", tmp_path / "b" / "b.toml"
    b.parent.mkdir()
    a.write_text(toml_of({"b": aggregator_entry(b, marker, "--log-level", "info"), "fa": fake_entry(marker)}))
    b.write_text(toml_of({"a": aggregator_entry(a, marker), "fb": fake_entry(marker)}))
    proxy = Proxy(a, marker, "--log-level", "info")
    try:
        assert "result" in proxy.initialize()
        assert proxy.tool_names() >= {"fa__echo", "b__fb__echo"}
        answer = proxy.request(2, "tools/call", {"name": "b__fb__add", "arguments": {"a": 1, "b": 1}})
        assert "result" in answer, answer
        # a, its fake, b, b's fake, and at most one refusing copy of a below b.
        most, most_aggregators = watch_counts(marker, 4.0)
        assert most <= 5 and most_aggregators <= 3, (most, most_aggregators)
    finally:
        code = proxy.close()
        left = kill_leftovers(marker)
    log = proxy.log()
    assert code == 0 and not left, (left, log)
    # b logged its server's refusal in full (its stderr tail is cut); a logs b's stderr.
    assert refusal(a, a, b, a)[len("aggregator: ") :] in log


@linux_only
@pytest.mark.parametrize(
    ("chain", "message"),
    [
        (
            [f"/nowhere/copy{i}.toml" for i in range(MAX_DEPTH)],
            f"aggregator: refusing to start: {MAX_DEPTH} aggregators are already running one inside the other, and a"
            " config must not list, directly or through other configs, the aggregator serving it (chain:"
            " /nowhere/copy0.toml -> ",
        ),
        (None, f"aggregator: refusing to start: {CHAIN_VARIABLE} is set to '/a.toml:/b.toml', which is not a chain"),
    ],
)
def test_a_chain_too_deep_or_unreadable_stops_every_command(tmp_path, chain, message):
    config = tmp_path / "aggregator.toml"
    config.write_text(toml_of({"a": fake_entry("unused")}))
    env = {**os.environ, CHAIN_VARIABLE: chain_value(chain) if chain else "/a.toml:/b.toml"}
    for command in (["serve", "--stdio"], ["check"], ["tools"]):
        result = subprocess.run(
            [sys.executable, "-m", "aggregator", *command, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 1, result
        assert result.stderr.startswith(message), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@linux_only
def test_a_killed_proxy_takes_its_children_and_theirs_along(tmp_path):
    """SIGKILL runs no ladder: the kernel's parent-death signal stops a real server, a server
    that ignores the end of its stdin, and a nested aggregator with its own servers."""
    marker = uuid.uuid4().hex
    inner = tmp_path / "inner.toml"
    inner.write_text(toml_of({"deep": fake_entry(marker, "linger")}))
    outer = tmp_path / "outer.toml"
    outer.write_text(
        toml_of(
            {
                "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {MARK: marker}},
                "stubborn": fake_entry(marker, "linger"),
                "nested": aggregator_entry(inner, marker),
            }
        )
    )
    proxy = Proxy(outer, marker)
    try:
        assert "result" in proxy.initialize()
        assert proxy.tool_names() >= {"time__get_current_time", "stubborn__echo", "nested__deep__echo"}
        # Five: the proxy, time, stubborn, the nested aggregator and its server.
        assert len(marked(marker)) == 5, marked(marker)
        proxy.process.kill()
        proxy.process.wait(timeout=5)
        left = wait_until_gone(marker, 5.0)
    finally:
        leftovers = kill_leftovers(marker)
        proxy.close()
    assert not left, f"outlived a killed proxy: {left}"
    assert not leftovers


@linux_only
def test_end_of_input_during_startup_stops_the_proxy_and_its_servers(tmp_path):
    marker = uuid.uuid4().hex
    config = tmp_path / "aggregator.toml"
    config.write_text(
        toml_of(
            {
                "slow": {**fake_entry(marker, "hang_init"), "init_timeout": 30.0},
                "stubborn": fake_entry(marker, "linger"),
            },
            startup_timeout=30.0,
        )
    )
    env = {**os.environ, MARK: marker}
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "aggregator", "serve", "--stdio", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            env=env,
        )
        took = time.monotonic() - started
        left = wait_until_gone(marker, 2.0)
    finally:
        leftovers = kill_leftovers(marker)
    assert result.returncode == 0, result.stderr
    assert took < 10, took  # the stop ladder (2 s to close stdin, 2 s after SIGTERM), not startup_timeout
    assert not left and not leftovers


@pytest.mark.skipif(child_process._PRCTL is None, reason="children are tied to the proxy only on Linux")
async def test_a_child_outlives_the_threads_that_forked_nothing(monkeypatch):
    """The parent-death signal follows the thread that forked the child. trio's worker
    threads exit when idle (ten seconds; here a twentieth of one): a child forked by one of
    them would be killed then. Ours are forked by a thread that lives with the process."""
    from trio._core import _thread_cache

    monkeypatch.setattr(_thread_cache, "IDLE_TIMEOUT", 0.05)
    with trio.fail_after(20):
        process = await child_process.open_child(sys.executable, [str(FAKESRV)], {}, None)
        try:
            for _ in range(3):  # worker threads come and go meanwhile
                await trio.to_thread.run_sync(time.sleep, 0.01)
                await trio.sleep(0.4)
            assert process.returncode is None, "the child died with an idle worker thread"
        finally:
            await child_process.stop_child(process, "t", grace=2)
        assert process.returncode == 0  # it stopped at the end of its stdin


def test_a_server_env_never_replaces_the_chain(monkeypatch):
    monkeypatch.setenv(CHAIN_VARIABLE, '["/a.toml"]')
    assert child_process.child_environment({CHAIN_VARIABLE: "[]", "X": "1"})[CHAIN_VARIABLE] == '["/a.toml"]'
    monkeypatch.delenv(CHAIN_VARIABLE)
    assert CHAIN_VARIABLE not in child_process.child_environment({CHAIN_VARIABLE: "[]"})


def test_a_config_that_lists_its_own_url_is_refused_and_the_rest_serves(tmp_path):
    """No child process is involved when a config lists the proxy's own `--http` URL, so the
    environment chain cannot see it: the proxy names itself in its initialize result, and
    an upstream that answers with that name is refused (before, its names nested for ever:
    self__self__...)."""
    from tests.e2e.conftest import initialize, post
    from tests.loopback import free_port, wait_listening

    port = free_port()
    config = tmp_path / "aggregator.toml"
    config.write_text(f"""[proxy]
startup_timeout = 5.0

[servers.self]
url = "http://127.0.0.1:{port}/mcp"

[servers.a]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(FAKESRV))}]
""")
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
            "--log-level",
            "info",
        ],
        stdin=subprocess.DEVNULL,
        stderr=open(tmp_path / "self.log", "wb"),
    )  # noqa: SIM115
    try:
        wait_listening(port, process)
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline and "this aggregator itself" not in text:
            time.sleep(0.2)
            text = (tmp_path / "self.log").read_text()
        assert "it is this aggregator itself" in text, text[-2000:]
        session = initialize(port)
        names = []
        for _ in range(3):  # stays so: nothing of 'self' comes and goes
            status, _, body = post(
                port, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, {"mcp-session-id": session}
            )
            assert status == 200, body
            listed = [tool["name"] for tool in json.loads(body)["result"]["tools"]]
            names.append(listed)
            time.sleep(0.5)
        assert names[0] and all(name.startswith("a__") for name in names[0]), names[0]
        assert names[0] == names[1] == names[2]
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0


@pytest.mark.parametrize("pin", ["", 'protocol = "2025-11-25"\n', 'protocol = "2025-03-26"\n'])
def test_a_config_that_lists_its_own_url_is_refused_at_once(tmp_path, pin):
    """The proxy's own requests name it (a probe's ``_meta``; a legacy initialize's
    experimental capabilities, which carries no ``_meta``); the proxy refuses them at once
    rather than holding them until its own startup completes, which waits for that server."""
    port = free_port()
    config = write_config(
        tmp_path,
        f'[servers.me]\nurl = "http://127.0.0.1:{port}/mcp"\n{pin}' + fake("a"),
        startup_timeout=20.0,
    )
    log = tmp_path / "proxy.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_listening(port, process)
            start = time.monotonic()
            status, _, body = post(port, INIT)  # answered once startup completes
            assert status == 200 and b'"result"' in body, body
            assert time.monotonic() - start < 5.0, log.read_text()  # not startup_timeout (20 s)
        finally:
            process.terminate()
            code = process.wait(timeout=15)
    text = log.read_text()
    assert code == 0, text
    assert f"server me did not start: it is this aggregator itself (http://127.0.0.1:{port}/mcp leads back" in text
    assert "Traceback" not in text

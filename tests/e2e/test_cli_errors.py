"""The console script as a user runs it: a mistake in the config or on the command line is
a clear message and a non-zero exit, never a traceback, and leaves no server running."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import fake, proxy_argv, write_config

SCRIPT = Path(sys.executable).with_name("aggregator")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "aggregator"]
    out = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def processes_mentioning(marker: str) -> list[int]:
    """Processes (other than ours) whose command line holds marker."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("proxy", "expected"),
    [
        ("startup_timeout = nan", "proxy.startup_timeout: must be a finite number of seconds from 0 to 86400, got nan"),
        ("drain_timeout = nan", "proxy.drain_timeout: must be a finite number of seconds from 0 to 86400, got nan"),
        ("max_in_flight_per_session = 0", "proxy.max_in_flight_per_session: must be an integer (requests) from 1"),
        ("page_size = -1", "proxy.page_size: must be an integer (items) from 1 to 100000, got -1"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "check"])
def test_a_bad_number_is_refused_before_anything_starts(tmp_path, command, proxy, expected):
    config = tmp_path / "aggregator.toml"
    config.write_text(f"[proxy]\n{proxy}\n" + fake("a", "echo"))
    out = run(command, "--config", str(config))
    assert out.returncode == 2 and expected in out.stderr, out.stderr
    assert "ok" not in out.stdout


def test_import_of_a_non_string_argument(tmp_path):
    source = tmp_path / "claude.json"
    source.write_text('{"mcpServers": {"a": {"command": "x", "args": [1, true, null]}}}')
    out = run("import", str(source))
    assert out.returncode == 2 and out.stdout == ""
    assert "mcpServers.a.args[0]: expected a string, got a number (1)" in out.stderr
    assert "mcpServers.a.args[2]: expected a string, got nothing" in out.stderr


@pytest.mark.parametrize("option", ["--http", "--ws"])
def test_a_busy_port_is_one_line_and_leaves_no_server(tmp_path, option):
    marker = f"marker-{os.getpid()}-{option.strip('-')}-{time.monotonic_ns()}"
    config = write_config(tmp_path, fake("a", "echo", marker))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        out = run("serve", "--config", str(config), option, address, "--log-level", "warning")
    assert out.returncode == 1, out.stderr
    lines = [line for line in out.stderr.splitlines() if "WARNING" not in line]
    assert lines == [f"aggregator: cannot listen on {address}: Address already in use"], out.stderr
    assert processes_mentioning(marker) == []


def test_the_same_address_for_http_and_websocket(tmp_path):
    config = write_config(tmp_path, fake("a", "echo"))
    out = run("serve", "--config", str(config), "--http", "127.0.0.1:18777", "--ws", "localhost:18777")
    assert out.returncode == 2
    assert "--http 127.0.0.1:18777 and --ws localhost:18777 name the same address" in out.stderr


def test_check_refuses_what_serve_refuses(tmp_path):
    config = write_config(tmp_path, '[http]\nlisten = "0.0.0.0:18778"\n' + fake("a", "echo"))
    for command in ("check", "serve"):
        out = run(command, "--config", str(config))
        assert out.returncode == 2 and "refusing to serve on 0.0.0.0 without authentication" in out.stderr
        assert "ok" not in out.stdout
    plugin = write_config(tmp_path, fake("a", "echo") + '[[plugins]]\nuse = "rate-limit"\noptions = { rate = -1 }\n')
    out = run("check", "--config", str(plugin))
    assert out.returncode == 2 and "ok" not in out.stdout
    assert "plugins[0].options.rate: must be a finite number of requests a second > 0, got -1" in out.stderr
    typed = write_config(tmp_path, fake("a", "echo") + '[[plugins]]\nuse = "rate-limit"\noptions = { rate = "fast" }\n')
    out = run("check", "--config", str(typed))
    assert out.returncode == 2 and "ok" not in out.stdout
    assert "plugins[0].options.rate: expected a number, got the string 'fast'" in out.stderr


BROKEN = """import sys
print("starting", file=sys.stderr)
print("no repository at /nonexistent/repo; key s3cr3t-v4lue", file=sys.stderr)
sys.exit(1)
"""


def broken_server(tmp_path: Path) -> str:
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    return (
        f'[servers.broken]\ncommand = "{sys.executable}"\nargs = ["{script}"]\nenv = {{ API_KEY = "s3cr3t-v4lue" }}\n'
    )


def test_check_and_tools_say_why_a_server_did_not_start(tmp_path):
    config = write_config(tmp_path, broken_server(tmp_path), restart_backoff_initial=5.0, restart_backoff_max=5.0)
    out = run("check", "--config", str(config))
    assert out.returncode == 1
    assert "broken" in out.stdout and "the server exited with status 1" in out.stdout
    assert "[stderr] no repository at /nonexistent/repo; key ***" in out.stdout, out.stdout
    assert "s3cr3t" not in out.stdout + out.stderr
    # every server down: tools says so on stderr, with the reason, and fails
    out = run("tools", "--config", str(config))
    assert out.returncode == 1 and out.stdout == ""
    assert "no server is ready" in out.stderr and "no repository at /nonexistent/repo" in out.stderr
    assert "s3cr3t" not in out.stderr
    # serve's warning carries the same lines
    serve = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "serve", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        warning = ""
        while time.monotonic() < deadline and "did not start" not in warning:
            warning = serve.stderr.readline()
            if not warning:
                break
    finally:
        serve.stdin.close()
        serve.wait(30)
        serve.stderr.close()
    assert "its stderr ended: starting | no repository at /nonexistent/repo; key ***" in warning, warning
    # one server up, one down: the catalog is printed and the broken one named on stderr
    mixed = write_config(tmp_path, broken_server(tmp_path) + fake("a", "echo"))
    out = run("tools", "--config", str(mixed), "--json")
    assert out.returncode == 0 and "a__echo" in [t["name"] for t in json.loads(out.stdout)["tools"]]
    assert "broken" in out.stderr and "s3cr3t" not in out.stderr


def test_a_server_that_exits_at_start_is_reported_once_as_having_exited(tmp_path):
    """It is retried while another server keeps startup waiting; check says what happened
    once, on stdout, and the log does not call it a legacy server."""
    pins = tmp_path / "pins.json"
    config = write_config(
        tmp_path,
        fake("dead", "exit_at_start")
        + fake("slow", "hang_init", init_timeout="3.0")
        + f'[[plugins]]\nuse = "pin-definitions"\noptions = {{ path = "{pins}" }}\n',
        restart_backoff_initial=0.1,
        restart_backoff_max=0.2,
    )
    out = run("check", "--config", str(config))
    assert out.returncode == 1
    assert out.stderr == "", out.stderr  # no warning per retry, no "serving without"
    [line] = [line for line in out.stdout.splitlines() if "dead" in line]
    assert line.split() == ["dead", "down", "the", "server", "exited", "with", "status", "3"], out.stdout
    assert "[stderr] fake server: exiting at start on purpose" in out.stdout
    # What the log says of it (at info) is what happened, plainly.
    out = run("check", "--config", str(config), "--log-level", "info")
    assert "server dead: the server exited with status 3 before answering server/discover" in out.stderr
    about_dead = [line for line in out.stderr.splitlines() if "server dead" in line]
    assert not [line for line in about_dead if "legacy" in line], out.stderr
    assert len([line for line in about_dead if "server dead did not start" in line]) > 1, out.stderr
    # approve, quiet too, names it on stderr instead
    out = run("approve", "--config", str(config))
    assert out.returncode == 0 and "approved: nothing" in out.stdout
    [line] = out.stderr.splitlines()[:1]
    assert line.split()[:3] == ["dead", "down", "the"] and "did not start" not in out.stderr, out.stderr


def test_approve_of_an_unknown_tool(tmp_path):
    pins = tmp_path / "pins.json"
    config = write_config(
        tmp_path, fake("a", "echo") + f'[[plugins]]\nuse = "pin-definitions"\noptions = {{ path = "{pins}" }}\n'
    )
    out = run("approve", "--config", str(config), "nosuch")
    assert out.returncode == 1
    assert "no quarantined tool named nosuch" in out.stderr
    out = run("approve", "--config", str(config))
    assert out.returncode == 0 and "approved: nothing" in out.stdout


def test_each_command_logs_at_the_level_its_help_names(tmp_path):
    """serve logs at info unless told otherwise; tools, check and approve at warning (their
    output is the report). Each --help names its own default. (The defaults of one command
    used to leak into every other, so serve logged only warnings.)"""
    from tests.e2e.unreadable_server import Hostile

    hostile = Hostile()  # a Streamable HTTP server: its client library must not log every request at info
    try:
        config = write_config(
            tmp_path,
            fake("a", "echo") + f'[servers.h]\nurl = "http://127.0.0.1:{hostile.port}/mcp"\n',
            startup_timeout=10.0,
        )
        init = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            }
        )
        argv = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "aggregator"]
        serve = subprocess.run(
            [*argv, "serve", "--stdio", "--config", str(config)],
            input=init + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        check = run("check", "--config", str(config))
    finally:
        hostile.close()
    assert serve.returncode == 0 and '"result"' in serve.stdout, serve.stderr
    assert " INFO aggregator.server.a: server a: initialized" in serve.stderr, serve.stderr
    assert " INFO aggregator.server.h: server h: initialized" in serve.stderr, serve.stderr
    assert "HTTP Request:" not in serve.stderr, serve.stderr
    assert check.returncode == 0 and " INFO " not in check.stderr, check.stderr
    for command, default in (("serve", "info"), ("tools", "warning"), ("check", "warning"), ("approve", "warning")):
        text = " ".join(run(command, "--help").stdout.split())
        assert f"how much to log to stderr (default: {default})" in text, (command, text)


def test_no_command_prints_the_usage():
    out = run()
    assert out.returncode == 2 and "usage: aggregator" in out.stderr and "serve" in out.stderr, out.stderr


def test_a_server_that_never_answers_has_a_reason(tmp_path):
    """Still starting when check reports: how long it has had and what its stderr said,
    not an empty reason."""
    config = write_config(
        tmp_path, fake("slow", "hang_init", init_timeout="30.0") + fake("a", "echo"), startup_timeout=1.0
    )
    out = run("check", "--config", str(config))
    assert out.returncode == 1, out.stdout + out.stderr
    line = next(line for line in out.stdout.splitlines() if line.strip().startswith("slow"))
    assert "starting no answer yet after 1." in " ".join(line.split()), line
    assert "(servers.slow.init_timeout = 30s)" in line, line
    assert "[stderr] fake server started with modes ['hang_init']" in out.stdout, out.stdout
    out = run("tools", "--config", str(config))
    assert out.returncode == 0 and "slow" in out.stderr and "no answer yet after" in out.stderr, out.stderr
    # serve's log says it once startup_timeout has passed
    serve = subprocess.Popen(
        [sys.executable, "-m", "aggregator", "serve", "--config", str(config), "--log-level", "warning"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "is not ready" not in seen:
            line = serve.stderr.readline()
            if not line:
                break
            seen += line
    finally:
        serve.stdin.close()
        serve.wait(30)
        serve.stderr.close()
    assert "server slow is not ready: no answer yet after 1." in seen, seen
    assert "its stderr so far: fake server started with modes ['hang_init']" in seen, seen


def wait_for_line(process: subprocess.Popen[str], text: str, seconds: float = 30) -> str:
    """Read the process's stderr until a line holding text (bounded); return what was read."""
    seen = ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and text not in seen:
        line = process.stderr.readline()
        if not line:
            break
        seen += line
    return seen


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize(
    "command", [["serve"], ["serve", "--http"], ["serve", "--ws"], ["check"], ["tools"], ["approve"]]
)
def test_ctrl_c_exits_130_without_a_traceback(tmp_path, command):
    """Ctrl-C while the servers start (a server that never answers keeps every command waiting).

    The command is started with SIGINT ignored, as a shell starts a background job (`cmd &`)
    and as whatever ran these tests may have: every command must stop on it all the same."""
    config = write_config(tmp_path, fake("slow", "hang_init", init_timeout="30.0"), startup_timeout=30.0)
    if command[-1].startswith("--"):
        command = [*command, free_address()]
    process = subprocess.Popen(
        [sys.executable, "-m", "aggregator", *command, "--config", str(config), "--log-level", "info"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        seen = wait_for_line(process, "fake server started")
        assert "fake server started" in seen, seen
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 130, seen + rest
    assert "Traceback" not in seen + rest, seen + rest


def test_a_busy_port_is_found_before_any_server_starts(tmp_path):
    config = write_config(tmp_path, fake("a", "echo"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        out = run("serve", "--config", str(config), "--stdio", "--http", address, "--log-level", "debug")
    assert out.returncode == 1, out.stderr
    assert f"aggregator: cannot listen on {address}: Address already in use" in out.stderr
    assert "started pid" not in out.stderr, out.stderr


def test_a_terminal_is_told_the_urls(tmp_path):
    """At a terminal serve prints where it listens (every front, real ports), whatever the
    log level, and the servers once they started."""
    import pty

    config = write_config(tmp_path, fake("a", "echo"))
    with socket.socket() as first, socket.socket() as second:  # two distinct free ports
        first.bind(("127.0.0.1", 0))
        second.bind(("127.0.0.1", 0))
        http_port, ws_port = first.getsockname()[1], second.getsockname()[1]
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [
            *proxy_argv(config),
            "--http",
            f"127.0.0.1:{http_port}",
            "--ws",
            f"127.0.0.1:{ws_port}",
            "--log-level",
            "error",
        ],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    try:
        os.set_blocking(leader, False)
        deadline = time.monotonic() + 30
        while b"Ctrl-D stops it" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(leader, 65536)
            except BlockingIOError:
                time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        os.close(leader)
    text = seen.decode().replace("\r\n", "\n")
    assert "is serving MCP at\n" in text, text
    http = re.search(
        r"  http://127\.0\.0\.1:(\d+)/mcp  \(Streamable HTTP; HTTP\+SSE at http://127\.0\.0\.1:(\d+)/sse\)", text
    )
    ws = re.search(r"  ws://127\.0\.0\.1:(\d+)/mcp  \(WebSocket\)", text)
    assert http and ws and http.group(1) == http.group(2) == str(http_port) and ws.group(1) == str(ws_port), text
    assert "  stdin/stdout\n" in text and "a                    ready" in text, text
    assert process.returncode == 130


def test_json_log_lines(tmp_path):
    config = write_config(tmp_path, fake("a", "echo"))
    out = run("check", "--config", str(config), "--log-format", "json", "--log-level", "info")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines), lines
    started = next(line for line in lines if line["message"].startswith("server a: started pid"))
    assert started["level"] == "info" and started["logger"] == "aggregator.server.a", started
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", started["time"]), started


@pytest.mark.parametrize("command", ["serve", "check"])
def test_a_control_character_in_a_key_name_is_shown_escaped(tmp_path, command):
    config = tmp_path / "aggregator.toml"
    config.write_text('[servers."x\\u001b[31mRED\\u0007\\r"]\ncommand = 5\n')
    out = run(command, "--config", str(config))
    assert out.returncode == 2, out.stderr
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", out.stderr), repr(out.stderr)
    assert "servers.x\\x1b[31mRED\\x07\\x0d.command: expected a string, got a number (5)" in out.stderr


def test_ctrl_c_while_the_command_line_loads_is_quiet():
    # Ctrl-C arriving exactly while the parser's module is imported, made certain by a finder.
    script = (
        "import sys\n"
        "class Interrupting:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'aggregator.cli.arguments':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupting())\n"
        "import aggregator.cli\n"
        "raise SystemExit(aggregator.cli.main(['check']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")

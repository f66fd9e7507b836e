"""Every command, given what a user gets wrong: a missing or broken file, a bad option value,
an unknown name, a port in use. Each ends with its exit status and a line that says what is
wrong, and never a traceback, on stdout or stderr."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import fake

SERVER = fake("a", "echo")
FILES = {
    "broken.toml": "[servers.a\ncommand = 'x'\n",
    "binary.toml": b"\xff\xfe\x00[servers]",
    "bad.json": '{"mcpServers": {"a": {"command": "x",}}}',
    "list.json": "[1, 2]",
    "good.json": '{"mcpServers": {"a": {"command": "x"}}}',
    "unknown-key.toml": "[proxy]\nbogus = 1\n" + SERVER,
    "misspelt.toml": '[proxy]\nseperator = "__"\n[servers.a]\ncomand = "x"\n',
    "empty.toml": "[proxy]\n",
    "disabled.toml": SERVER + "enabled = false\n",
    "unknown-server.toml": '[profiles.p.servers.nosuch.tools]\nallow = ["x"]\n' + SERVER,
    "no-command.toml": '[servers.a]\ncommand = "no-such-command-for-the-aggregator"\n',
    "ok.toml": SERVER,
    "pins.toml": SERVER + '[[plugins]]\nuse = "pin-definitions"\noptions = { path = "pins.json" }\n',
}

CONFIG_MISTAKES = [
    (["--config", "missing.toml"], 2, "cannot read missing.toml: No such file or directory"),
    (["--config", "."], 2, "cannot read .: Is a directory"),
    (["--config", "broken.toml"], 2, "not valid TOML: Expected ']' at the end of a table declaration"),
    (["--config", "binary.toml"], 2, "not valid TOML"),
    (["--config", "bad.json"], 2, "not valid JSON"),
    (["--config", "list.json"], 2, "expected a JSON object with `mcpServers` or `servers`"),
    (["--config", "unknown-key.toml"], 2, "proxy.bogus: unknown key\n"),
    (["--config", "misspelt.toml"], 2, "proxy.seperator: unknown key; did you mean `separator`?\n"),
    (["--config", "misspelt.toml"], 2, "servers.a.comand: unknown key; did you mean `command`?\n"),
    (["--config", "unknown-server.toml"], 2, "profiles.p.servers.nosuch: no such server"),
    (["--config", "ok.toml", "--log-level", "loud"], 2, "argument --log-level: invalid choice: 'loud'"),
    (["--config", "ok.toml", "--log-format", "yaml"], 2, "argument --log-format: invalid choice: 'yaml'"),
    ([], 2, "no aggregator.toml here; pass --config PATH"),
]

CASES = [
    ([], 2, "usage: aggregator"),
    (["bogus"], 2, "argument COMMAND: invalid choice: 'bogus'"),
    (["--bogus"], 2, "unrecognized arguments: --bogus"),
    (["serve", "--config", "ok.toml", "--bogus"], 2, "aggregator serve: error: unrecognized arguments: --bogus"),
    (["check", "--config", "ok.toml", "extra"], 2, "aggregator check: error: unrecognized arguments: extra"),
    *[
        ([command, *args], status, said)
        for command in ("serve", "tools", "check", "approve")
        for args, status, said in CONFIG_MISTAKES
    ],
    (
        ["serve", "--config", "ok.toml", "--http", "abc"],
        2,
        "--http: expected HOST:PORT such as 127.0.0.1:8000, got 'abc'",
    ),
    (["serve", "--config", "ok.toml", "--ws", "127.0.0.1:99999"], 2, "--ws: expected HOST:PORT"),
    (["serve", "--config", "ok.toml", "--http", "BUSY"], 1, "cannot listen on BUSY: Address already in use"),
    (["serve", "--config", "ok.toml", "--ws", "BUSY"], 1, "cannot listen on BUSY: Address already in use"),
    (["serve", "--config", "ok.toml", "--stdio", "--http", "BUSY"], 1, "cannot listen on BUSY: Address already in use"),
    (
        ["serve", "--config", "ok.toml", "--http", "127.0.0.1:18799", "--ws", "127.0.0.1:18799"],
        2,
        "name the same address",
    ),
    (["tools", "--config", "ok.toml", "--profile", "nosuch"], 2, "--profile: no profile 'nosuch' (known: default)"),
    (["tools", "--config", "no-command.toml"], 1, "command not found: 'no-such-command-for-the-aggregator'"),
    (["check", "--config", "no-command.toml"], 1, ""),
    (
        ["check", "--config", "empty.toml"],
        1,
        "aggregator: config empty.toml has nothing to serve: it lists no servers\n",
    ),
    (["check", "--config", "disabled.toml"], 1, "has nothing to serve: every server in it is disabled (a)\n"),
    (
        ["tools", "--config", "empty.toml"],
        1,
        "aggregator: config empty.toml has nothing to serve: it lists no servers\n",
    ),
    (
        ["serve", "--config", "empty.toml"],
        0,
        "config empty.toml has nothing to serve: it lists no servers; clients see",
    ),
    (
        ["approve", "--config", "ok.toml"],
        2,
        'no plugin here approves definitions: add [[plugins]] use = "pin-definitions"',
    ),
    (["approve", "--config", "pins.toml", "nosuch"], 1, "no quarantined tool named nosuch"),
    (["import"], 2, "the following arguments are required: FILE.json"),
    (["import", "missing.json"], 2, "cannot read missing.json: No such file or directory"),
    (["import", "."], 2, "cannot read .: Is a directory"),
    (["import", "bad.json"], 2, "not valid JSON"),
    (["import", "list.json"], 2, "expected a JSON object with `mcpServers` or `servers`"),
    (["import", "binary.toml"], 2, "not valid JSON"),
    (["import", "good.json", ">/dev/full"], 1, "aggregator: cannot write the output: No space left on device"),
    (["tools", "--config", "ok.toml", ">/dev/full"], 1, "aggregator: cannot write the output: No space left on device"),
]


@pytest.mark.parametrize(
    ("argv", "status", "said"), CASES, ids=lambda value: " ".join(value) if isinstance(value, list) else None
)
def test_a_mistake_is_a_line_and_an_exit_status(tmp_path: Path, argv: list[str], status: int, said: str) -> None:
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    stdout_to = None
    if argv and argv[-1].startswith(">"):
        stdout_to = open(argv[-1][1:], "wb")  # noqa: SIM115 - closed below
        argv = argv[:-1]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        argv = [address if a == "BUSY" else a for a in argv]
        said = said.replace("BUSY", address)
        try:
            out = subprocess.run(
                [sys.executable, "-m", "aggregator", *argv],
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=stdout_to or subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=60,
            )
        finally:
            if stdout_to is not None:
                stdout_to.close()
    stdout = (out.stdout or b"").decode(errors="replace")
    stderr = out.stderr.decode(errors="replace")
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert out.returncode == status, stdout + stderr
    assert said in stderr, stderr

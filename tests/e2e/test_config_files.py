"""Config files as a user meets them: `import` with any server name, writing its output
whole or not at all, and a client's JSON file with its envFile and tool filters served as
it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

from tests.e2e.conftest import RawProxy
from tests.loopback import INIT

ROOT = Path(__file__).parents[2]


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    return out


def test_import_derives_keys_and_writes_its_output_only_on_success(tmp_path):
    good = tmp_path / "claude.json"
    good.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "Brave Search": {"command": "npx", "args": ["-y", "brave"], "env": {"KEY": "${BRAVE_KEY}"}},
                    "Zeit.Server ü": {"command": "mcp-server-time"},
                }
            }
        )
    )
    out = run("import", str(good))
    assert out.returncode == 0, out.stderr
    loaded = tomllib.loads(out.stdout)
    assert list(loaded["servers"]) == ["brave_search", "zeit_server_u"]
    assert "# 'Brave Search' in claude.json" in out.stdout and "${BRAVE_KEY}" in out.stdout

    target = tmp_path / "out.toml"
    out = run("import", str(good), "--output", str(target))
    assert out.returncode == 0 and out.stdout == "" and tomllib.loads(target.read_text()) == loaded

    bad = tmp_path / "vscode.json"
    bad.write_text(json.dumps({"servers": {"gh": {"url": "https://127.0.0.1:9/", "headers": {"A": "${input:tok}"}}}}))
    before = target.read_text()
    out = run("import", str(bad), "--output", str(target))
    assert out.returncode == 2 and out.stdout == ""
    assert "servers.gh.headers.A: ${input:...} is another program's syntax" in out.stderr
    assert target.read_text() == before  # a failed import leaves the file as it was
    missing = tmp_path / "never.toml"
    assert run("import", str(bad), "-o", str(missing)).returncode == 2 and not missing.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_cursor_file_with_an_env_file_serves_from_any_directory(tmp_path):
    """The JSON file as Cursor keeps it: the server's variables in an envFile beside it."""
    folder = tmp_path / ".cursor"
    folder.mkdir()
    (folder / "time.env").write_text("# the server's variables\nTZ_NAME='UTC'\n")
    (folder / "mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "Time Server": {
                        "command": "mcp-server-time",
                        "args": ["--local-timezone", "UTC"],
                        "envFile": "time.env",
                    }
                }
            }
        )
    )
    out = run("check", "--config", str(folder / "mcp.json"), cwd=Path("/"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "time_server" in out.stdout and "ready" in out.stdout


def test_import_refuses_to_write_over_the_file_it_imports(tmp_path):
    source = tmp_path / "claude.json"
    text = json.dumps({"mcpServers": {"time": {"command": "mcp-server-time"}}})
    source.write_text(text)
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(source)
    hard = tmp_path / "hard.json"
    hard.hardlink_to(source)
    for output, cwd in (
        (str(source), None),
        ("claude.json", tmp_path),
        ("sub/../claude.json", tmp_path),
        (str(link), None),
        (str(hard), None),
    ):
        out = run("import", str(source), "--output", output, cwd=cwd)
        assert out.returncode == 1, (output, out.stderr)
        assert (
            out.stderr
            == f"aggregator: --output {output} is the file being imported; name another file (aggregator.toml)\n"
        )
        assert source.read_text() == text and link.is_symlink()
    out = run("import", "link.json", "--output", "claude.json", cwd=tmp_path)
    assert out.returncode == 1 and "is the file being imported" in out.stderr and source.read_text() == text


def test_a_client_files_excluded_tool_is_hidden_and_refused(tmp_path):
    """excludeTools / includeTools of a Cursor-style file, served as they are and imported."""
    source = tmp_path / "mcp.json"
    source.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {
                        "command": "mcp-server-time",
                        "args": ["--local-timezone", "UTC"],
                        "includeTools": ["get_current_time", "convert_time"],
                        "excludeTools": ["convert_time"],
                    }
                }
            }
        )
    )
    proxy = RawProxy(source)
    watchdog = threading.Timer(60, proxy.process.kill)  # bounds every read below: a hang ends in EOF
    watchdog.start()
    try:
        assert "result" in proxy.request(1, INIT["method"], INIT["params"])
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        tools = [tool["name"] for tool in proxy.request(2, "tools/list")["result"]["tools"]]
        assert tools == ["time__get_current_time"], tools
        arguments = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}
        refused = proxy.request(3, "tools/call", {"name": "time__convert_time", "arguments": arguments})
        assert refused["error"]["code"] == -32602, refused
        allowed = proxy.request(4, "tools/call", {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}})
        assert "result" in allowed and not allowed["result"].get("isError"), allowed
    finally:
        code, log = proxy.close()
        watchdog.cancel()
    assert code == 0, log

    out = run("import", str(source))
    assert out.returncode == 0, out.stderr
    table = tomllib.loads(out.stdout)["servers"]["time"]
    assert table["tools"] == {"allow": ["get_current_time", "convert_time"], "deny": ["convert_time"]}


def test_a_lone_surrogate_in_a_client_file_is_refused_by_its_path(tmp_path):
    """JSON can spell "\\ud800", which is no character: no file, argument or environment can
    carry it, so every command refuses it by path instead of failing on it later."""
    source = tmp_path / "client.json"
    source.write_text('{"mcpServers": {"a": {"command": "x", "args": ["\\ud800"], "excludeTools": ["\\udc00"]}}}')
    output = tmp_path / "out.toml"
    for args in (["import", str(source), "--output", str(output)], ["check", "--config", str(source)]):
        result = run(*args)
        assert result.returncode == 2, result
        assert "mcpServers.a.args[0]: holds a lone surrogate" in result.stderr, result.stderr
        assert "mcpServers.a.excludeTools[0]: holds a lone surrogate" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.json"]  # no output, no temporary file


def test_a_secret_put_into_command_or_cwd_is_masked_in_errors(tmp_path):
    secret = "hunter2-not-for-logs"
    cwd_config = tmp_path / "cwd.toml"
    cwd_config.write_text('[servers.t]\ncommand = "x"\ncwd = "/tmp/${BAD}"\n')
    command_config = tmp_path / "command.toml"
    command_config.write_text('[servers.s]\ncommand = "/nonexistent/${BAD}"\n')
    env = {**os.environ, "BAD": secret}
    for config, code, said in (
        (cwd_config, 2, "servers.t.cwd: no such directory: /tmp/***"),
        (command_config, 1, "cannot start '/nonexistent/***'"),
    ):
        result = run("check", "--config", str(config), env=env)
        assert result.returncode == code, result
        assert said in result.stdout + result.stderr, result.stdout + result.stderr
        assert secret not in result.stdout + result.stderr

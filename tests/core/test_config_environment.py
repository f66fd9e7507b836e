"""Config: ${VAR:-default} and the ${...} forms refused, what a server's environment holds
(env_passthrough), and paths relative to the config file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from aggregator.config import load_config, structure_config
from aggregator.errors import ConfigError
from aggregator.upstreams import child_process

ROOT = Path(__file__).parents[2]


def problems(raw, environ=None):
    with pytest.raises(ConfigError) as info:
        structure_config(raw, environ=environ or {})
    return info.value.problems


def server_args(args, environ):
    return structure_config({"servers": {"s": {"command": "srv", "args": args}}}, environ=environ).servers["s"]


def test_a_default_is_used_when_the_variable_is_unset_or_empty():
    server = server_args(
        ["${A:-one}", "${B:-two}", "${C:-}", "x${D:-/tmp/d}y", "${E}", "$${F:-no}"], {"B": "", "E": "e"}
    )
    assert server.args == ("one", "two", "", "x/tmp/dy", "e", "${F:-no}")
    assert server.interpolated == ("e",)  # a default is written in the config: not a secret


def test_a_set_variable_wins_over_its_default_and_counts_as_interpolated():
    server = server_args(["${A:-one}"], {"A": "secret-value"})
    assert server.args == ("secret-value",) and server.interpolated == ("secret-value",)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${FOO", "an unclosed ${"),
        ("a${}b", "an empty ${}"),
        ("${input:token}", "${input:...} is another program's syntax"),
        ("${env:HOME}", "${env:...} is another program's syntax"),
        ("${A B}", "${...} holding something other than a variable name"),
        ("${1A}", "${...} holding something other than a variable name"),
        ("${A:-x$y}", "the default of ${A:-...} may not contain $"),
        ("${A-x}", "${...} holding something other than a variable name"),
    ],
)
def test_other_dollar_brace_forms_are_refused_with_their_key_path(value, expected):
    found = problems({"servers": {"s": {"command": "srv", "args": ["ok", value]}}}, {"A": "a"})
    assert len(found) == 1 and found[0].startswith(f"servers.s.args[1]: {expected}"), found
    found = problems({"http": {"auth_tokens": [value]}})
    assert found[0].startswith(f"http.auth_tokens[0]: {expected}"), found


def test_env_passthrough_is_checked_and_merged_with_the_global_list():
    raw = {
        "proxy": {"env_passthrough": ["HTTPS_PROXY", "AWS_*"]},
        "servers": {"s": {"command": "srv", "env_passthrough": ["GH_TOKEN", "HTTPS_PROXY"]}},
    }
    assert structure_config(raw, environ={}).servers["s"].env_passthrough == ("HTTPS_PROXY", "AWS_*", "GH_TOKEN")
    found = problems(
        {
            "proxy": {"env_passthrough": ["*"]},
            "servers": {
                "s": {"command": "srv", "env_passthrough": ["A=B", "OK"]},
                "r": {"url": "http://127.0.0.1:9/mcp", "env_passthrough": ["X"]},
            },
        }
    )
    assert found == [
        "proxy.env_passthrough[0]: the whole environment is never passed (it holds secrets); name the variables",
        "servers.s.env_passthrough[0]: expected a variable name or a prefix and * (\"AWS_*\"), got 'A=B'",
        "servers.r.env_passthrough: only a stdio server (a `command`) has an environment to pass",
    ]


def test_a_child_gets_network_settings_and_what_passes_through_never_other_variables(monkeypatch):
    for name, value in {
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "NO_PROXY": "127.0.0.1",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        "AWS_REGION": "eu",
        "AWS_PROFILE": "p",
        "GH_TOKEN": "gh-secret",
        "OTHER_SECRET": "s",
    }.items():
        monkeypatch.setenv(name, value)
    env = child_process.child_environment({"OWN": "1", "AWS_REGION": "us"}, ["AWS_*", "GH_TOKEN"])
    assert {k: env.get(k) for k in ("HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSH_AUTH_SOCK")} == {
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "NO_PROXY": "127.0.0.1",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
    }
    assert env["AWS_PROFILE"] == "p" and env["GH_TOKEN"] == "gh-secret" and env["OWN"] == "1"
    assert env["AWS_REGION"] == "us"  # the server's own env wins
    assert "OTHER_SECRET" not in env and "OTHER_SECRET" not in child_process.child_environment({})
    assert "GH_TOKEN" not in child_process.child_environment({})


async def test_a_started_server_sees_the_passed_variables_and_runs_in_the_config_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PASSED_ONE", "yes")
    monkeypatch.setenv("KEPT_BACK", "no")
    monkeypatch.chdir("/")
    config_path = tmp_path / "a.toml"
    script = "import os, sys; sys.stdout.write('|'.join([os.getcwd(), *(os.environ.get(n, '') for n in sys.argv[1:])]))"
    config_path.write_text(
        f'[servers.s]\ncommand = "{sys.executable}"\nenv_passthrough = ["PASSED_*"]\n'
        f'args = ["-c", "{script}", "PASSED_ONE", "KEPT_BACK"]\n'
    )
    server = load_config(config_path).servers["s"]
    with trio.fail_after(20):
        process = await child_process.open_child(
            server.command, server.args, server.env, server.cwd, server.env_passthrough
        )
        try:
            out = b""
            for _ in range(100):  # bounded: the child writes one short line and exits
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                out += chunk
        finally:
            await child_process.stop_child(process, "s", grace=2)
    assert out.decode() == f"{tmp_path}|yes|"


def test_paths_resolve_against_the_config_directory(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir("/")
    path = tmp_path / "a.toml"
    path.write_text(
        '[servers.a]\ncommand = "srv"\ncwd = "work"\n'
        '[servers.b]\ncommand = "srv"\n'
        '[servers.c]\ncommand = "srv"\ncwd = "/"\n'
        '[[plugins]]\nuse = "audit-log"\noptions = { path = "logs/audit.jsonl", redact = ["x"] }\n'
        '[[plugins]]\nuse = "pin-definitions"\noptions = { path = "/abs/pins.json" }\n'
    )
    config = load_config(path)
    assert [config.servers[n].cwd for n in "abc"] == [str(tmp_path / "work"), str(tmp_path), "/"]
    assert config.plugins[0].options == {"path": str(tmp_path / "logs/audit.jsonl"), "redact": ["x"]}
    assert config.plugins[1].options == {"path": "/abs/pins.json"}


def test_a_missing_server_directory_is_a_config_problem(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('[servers.a]\ncommand = "srv"\ncwd = "nowhere"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"servers.a.cwd: no such directory: {tmp_path / 'nowhere'}"]


def test_the_shipped_config_runs_from_any_directory():
    """What a desktop client does: start the proxy from / with the config's absolute path."""
    result = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(ROOT / "aggregator.toml")],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "git " in result.stdout and "ready" in result.stdout.split("git ", 1)[1].splitlines()[0]


def test_a_plugin_default_file_is_beside_the_config(tmp_path, monkeypatch):
    from aggregator.config import PluginConfig
    from aggregator.plugins.api import load_plugins

    monkeypatch.chdir("/")
    plugins = load_plugins([PluginConfig(use="pin-definitions")], tmp_path)
    assert [str(p.path) for p in plugins.plugins] == [str(tmp_path / "aggregator-pins.json")]
    given = load_plugins([PluginConfig(use="pin-definitions", options={"path": "/tmp/x.json"})], tmp_path)
    assert [str(p.path) for p in given.plugins] == ["/tmp/x.json"]

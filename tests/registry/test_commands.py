"""``aggregator search`` and ``aggregator add`` as a user runs them, against the registry
fixture: what they print, what add writes (and keeps), and every refusal as one line on
stderr with its exit status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MEMORY = "io.github.modelcontextprotocol/server-memory"
BEFORE = b"# my proxy\r\n[proxy]\r\npage_size = 50   # spacing kept\r\n\r\n[servers.keep]\r\ncommand = 'true'"


def aggregator(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert "Traceback" not in done.stdout + done.stderr
    return done


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "aggregator.toml"
    path.write_bytes(BEFORE)
    return path


def test_search_lists_name_version_status_transports_description(registry):
    done = aggregator("search", "memory", "--registry", registry.url)
    assert done.returncode == 0, done.stderr
    head, row = done.stdout.splitlines()
    assert head.split() == ["NAME", "VERSION", "STATUS", "RUNS", "AS", "DESCRIPTION"]
    assert row.split(None, 5) == [MEMORY, "2026.8.31", "active", "npm", "stdio", row.split(None, 5)[5]]
    assert row.endswith("Knowledge graph-based persistent memory system")


def test_search_shows_what_is_deprecated_or_deleted_and_skips_what_is_broken(registry):
    done = aggregator("search", "--registry", f"{registry.url}/hostile")
    assert done.returncode == 0
    statuses = {line.split()[0]: line.split()[2] for line in done.stdout.splitlines()[1:]}
    assert statuses["io.example/deleted"] == "deleted" and statuses["io.example/deprecated"] == "deprecated"
    assert "aggregator: skipped an entry of" in done.stderr and "is not a server name" in done.stderr


def test_search_with_no_match_exits_1(registry):
    done = aggregator("search", "no-such-thing", "--registry", registry.url)
    assert (done.returncode, done.stdout) == (1, "")
    assert "no server in" in done.stderr


def test_search_escapes_control_characters(tmp_path):
    (tmp_path / "x.json").write_text(
        '{"name": "io.example/esc", "version": "1.0.0", "description": "title \\u001b]0;pwned\\u0007 here",'
        ' "packages": []}'
    )
    done = aggregator("search", "esc", "--registry", str(tmp_path))
    assert "\x1b" not in done.stdout and "\\x1b]0;pwned\\x07" in done.stdout


def test_search_escapes_bidi_and_zero_width_characters(tmp_path):
    (tmp_path / "x.json").write_text(
        '{"name": "io.example/esc", "version": "1.0.0", "description": "safe\\u202edlrow\\u200b\\u3000end",'
        ' "packages": []}'
    )
    done = aggregator("search", "esc", "--registry", str(tmp_path))
    assert "\u202e" not in done.stdout and "safe\\u202edlrow\\u200b\\u3000end" in done.stdout


def test_add_appends_the_table_and_keeps_every_byte(registry, config):
    done = aggregator("add", MEMORY, "--registry", registry.url, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"added servers.memory to {config}: {MEMORY} 2026.8.31",
        "  runs: npx -y @modelcontextprotocol/server-memory@2026.8.31",
    ]
    after = config.read_bytes()
    assert after.startswith(BEFORE)
    servers = tomllib.loads(after.decode())["servers"]
    assert servers["memory"] == {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]}
    assert b"\r\n[servers.memory]\r\n" in after  # in the file's own line endings


def test_add_a_version_under_a_key_of_ones_own(registry, config):
    done = aggregator(
        "add", MEMORY, "--version", "2025.9.25", "--as", "old-memory", "--registry", registry.url, "-c", str(config)
    )
    assert done.returncode == 0, done.stderr
    args = tomllib.loads(config.read_text())["servers"]["old-memory"]["args"]
    assert args == ["-y", "@modelcontextprotocol/server-memory@2025.9.25"]


def test_add_an_existing_key_is_an_error_unless_replaced(registry, config):
    assert aggregator("add", MEMORY, "--registry", registry.url, "--config", str(config)).returncode == 0
    written = config.read_bytes()
    done = aggregator("add", MEMORY, "--version", "2025.9.25", "--registry", registry.url, "--config", str(config))
    assert done.returncode == 1
    assert f"aggregator: {config} already has servers.memory; choose another key (--as NAME)" in done.stderr
    assert config.read_bytes() == written
    done = aggregator(
        "add", MEMORY, "--version", "2025.9.25", "--replace", "--registry", registry.url, "--config", str(config)
    )
    assert done.returncode == 0, done.stderr
    after = config.read_bytes()
    assert after.startswith(BEFORE) and after.count(b"[servers.memory]") == 1
    assert tomllib.loads(after.decode())["servers"]["memory"]["args"][-1].endswith("@2025.9.25")


def test_replace_works_on_a_files_only_server_and_names_what_it_drops(registry, tmp_path):
    config = tmp_path / "fresh.toml"
    done = aggregator("add", MEMORY, "--version", "2025.9.25", "--registry", registry.url, "--config", str(config))
    assert done.returncode == 0, done.stderr
    with config.open("a") as file:
        file.write('request_timeout = 30\n\n[servers.memory.tools]\ndeny = ["delete_entities"]\n')
    done = aggregator("add", MEMORY, "--replace", "--registry", registry.url, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(config.read_text())["servers"]["memory"]["args"][-1].endswith("@2026.8.31")
    assert done.stderr.splitlines() == [
        "aggregator: warning: --replace dropped the policy rule servers.memory.tools.deny; add it back by hand",
        "aggregator: warning: --replace dropped the setting servers.memory.request_timeout; add it back by hand",
    ]


def test_add_to_a_config_with_a_byte_order_mark_keeps_it(registry, tmp_path):
    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf" + BEFORE)
    done = aggregator("add", MEMORY, "--registry", registry.url, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert config.read_bytes().startswith(b"\xef\xbb\xbf" + BEFORE)
    done = aggregator("add", MEMORY, "--replace", "--registry", registry.url, "--config", str(config))
    assert done.returncode == 0, done.stderr


def test_a_table_the_loader_refuses_is_rolled_back(registry, config):
    # A key holding the separator "__" loads as text but not as a config.
    done = aggregator("add", MEMORY, "--as", "my__memory", "--registry", registry.url, "--config", str(config))
    assert done.returncode == 1
    assert f"aggregator: {config} would not load with servers.my__memory added, so it was left as it was:" in (
        done.stderr
    )
    assert "servers.my__memory" in done.stderr.splitlines()[1]
    assert config.read_bytes() == BEFORE
    assert [p.name for p in config.parent.iterdir()] == ["aggregator.toml"]  # no temporary file left


def test_add_writes_through_a_symlinked_config_and_keeps_the_link(registry, config, tmp_path):
    link = tmp_path / "linked.toml"
    link.symlink_to(config)
    done = aggregator("add", MEMORY, "--registry", registry.url, "--config", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and "[servers.memory]" in config.read_text()
    done = aggregator("add", MEMORY, "--as", "my__memory", "--registry", registry.url, "--config", str(link))
    assert done.returncode == 1  # the put back goes through the link too
    assert link.is_symlink() and "my__memory" not in config.read_text()


def test_add_writes_nothing_to_a_config_that_does_not_load(registry, tmp_path):
    config = tmp_path / "aggregator.toml"
    config.write_bytes(b"[proxy]\nbogus = 1\n")
    done = aggregator("add", MEMORY, "--registry", registry.url, "--config", str(config))
    assert done.returncode == 2 and "proxy.bogus: unknown key" in done.stderr
    assert config.read_bytes() == b"[proxy]\nbogus = 1\n"


def test_add_creates_a_config_that_is_not_there(registry, tmp_path):
    done = aggregator("add", MEMORY, "--registry", registry.url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads((tmp_path / "aggregator.toml").read_text())["servers"]["memory"]["command"] == "npx"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("io.example/deleted", "io.example/deleted 2.0.0 is deleted in registry"),
        ("io.example/shell-name", "'evil;curl${IFS}x|sh' is not an npm package name"),
        ("io.example/dash-argument", "'--exec=/bin/sh' is refused: it starts with '-'"),
        ("io.example/http-remote", "'http://mcp.example.com/mcp' is refused: a remote server is reached over https"),
        ("io.example/nothing", "no server io.example/nothing in registry"),
    ],
)
def test_add_refuses_with_one_line_and_writes_nothing(registry, config, name, message):
    done = aggregator("add", name, "--registry", f"{registry.url}/hostile", "--config", str(config))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("aggregator: ") and message in done.stderr and done.stderr.count("\n") == 1
    assert config.read_bytes() == BEFORE


def test_add_warns_of_a_deprecated_entry(registry, config):
    done = aggregator("add", "io.example/deprecated", "--registry", f"{registry.url}/hostile", "-c", str(config))
    assert done.returncode == 0
    assert "aggregator: warning: io.example/deprecated 3.1.0 is deprecated in registry" in done.stderr


def test_the_registry_from_the_config_a_directory_beside_it(tmp_path):
    (tmp_path / "mirror").symlink_to(HERE / "servers")
    config = tmp_path / "proxy.toml"
    config.write_text('[registry]\nurl = "mirror"\n')
    done = aggregator("add", MEMORY, "--config", str(config), cwd=HERE)
    assert done.returncode == 0, done.stderr
    assert f"({tmp_path / 'mirror'})" in config.read_text()
    done = aggregator("search", "time", "--config", str(config), cwd=HERE)
    assert done.returncode == 0 and "mcp-server-time" not in done.stdout and "server-time" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", MEMORY, "--registry", "http://registry.example.com"], "a registry is asked over https"),
        (["add", MEMORY, "--config", "servers.json"], "servers.json is a JSON server list; add writes TOML"),
        (["add", MEMORY, "--as", "bad key"], "--as 'bad key': a server key is 1 to 64 of A-Z a-z 0-9 _ . -"),
        (["search", "--limit", "0"], "--limit 0: give 1 to 1000"),
    ],
)
def test_mistakes_are_one_line(tmp_path, args, message):
    registry_dir = ["--registry", str(HERE / "servers")] if "--registry" not in args else []
    done = aggregator(*args, *registry_dir, cwd=tmp_path)
    assert done.returncode == 1 and message in done.stderr and done.stderr.count("\n") == 1


def test_a_registry_url_in_the_config_is_checked_too(tmp_path):
    config = tmp_path / "aggregator.toml"
    config.write_text('[registry]\nurl = "http://registry.example.com"\n')
    done = aggregator("search", "x", "--config", str(config))
    assert done.returncode == 1
    assert "registry.url in the config: registry 'http://registry.example.com': a registry is asked over https" in (
        done.stderr
    )
    config.write_text("[registry]\nurl = 5\n")
    done = aggregator("search", "x", "--config", str(config))
    assert done.returncode == 2 and "registry.url" in done.stderr

"""A server added from a registry runs: ``aggregator add`` writes the npm server-memory's
table from the registry fixture (``npx -y @modelcontextprotocol/server-memory@2026.8.31``),
``aggregator check`` accepts it and starts it, and behind ``aggregator serve`` it answers
tool calls from the official SDK client.

No network: the command runs as written, in the config's directory (a server's default
``cwd``), where a ``node_modules`` link to ``tests/e2e/node_modules`` lets npx find the
package installed at that version (another version would fail), with
``npm_config_offline=true`` passed to the server through ``proxy.env_passthrough`` like
``MEMORY_FILE_PATH`` (which keeps the server's graph in the test's own directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.registry.fixture import RegistryFixture

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
MEMORY = "io.github.modelcontextprotocol/server-memory"
HEAD = '[proxy]\nstartup_timeout = 60.0\nenv_passthrough = ["npm_config_offline", "MEMORY_FILE_PATH"]\n'


def test_a_server_added_from_a_registry_starts_and_answers(tmp_path):
    if not (HERE / "node_modules" / "@modelcontextprotocol" / "server-memory").exists():
        pytest.fail("tests/e2e/node_modules is missing: run `npm ci --prefix tests/e2e`")
    config = tmp_path / "aggregator.toml"
    config.write_text(HEAD)
    (tmp_path / "node_modules").symlink_to(HERE / "node_modules")
    env = {**os.environ, "npm_config_offline": "true", "MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}
    with RegistryFixture() as registry:
        added = subprocess.run(
            [sys.executable, "-m", "aggregator", "add", MEMORY, "--registry", registry.url, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert added.returncode == 0, added.stderr
    assert config.read_text().startswith(HEAD)
    table = tomllib.loads(config.read_text())["servers"]["memory"]
    assert table == {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]}

    checked = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"config {config}: ok (1 servers)" in checked.stdout
    assert any(line.split()[:2] == ["memory", "ready"] for line in checked.stdout.splitlines())

    async def main():
        parameters = StdioServerParameters(
            command=sys.executable,
            args=["-m", "aggregator", "serve", "--stdio", "--config", str(config)],
            env=env,
        )
        with anyio.fail_after(90):
            async with Client(parameters, mode="legacy") as client:
                entity = {"name": "registry", "entityType": "source", "observations": ["added by aggregator add"]}
                result = await client.call_tool("memory__create_entities", {"entities": [entity]})
                assert not result.is_error, result.content
                result = await client.call_tool("memory__read_graph", {})
                assert not result.is_error
                graph = json.loads(result.content[0].text)
                assert [e["name"] for e in graph["entities"]] == ["registry"]

    anyio.run(main)
    assert "added by aggregator add" in (tmp_path / "memory.jsonl").read_text()

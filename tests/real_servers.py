"""Seven real MCP servers in one configuration: what the tool-search benchmark ranks over and
the discovery end-to-end tests put behind the proxy.

All install with the README's test command: the PyPI ones (``mcp-server-time``,
``mcp-server-git``, ``mcp-server-fetch``) into ``.venv``, the npm ones (server-everything,
server-filesystem, server-memory, server-sequential-thinking) into ``tests/e2e``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
NODE_MODULES = ROOT / "tests" / "e2e" / "node_modules" / "@modelcontextprotocol"
BIN = Path(sys.executable).parent  # the venv's scripts: the PyPI servers
NPM_SERVERS = ("server-everything", "server-filesystem", "server-memory", "server-sequential-thinking")


def make_git_repo(path: Path) -> Path:
    """A small git repository for mcp-server-git to serve (one commit)."""
    path.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "hello.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(path), "add", "hello.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "first"], check=True, env=env)
    return path


def missing() -> list[str]:
    """What of the seven is not installed (the README's test command installs all)."""
    gone = [str(NODE_MODULES / name) for name in NPM_SERVERS if not (NODE_MODULES / name).exists()]
    gone += [str(BIN / name) for name in ("mcp-server-time", "mcp-server-git", "mcp-server-fetch")]
    return [path for path in gone if not Path(path).exists()]


def servers_toml(workdir: Path) -> str:
    """The ``[servers.*]`` tables of the seven, with a git repository and a folder for the
    filesystem and memory servers made under ``workdir``."""
    repo = workdir / "repo"
    if not repo.exists():
        make_git_repo(repo)
    files = workdir / "files"
    files.mkdir(exist_ok=True)
    node = "node"
    js = {name: NODE_MODULES / name / "dist" / "index.js" for name in NPM_SERVERS}
    return f'''
[servers.everything]
command = "{node}"
args = ["{js["server-everything"]}", "stdio"]

[servers.filesystem]
command = "{node}"
args = ["{js["server-filesystem"]}", "{files}"]

[servers.memory]
command = "{node}"
args = ["{js["server-memory"]}"]
env = {{ MEMORY_FILE_PATH = "{workdir / "memory.jsonl"}" }}

[servers.thinking]
command = "{node}"
args = ["{js["server-sequential-thinking"]}"]
env = {{ DISABLE_THOUGHT_LOGGING = "true" }}

[servers.time]
command = "{BIN / "mcp-server-time"}"
args = ["--local-timezone", "UTC"]

[servers.git]
command = "{BIN / "mcp-server-git"}"
args = ["--repository", "{repo}"]

[servers.fetch]
command = "{BIN / "mcp-server-fetch"}"
'''

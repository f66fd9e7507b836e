"""End-to-end fixtures: real servers, the proxy as a subprocess, the official SDK as client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
EVERYTHING = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FAKESRV = ROOT / "tests" / "fakesrv.py"


@pytest.fixture(scope="session")
def everything_js() -> Path:
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: run `npm ci --prefix tests/e2e` (the README's test command does)")
    return EVERYTHING


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "hello.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "hello.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "first"], check=True, env=env)
    return repo


def fake(name: str, *modes: str, **extra: str) -> str:
    lines = [f"[servers.{name}]", f'command = "{sys.executable}"',
             "args = [" + ", ".join(f'"{a}"' for a in [str(FAKESRV), *modes]) + "]"]
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

"""Both eras of client against both eras of server, through the proxy: the 2x2 matrix.

Clients: the official Python SDK 2.x pinned to 2026-07-28 (``Client(..., mode="2026-07-28")``,
``eras_modern_client.py``) and the official SDK 1.30 (legacy, ``.venv-mcp1``,
``eras_legacy_client.py``). Servers:

- modern column: ``tests/e2e/modern_server.py`` (SDK 2.x; ``protocol = "auto"`` finds it modern),
  ``mcp-server-time`` unpinned (it is built on the SDK 2.x too, so also modern) and
  ``eras_logging_server.py`` (SDK 2.x, a tool that logs);
- legacy column: ``@modelcontextprotocol/server-everything`` (TS SDK, legacy natively), and
  ``modern_server.py``, ``mcp-server-time``, ``mcp-server-git`` and ``eras_logging_server.py`` pinned with
  ``protocol = "2025-11-25"`` (they speak both eras; the pin makes the proxy ``initialize`` them).

Each column is served over the proxy's stdio front (every upstream over stdio) and over its
Streamable HTTP front (one upstream per column over Streamable HTTP: modern_server.py, and
server-everything). One proxy and one client run per cell; each (cell, server, feature) is a test
judging what the client saw. The proxy's log must show each upstream in its column's era.
A feature a server lacks is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.conftest import EVERYTHING, PYTHON1, ROOT, http_proxy, write_config
from tests.loopback import mcp_over_http

pytestmark = pytest.mark.e2e
HERE = Path(__file__).parent
MODERN_SERVER = HERE / "modern_server.py"
LOGGING_SERVER = HERE / "eras_logging_server.py"
DRIVERS = {"modern": HERE / "eras_modern_client.py", "legacy": HERE / "eras_legacy_client.py"}
ROOTS = ("file:///tmp/matrix-a", "file:///tmp/matrix-b")  # the clients' (eras_steps.ROOTS), sorted
SHARED_ROOTS = ("file:///srv/shared",)  # proxy.roots
ERA_OF = {"modern": "2026-07-28", "legacy": "2025-11-25"}
FEATURES = (
    "tools",
    "resources",
    "prompts",
    "progress",
    "cancellation",
    "sampling",
    "elicitation",
    "roots",
    "list_changes",
    "logging",
)
TOOLS_ONLY = "offers tools only"
LACKS = {
    "modern_server": {"logging": "modern_server.py has no tool that logs"},
    "everything": {
        "cancellation": "server-everything keeps no record of a cancelled call that a client could read",
        "list_changes": "server-everything never changes its tool, prompt or resource lists",
    },
    "time": {feature: f"mcp-server-time {TOOLS_ONLY}" for feature in FEATURES if feature != "tools"},
    "git": {feature: f"mcp-server-git {TOOLS_ONLY}" for feature in FEATURES if feature != "tools"},
    "logging": {f: "eras_logging_server.py only logs (its tool is called there)" for f in FEATURES if f != "logging"},
}
# Known limits of a client era, whatever the server.
CLIENT_LIMITS = {
    ("modern", "everything", "logging"): "server-everything logs outside any request; a 2026-07-28 caller hears "
    "only log lines of its own requests (docs/protocol-revisions.md)",
}
# Which servers each column puts behind the proxy: prefix -> kind.
COLUMNS = {
    "modern": {"m": "modern_server", "time": "time", "log": "logging"},
    "legacy": {"e": "everything", "l": "modern_server", "time": "time", "git": "git", "log": "logging"},
}
CELLS = [
    (client, column, front) for client in ("modern", "legacy") for column in COLUMNS for front in ("stdio", "http")
]


def http_upstream(argv: list[str], env: dict[str, str] | None = None):
    return mcp_over_http(argv, env={**os.environ, **(env or {})})


def column_config(stack: ExitStack, directory: Path, column: str, front: str, repo: Path) -> Path:
    """The proxy's config for a column; over the HTTP front one upstream is itself over HTTP."""
    python = sys.executable
    if column == "modern":
        if front == "http":
            url = stack.enter_context(http_upstream([python, str(MODERN_SERVER), "http", "PORT"]))
            modern = f'[servers.m]\nurl = "{url}"\n'
        else:
            modern = f'[servers.m]\ncommand = "{python}"\nargs = ["{MODERN_SERVER}"]\n'
        body = modern + '[servers.time]\ncommand = "mcp-server-time"\nargs = ["--local-timezone", "UTC"]\n'
        body += f'[servers.log]\ncommand = "{python}"\nargs = ["{LOGGING_SERVER}"]\n'
    else:
        if front == "http":
            url = stack.enter_context(http_upstream(["node", str(EVERYTHING), "streamableHttp"]))
            everything = f'[servers.e]\nurl = "{url}"\n'
        else:
            everything = f'[servers.e]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
        pin = 'protocol = "2025-11-25"\n'
        body = (
            everything
            + f'[servers.l]\ncommand = "{python}"\nargs = ["{MODERN_SERVER}"]\n{pin}'
            + f'[servers.time]\ncommand = "mcp-server-time"\nargs = ["--local-timezone", "UTC"]\n{pin}'
            + f'[servers.git]\ncommand = "mcp-server-git"\nargs = ["--repository", "{repo}"]\n{pin}'
            + f'[servers.log]\ncommand = "{python}"\nargs = ["{LOGGING_SERVER}"]\n{pin}'
        )
    return write_config(directory, body, startup_timeout=20.0, roots=list(SHARED_ROOTS))


def drive(client: str, front: str, target: str, servers: dict) -> tuple[dict, str]:
    python = sys.executable if client == "modern" else str(PYTHON1)
    argv = [python, str(DRIVERS[client]), front, target, json.dumps(servers), sys.executable]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def make_repo(directory: Path) -> Path:
    repo = directory / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "hello.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "hello.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "first"], check=True, env=env)
    return repo


@pytest.fixture(scope="module")
def cells(tmp_path_factory, everything_js, python1):
    """Runs each cell once, when a test first asks for it: what its client saw, and the proxy's log."""
    seen: dict[tuple[str, str, str], tuple[dict, str] | Exception] = {}

    def get(cell: tuple[str, str, str]) -> tuple[dict, str]:
        if cell not in seen:
            try:
                seen[cell] = run(cell)
            except Exception as exc:  # kept: the cell's other tests fail at once, not after another run
                seen[cell] = exc
                raise
        found = seen[cell]
        if isinstance(found, Exception):
            pytest.fail(f"the cell failed to run: {found}"[:3000])
        return found

    def run(cell: tuple[str, str, str]) -> tuple[dict, str]:
        client, column, front = cell
        directory = tmp_path_factory.mktemp("-".join(cell))
        repo = make_repo(directory)
        servers = {p: (["git", str(repo)] if kind == "git" else kind) for p, kind in COLUMNS[column].items()}
        with ExitStack() as stack:
            config = column_config(stack, directory, column, front, repo)
            if front == "stdio":
                return drive(client, front, str(config), servers)
            with http_proxy(config, "--log-level", "info") as (port, log):
                out, _ = drive(client, front, f"http://127.0.0.1:{port}/mcp", servers)
            return out, log.read_text()

    return get


def cell_id(cell: tuple[str, str, str]) -> str:
    client, column, front = cell
    return f"{client}-client/{column}-server/{front}"


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_eras(cells, cell):
    """The client spoke its era, and the proxy spoke each upstream's column era."""
    client, column, front = cell
    out, log = cells(cell)
    assert out["version"] == ERA_OF[client]
    for prefix in COLUMNS[column]:
        found = re.search(rf"server {prefix}: initialized \(.*?, protocol ([0-9-]+)(; modern)?", log)
        assert found, f"no 'initialized' line for {prefix} in the proxy's log:\n{log[-3000:]}"
        assert found.group(1) == ERA_OF[column] and bool(found.group(2)) == (column == "modern"), found.group(0)


def params():
    for cell in CELLS:
        client, column, _ = cell
        for prefix, kind in COLUMNS[column].items():
            for feature in FEATURES:
                reason = LACKS[kind].get(feature) or CLIENT_LIMITS.get((client, kind, feature))
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                yield pytest.param(cell, prefix, kind, feature, marks=marks, id=f"{cell_id(cell)}/{prefix}/{feature}")


@pytest.mark.parametrize(("cell", "prefix", "kind", "feature"), list(params()))
def test_feature(cells, cell, prefix, kind, feature):
    out, log = cells(cell)
    seen = out.get(f"{prefix}.{feature}")
    assert seen is not None, f"the driver ran no {feature} step for {prefix}: {sorted(out)}"
    assert not (isinstance(seen, dict) and "error" in seen), seen
    if feature == "roots":
        CHECKS[(kind, feature)](prefix, seen, roots_seen(cell, prefix))
    else:
        CHECKS[(kind, feature)](prefix, seen)


def roots_seen(cell: tuple[str, str, str], prefix: str) -> tuple[str, ...]:
    """Whose roots a server gets (docs/many-clients.md, "Server-to-client requests, roots and logs" and the
    bridges): the client's over stdio (``--stdio`` alone) and whenever the question is a call's
    own, asked as input across either bridge; ``proxy.roots`` for server-everything on the
    network front, whose ``roots/list`` comes on its standalone stream, tied to no call, and a
    shared legacy server asking a legacy client (a shared server's roots are not one client's)."""
    client, column, front = cell
    if front == "http" and (prefix == "e" or (client == "legacy" and column == "legacy")):
        return SHARED_ROOTS
    return ROOTS


def check_modern_server(feature):
    def tools(p, seen):
        assert {f"{p}__add", f"{p}__slow", f"{p}__ask_name", f"{p}__grow"} <= set(seen["listed"]), seen
        assert seen["add"] == "5"

    def resources(p, seen):
        assert f"{p}+test://counter" in seen["listed"] and seen["read"].isdigit(), seen

    def prompts(p, seen):
        assert f"{p}__greeting" in seen["listed"], seen
        assert seen["get"] == "Ahoy, ada!" and seen["complete"] == ["pirate"], seen

    def progress(p, seen):
        assert seen == {"result": "done after 3 steps", "progress": [1, 2, 3]}

    def cancellation(p, seen):
        assert seen >= 1, "the server never saw the call cancelled"

    def sampling(p, seen):
        assert seen == "summary: short a long story"

    def elicitation(p, seen):
        assert seen == "hello ada"

    def roots(p, seen, expected):
        assert seen == "roots: " + ", ".join(expected)

    def list_changes(p, seen):
        assert seen["grown"].startswith("extra_") and f"{p}__{seen['grown']}" in seen["tools_after"], seen
        assert seen["tools_event"] in ("ToolsListChanged", "ToolListChangedNotification"), seen
        assert seen["resource_event"][1] == f"{p}+test://counter", seen

    return locals()[feature]


def check_everything(feature):
    def tools(p, seen):
        assert {f"{p}__echo", f"{p}__trigger-sampling-request", f"{p}__get-roots-list"} <= set(seen["listed"]), seen
        assert seen["echo"] == "Echo: hi"

    def resources(p, seen):
        assert seen["first"].startswith(f"{p}+demo://resource/static/document/"), seen
        assert len(seen["read"]) > 10, seen

    def prompts(p, seen):
        assert f"{p}__simple-prompt" in seen["listed"] and "simple prompt" in seen["get"].lower(), seen

    def progress(p, seen):
        assert seen["progress"] == [1, 2, 3] and "Long running operation completed" in seen["result"], seen

    def sampling(p, seen):
        assert "short Resource trigger-sampling-request context: two plus two" in seen and "stub-model" in seen, seen

    def elicitation(p, seen):
        assert "User provided the requested information" in seen and "Name: ada" in seen, seen

    def roots(p, seen, expected):
        assert all(uri in seen for uri in expected) and f"({len(expected)} total)" in seen, seen

    def logging(p, seen):
        assert seen["toggled"].startswith("Started simulated") and seen["levels"], seen

    return locals()[feature]


def check_logging(p, seen):
    """The request's own lines at info and above, in order; debug held back by the level."""
    assert seen == {"result": "logged", "levels": ["info", "warning"]}


def check_time(p, seen):
    assert f"{p}__get_current_time" in seen["listed"] and not seen["now"].startswith("ERROR"), seen
    assert json.loads(seen["now"])["timezone"] == "UTC", seen


def check_git(p, seen):
    assert f"{p}__git_status" in seen["listed"], seen
    assert "On branch main" in seen["status"] and not seen["status"].startswith("ERROR"), seen


CHECKS = {("modern_server", f): check_modern_server(f) for f in FEATURES if f not in LACKS["modern_server"]}
CHECKS |= {("everything", f): check_everything(f) for f in FEATURES if f not in LACKS["everything"]}
CHECKS |= {("time", "tools"): check_time, ("git", "tools"): check_git, ("logging", "logging"): check_logging}

"""Discovery modes and result budgets end to end: the proxy in front of seven real servers
(``tests/real_servers.py``), driven by the official Python SDK clients over stdio,
Streamable HTTP (both protocol eras) and WebSocket, in each mode: ``all``, ``search`` and
``auto`` (both ways), with ``max_result_tokens`` cutting a large file read and the rest
paged back through the resource link."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, http_proxy, proxy_argv, write_config
from tests.loopback import free_port, wait_listening
from tests.real_servers import missing, servers_toml

pytestmark = pytest.mark.e2e
HERE = Path(__file__).parent
CLIENT = HERE / "discovery_client.py"
PYTHON1 = ROOT / ".venv-mcp1" / "bin" / "python"
BUDGET = 1000


@pytest.fixture
def setup(tmp_path: Path):
    gone = missing()
    if gone:
        pytest.fail(f"real servers missing (the README's test command installs them): {gone}")
    body = servers_toml(tmp_path)
    bigfile = tmp_path / "files" / "big.txt"
    bigfile.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(800)))
    return tmp_path, body, bigfile


def config_for(tmp_path: Path, body: str, mode: str, budget_tokens: int = 8000) -> Path:
    table = f'[proxy.discovery]\nmode = "{mode}"\nbudget_tokens = {budget_tokens}\nmax_result_tokens = {BUDGET}\n'
    path = write_config(tmp_path, body, startup_timeout=30.0)
    path.write_text(path.read_text() + "\n" + table)
    return path


def drive(mode: str, target: str, bigfile: Path, repo: Path, python: Path | str = sys.executable) -> dict:
    run = subprocess.run(
        [str(python), str(CLIENT), mode, target, str(bigfile), str(repo)],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_budget(seen: dict, bigfile: Path) -> None:
    """The read was cut near the budget, and the pages give back exactly the rest."""
    whole = bigfile.read_text()
    shown = seen["read_texts"][0]
    assert whole.startswith(shown) and len(shown) < len(whole)
    assert len(shown.encode()) <= BUDGET * 4
    assert "cut to fit" in seen["read_texts"][-1]
    assert seen["read_links"] and seen["read_links"][0].startswith("aggregator://results/")
    assert shown + "".join(seen["pages"]) == whole


def check_search(seen: dict) -> None:
    assert seen["tools"] == ["find_tools", "call_tool"]
    assert "git__git_log" in seen["found"] and seen["found_text_is_json"]
    assert "time__get_current_time" in seen["found_time"]
    assert seen["call_tool"] == seen["direct"] and "On branch main" in seen["direct"][0]
    assert seen["call_tool_unknown"][0] == "error" and "Unknown tool" in seen["call_tool_unknown"][1]


def over_stdio(config: Path) -> str:
    return " ".join(proxy_argv(config))


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
def test_search_mode_over_stdio(setup, era):
    tmp_path, body, bigfile = setup
    seen = drive(era, over_stdio(config_for(tmp_path, body, "search")), bigfile, tmp_path / "repo")
    check_search(seen)
    check_budget(seen, bigfile)


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
def test_search_mode_over_streamable_http(setup, era):
    tmp_path, body, bigfile = setup
    with http_proxy(config_for(tmp_path, body, "search")) as (port, _):
        seen = drive(era, f"http://127.0.0.1:{port}/mcp", bigfile, tmp_path / "repo")
    check_search(seen)
    check_budget(seen, bigfile)


@pytest.mark.parametrize("front", ["ws", "sse"])
def test_search_mode_over_websocket_and_legacy_sse(setup, front):
    if not PYTHON1.exists():
        pytest.fail(f"{PYTHON1} is missing: the README's test command creates it (mcp==1.30.0)")
    tmp_path, body, bigfile = setup
    ws = free_port()
    with http_proxy(config_for(tmp_path, body, "search"), "--ws", f"127.0.0.1:{ws}") as (port, _):
        wait_listening(ws)
        target = f"ws://127.0.0.1:{ws}/mcp" if front == "ws" else f"http://127.0.0.1:{port}/sse"
        seen = drive(front, target, bigfile, tmp_path / "repo", PYTHON1)
    check_search(seen)
    check_budget(seen, bigfile)


def test_all_mode_lists_every_tool(setup):
    tmp_path, body, bigfile = setup
    seen = drive("legacy", over_stdio(config_for(tmp_path, body, "all")), bigfile, tmp_path / "repo")
    assert len(seen["tools"]) >= 50 and "find_tools" not in seen["tools"]
    assert "git__git_log" in seen["tools"] and "memory__create_entities" in seen["tools"]
    check_budget(seen, bigfile)


@pytest.mark.parametrize(("budget", "lists_all"), [(100_000, True), (1_000, False)])
def test_auto_mode_lists_all_while_it_fits(setup, budget, lists_all):
    tmp_path, body, bigfile = setup
    config = config_for(tmp_path, body, "auto", budget_tokens=budget)
    with http_proxy(config) as (port, _):
        seen = drive("2026-07-28", f"http://127.0.0.1:{port}/mcp", bigfile, tmp_path / "repo")
    if lists_all:
        assert len(seen["tools"]) >= 50
    else:
        check_search(seen)


def test_a_kept_result_belongs_to_its_bearer_token(setup):
    """Over HTTP with tokens, the rest of a cut result is read by any session of the token
    that made the call, and by no session (HTTP or WebSocket) of another token."""
    from tests.e2e.conftest import TOKEN, events, initialize, post

    tmp_path, body, bigfile = setup
    config = config_for(tmp_path, body, "all")
    config.write_text(config.read_text() + f'\n[http]\nauth_tokens = ["{TOKEN}", "{TOKEN}-other"]\n')
    mine, other = {"authorization": f"Bearer {TOKEN}"}, {"authorization": f"Bearer {TOKEN}-other"}

    def ask(port, headers, session, method, params):
        request = {"jsonrpc": "2.0", "id": 5, "method": method, "params": params}
        status, _, payload = post(port, request, {**headers, "mcp-session-id": session})
        assert status == 200, payload
        return [m for m in events(payload) if m.get("id") == 5][0]

    with http_proxy(config) as (port, _):
        first = initialize(port, mine)
        called = ask(
            port, mine, first, "tools/call", {"name": "filesystem__read_text_file", "arguments": {"path": str(bigfile)}}
        )
        uri = [item["uri"] for item in called["result"]["content"] if item["type"] == "resource_link"][0]
        again = ask(port, mine, initialize(port, mine), "resources/read", {"uri": uri})
        assert "line" in again["result"]["contents"][0]["text"]
        refused = ask(port, other, initialize(port, other), "resources/read", {"uri": uri})
        assert refused["error"]["code"] == -32602 and "Unknown resource" in refused["error"]["message"]

"""Many clients, one proxy: each server-to-client request, log line and roots answer
reaches exactly its client. Real servers (server-everything over Streamable HTTP and
stdio, server-filesystem, a Python SDK server that logs inside its calls), several
concurrent sessions of the official Python SDK 1.x client (``sdk1_many.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import HERE, MANY, ROOT, http_proxy, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e
SAMPLE = "everything__trigger-sampling-request"
ELICIT = "everything__trigger-elicitation-request"


def started(argv: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(
        argv,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
    except BaseException:
        process.kill()
        raise
    return process


@pytest.fixture
def everything_http(everything_js):
    port = free_port()
    process = started(["node", str(everything_js), "streamableHttp"], port, {"PORT": str(port)})
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def logging_http(python1):
    port = free_port()
    process = started([str(python1), str(HERE / "sdk1_logging_server.py"), str(port)], port)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)


def many(python1: Path, url: str, plans: dict, *extra: str) -> dict:
    out = subprocess.run(
        [str(python1), str(MANY), url, json.dumps(plans), *extra], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def sampler(label: str, **plan) -> dict:
    return {"calls": [[SAMPLE, {"prompt": f"prompt-of-{label}"}], [ELICIT, {}]], **plan}


def test_http_upstream_requests_reach_the_client_whose_call_made_them(python1, tmp_path, everything_http):
    # One shared connection to server-everything over Streamable HTTP; three clients call
    # its sampling and elicitation tools at the same time. Each request travels on the POST
    # stream of the call that made it, so each reaches that call's client and no other.
    config = write_config(tmp_path, f'[servers.everything]\nurl = "{everything_http}"\n', startup_timeout=20.0)
    with http_proxy(config) as (port, _log):
        seen = many(python1, f"http://127.0.0.1:{port}/mcp", {label: sampler(label) for label in "ABC"})
    for label in "ABC":
        mine = seen[label]
        assert [r["error"] for r in mine["results"]] == [False, False], mine
        assert len(mine["sampling"]) == 1 and f"prompt-of-{label}" in mine["sampling"][0], mine
        assert len(mine["elicitation"]) == 1, mine
        assert f'"model": "{label}"' in mine["results"][0]["text"], mine  # its own answer came back


@pytest.mark.parametrize("isolation", ["shared", "per-session"])
def test_stdio_upstream_requests_with_several_callers(python1, tmp_path, everything_js, isolation):
    # A shared stdio server cannot say which call a request belongs to: while two clients
    # have calls in flight on it, its request is refused with why and what to do. Given a
    # connection per session, each client gets its own.
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
isolation = "{isolation}"
''',
        startup_timeout=20.0,
    )
    with http_proxy(config) as (port, _log):
        seen = many(
            python1,
            f"http://127.0.0.1:{port}/mcp",
            {
                "A": {"calls": [[SAMPLE, {"prompt": "prompt-of-A"}]], "answer_delay": 3.0},
                "B": {"calls": [[SAMPLE, {"prompt": "prompt-of-B"}]], "start_delay": 1.5, "answer_delay": 0.1},
            },
        )
    a, b = seen["A"], seen["B"]
    assert a["results"][0]["error"] is False and a["sampling"] == [
        "Resource trigger-sampling-request context: prompt-of-A"
    ], a
    if isolation == "shared":
        assert b["sampling"] == [], b  # never A's, never its own
        assert b["results"][0]["error"] is True, b
        assert "several clients" in b["results"][0]["text"] and 'isolation = "per-session"' in b["results"][0]["text"]
    else:
        assert b["results"][0]["error"] is False and len(b["sampling"]) == 1 and "prompt-of-B" in b["sampling"][0]


def test_log_lines_of_a_call_reach_its_client_only(python1, tmp_path, logging_http):
    config = write_config(tmp_path, f'[servers.logs]\nurl = "{logging_http}"\n', startup_timeout=20.0)
    with http_proxy(config) as (port, _log):
        seen = many(
            python1,
            f"http://127.0.0.1:{port}/mcp",
            {label: {"calls": [["logs__work", {"label": label, "lines": 8}]]} for label in "AB"},
        )
    for label in "AB":
        assert seen[label]["results"] == [{"error": False, "text": f"{label} done"}], seen[label]
        assert seen[label]["logs"] == [f"{label} line {i}" for i in range(8)], seen[label]


def test_log_lines_of_no_request_reach_only_sessions_that_asked(python1, tmp_path, everything_http):
    # server-everything's simulated logging comes on its GET stream, part of no request:
    # the session that set a level gets it, the one that did not gets none of it.
    config = write_config(tmp_path, f'[servers.everything]\nurl = "{everything_http}"\n', startup_timeout=20.0)
    with http_proxy(config) as (port, _log):
        seen = many(
            python1,
            f"http://127.0.0.1:{port}/mcp",
            {
                "asked": {"level": "debug", "calls": [["everything__toggle-simulated-logging", {}]], "linger": 1.5},
                "quiet": {"linger": 2.0},
            },
        )
    assert seen["asked"]["logs"], seen
    assert seen["quiet"]["logs"] == [], seen


def filesystem_config(tmp_path: Path, filesystem_js: Path, isolation: str) -> tuple[Path, Path, Path]:
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    private.mkdir()
    (private / "secret.txt").write_text("only for A\n")
    config = write_config(
        tmp_path,
        f'''
[servers.fs]
command = "node"
args = ["{filesystem_js}"]
isolation = "{isolation}"
''',
        startup_timeout=20.0,
        roots=[shared.as_uri()],
    )
    return config, shared, private


def fs_plan(private: Path, roots: list[str] | None) -> dict:
    # The first call starts a per-session server; it asks for roots as it starts, while
    # that call may already be answered: the calls checked come a moment later.
    plan: dict = {
        "calls": [
            ["fs__list_allowed_directories", {}],
            ["sleep", {"seconds": 1.0}],
            ["fs__list_allowed_directories", {}],
            ["fs__read_text_file", {"path": str(private / "secret.txt")}],
        ],
        "linger": 0.5,
    }
    if roots is not None:
        plan["roots"] = roots
    return plan


@pytest.mark.parametrize("isolation", ["shared", "per-session"])
def test_filesystem_roots_are_never_another_clients(python1, tmp_path, filesystem_js, isolation):
    # server-filesystem without directory arguments takes its directories from roots/list,
    # which it asks right after it starts. A shared one gets proxy.roots; a per-session one
    # its own client's roots; a client without roots never reads under another's.
    config, shared, private = filesystem_config(tmp_path, filesystem_js, isolation)
    with http_proxy(config) as (port, _log):
        seen = many(
            python1,
            f"http://127.0.0.1:{port}/mcp",
            {"A": fs_plan(private, [private.as_uri()]), "B": fs_plan(private, None)},
        )
    a, b = seen["A"], seen["B"]
    assert str(shared) in b["results"][1]["text"] and str(private) not in b["results"][1]["text"], b
    assert b["results"][2]["error"] is True and "only for A" not in b["results"][2]["text"], b
    if isolation == "shared":
        assert a["roots_asked"] == 0, a  # a shared server never asks one client of many
        assert str(private) not in a["results"][1]["text"] and a["results"][2]["error"] is True, a
    else:
        assert a["roots_asked"] >= 1, a
        assert str(private) in a["results"][1]["text"], a
        assert a["results"][2] == {"error": False, "text": "only for A\n"}, a


def test_the_one_stdio_client_gives_a_shared_server_its_roots_at_startup(python1, tmp_path, filesystem_js):
    # Serving stdio alone, the proxy can only ever have this client: the roots/list that
    # server-filesystem asks before the client is there waits for it, then is forwarded.
    config, shared, private = filesystem_config(tmp_path, filesystem_js, "shared")
    seen = many(python1, f"stdio:{config}", {"A": fs_plan(private, [private.as_uri()])}, sys.executable)
    a = seen["A"]
    assert a["roots_asked"] >= 1, a
    assert str(private) in a["results"][1]["text"] and str(shared) not in a["results"][1]["text"], a
    assert a["results"][2] == {"error": False, "text": "only for A\n"}, a


def shared_and_own_everything(tmp_path: Path, everything_http: str, everything_js: Path) -> Path:
    """A config with a shared server-everything over Streamable HTTP (``everything``) and a
    per-session one over stdio (``mine``)."""
    return write_config(
        tmp_path,
        f'''
[servers.everything]
url = "{everything_http}"

[servers.mine]
command = "node"
args = ["{everything_js}", "stdio"]
isolation = "per-session"
''',
        startup_timeout=20.0,
    )


def test_clients_of_every_front_at_once_get_exactly_their_own(python1, tmp_path, everything_js, everything_http):
    # Streamable HTTP, legacy HTTP+SSE and WebSocket sessions at the same time, on a shared
    # server-everything over Streamable HTTP and a per-session one over stdio: each gets its
    # own sampling requests, roots questions, progress and answers. Only Streamable HTTP
    # has a stream per request; the other fronts carry it all on their one stream.
    config = shared_and_own_everything(tmp_path, everything_http, everything_js)
    ws_port = free_port()
    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (port, _log):
        wait_listening(ws_port)
        urls = {
            "H": f"http://127.0.0.1:{port}/mcp",
            "S": f"sse:http://127.0.0.1:{port}/sse",
            "W": f"ws:ws://127.0.0.1:{ws_port}/mcp",
        }
        plans = {
            label: {
                "url": urls[label[0]],
                "roots": [f"file:///tmp/roots-of-{label}"],
                "answer_delay": 0.3,
                "calls": [
                    [SAMPLE, {"prompt": f"shared-{label}"}],
                    ["mine__trigger-sampling-request", {"prompt": f"own-{label}"}],
                    ["mine__get-roots-list", {}],
                    ["everything__get-roots-list", {}],
                    ["everything__trigger-long-running-operation", {"duration": 1, "steps": 2}],
                ],
            }
            for label in ("H1", "H2", "S1", "W1")
        }
        seen = many(python1, "unused", plans)
    for label, mine in seen.items():
        assert [r["error"] for r in mine["results"]] == [False] * 5, (label, mine)
        assert sorted(mine["sampling"]) == sorted(
            f"Resource trigger-sampling-request context: {p}-{label}" for p in ("shared", "own")
        ), (label, mine)
        for result in mine["results"][:2]:
            assert f'"model": "{label}"' in result["text"], (label, mine)
        assert mine["roots_asked"] >= 1 and f"roots-of-{label}" in mine["results"][2]["text"], (label, mine)
        assert "roots-of-" not in mine["results"][3]["text"], (label, mine)  # a shared server: proxy.roots
        progress = [p for p in mine["progress"] if p[0] == "everything__trigger-long-running-operation"]
        assert [p[1:] for p in progress] == [[1.0, 2.0], [2.0, 2.0]], (label, mine)


@pytest.mark.parametrize("also_http", [False, True])
def test_a_desktop_clients_roots_and_their_change_reach_a_shared_server(tmp_path, filesystem_js, also_http):
    # The official TypeScript client as Claude Desktop and VS Code run the proxy: stdio, roots
    # with listChanged. server-filesystem without directories gets the client's roots as it
    # starts, and its new ones when it says they changed. With --http as well, more clients
    # may come, so the shared server sees proxy.roots and this client is never asked.
    first, second, shared = tmp_path / "first", tmp_path / "second", tmp_path / "shared"
    for folder in (first, second, shared):
        folder.mkdir()
    config = write_config(
        tmp_path,
        f'[servers.fs]\ncommand = "node"\nargs = ["{filesystem_js}"]\n',
        startup_timeout=20.0,
        roots=[shared.as_uri()],
    )
    extra = ["--http", f"127.0.0.1:{free_port()}"] if also_http else []
    out = subprocess.run(
        [
            "node",
            str(HERE / "ts_roots_client.mjs"),
            "fs__list_allowed_directories",
            str(first),
            str(second),
            sys.executable,
            "-m",
            "aggregator",
            "serve",
            "--stdio",
            "--config",
            str(config),
            "--log-level",
            "warning",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "ROOTS_WAIT_MS": "1000" if also_http else "5000"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if also_http:
        assert seen["asked"] == 0, seen
        assert str(shared) in seen["before"] and str(shared) in seen["after"], seen
        assert str(first) not in seen["before"] + seen["after"] and str(second) not in seen["after"], seen
    else:
        assert seen["askedBefore"] == 1 and seen["asked"] == 2, seen
        assert str(first) in seen["before"] and str(shared) not in seen["before"], seen
        assert str(second) in seen["after"] and str(first) not in seen["after"], seen


def test_list_changes_reach_exactly_their_sessions_on_every_front(python1, tmp_path, everything_js, everything_http):
    # A resource a shared server adds is announced to every session, whatever its front; one
    # a session's own (per-session) server adds, to that session only.
    config = shared_and_own_everything(tmp_path, everything_http, everything_js)
    data = "data:application/octet-stream;base64,H4sIAAAAAAAAA6tWSlSyUlAqSS0uUaoFAJ6lrtUPAAAA"
    ws_port = free_port()
    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (port, _log):
        wait_listening(ws_port)
        start = ["mine__get-sum", {"a": 1, "b": 2}]  # each session starts its own connection
        seen = many(
            python1,
            "unused",
            {
                "H": {
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "linger": 2.0,
                    "calls": [
                        start,
                        ["sleep", {"seconds": 2.0}],
                        ["everything__gzip-file-as-resource", {"name": "shared-z", "data": data}],
                    ],
                },
                "S": {"url": f"sse:http://127.0.0.1:{port}/sse", "calls": [start], "linger": 6.0},
                "W": {
                    "url": f"ws:ws://127.0.0.1:{ws_port}/mcp",
                    "linger": 5.0,
                    "calls": [
                        start,
                        ["sleep", {"seconds": 0.5}],
                        ["mine__gzip-file-as-resource", {"name": "own-z", "data": data}],
                    ],
                },
            },
        )
    for label in "HSW":
        assert all(not r["error"] for r in seen[label]["results"]), seen[label]
    changed = {label: seen[label]["list_changed"].count("notifications/resources/list_changed") for label in "HSW"}
    assert changed == {"H": 1, "S": 1, "W": 2}, seen

"""`aggregator serve --stdio` as a real process: raw protocol, faults, shutdown, orphans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.e2e.conftest import RawProxy, fake, proxy_argv, time_and_git, write_config
from tests.fakesrv import FakeServer

pytestmark = pytest.mark.e2e


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_raw_protocol_edges_and_clean_exit(tmp_path):
    marker = f"AGG_TEST_{uuid.uuid4().hex}"
    config = write_config(tmp_path, fake("a", env=f'{{ MARKER = "{marker}" }}'), startup_timeout=10.0)
    proxy = RawProxy(config)
    try:
        started = time.monotonic()
        answer = proxy.request(1, "server/discover", {})
        assert "2026-07-28" in answer["result"]["supportedVersions"] and time.monotonic() - started < 15
        answer = proxy.request(2, "tools/list")
        assert answer["error"]["code"] == -32600  # before initialize
        answer = proxy.request(
            3,
            "initialize",
            {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        assert answer["result"]["protocolVersion"] == "2024-11-05"
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        proxy.send(b'{"jsonrpc":"2.0","method":\n')
        assert proxy.receive()["error"]["code"] == -32700
        proxy.send(b'{"jsonrpc":"2.0","id":"a\xffb","method":"ping"}\n')  # an id not readable as sent: null
        answer = proxy.receive()
        assert (answer["id"], answer["error"]["code"]) == (None, -32700), answer
        proxy.send(b'[{"jsonrpc":"2.0","id":4,"method":"ping"}]\n')
        assert proxy.receive() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "Invalid request: batches (JSON arrays) are not supported"},
        }
        # A 30-digit integer and line separators reach the upstream unchanged.
        proxy.send(
            b'{"jsonrpc":"2.0","id":12345678901234567890123,"method":"tools/call","params":'
            b'{"name":"a__echo","arguments":{"n":123456789012345678901234567890,'
            b'"t":"x\\u2028y\\u0085z\\rw"}}}\n'
        )
        answer = proxy.receive()
        assert answer["id"] == 12345678901234567890123
        echoed = answer["result"]["content"][0]["text"]
        assert "123456789012345678901234567890" in echoed
        assert json.loads(echoed)["t"] == "x\u2028y\u0085z\rw"
        assert answer["result"]["_meta"] == {"fake": True}
        assert proxy.request(0, "ping") == {"jsonrpc": "2.0", "id": 0, "result": {}}
        assert proxy.request("", "ping") == {"jsonrpc": "2.0", "id": "", "result": {}}
        assert processes_with(marker), "the fake server should be running"
    finally:
        code, stderr = proxy.close()
    assert code == 0, stderr
    assert not processes_with(marker), "a server outlived the proxy"


def test_sigterm_stops_everything(tmp_path):
    import signal

    marker = f"AGG_TEST_{uuid.uuid4().hex}"
    env = f'{{ MARKER = "{marker}" }}'
    config = write_config(tmp_path, fake("a", env=env) + fake("b", env=env))
    proxy = RawProxy(config)
    answer = proxy.request(
        1,
        "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    )
    assert "result" in answer
    assert len(processes_with(marker)) == 2
    proxy.process.send_signal(signal.SIGTERM)
    assert proxy.process.wait(timeout=15) == 0
    assert not processes_with(marker)


def test_collisions_are_reported_with_both_sources(tmp_path):
    config = write_config(tmp_path, fake("a", prefix='""') + fake("b", prefix='""'))
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tool name 'echo': a:'echo' keeps it, b:'echo' is exposed as 'echo_" in out.stdout
    assert "name collision" in out.stderr  # logged at startup too


def test_faulty_servers_never_take_the_others_down(tmp_path):
    config = write_config(
        tmp_path,
        fake("dead", "exit_at_start")
        + fake("crashy", "crash_on_call")
        + fake("noisy", "garbage")
        + fake("mute", "hang_init", init_timeout=2.0)
        + fake("missing_binary").replace(sys.executable, "/nonexistent/server"),
        startup_timeout=6.0,
        restart_backoff_initial=0.2,
        restart_backoff_max=1.0,
    )

    async def main():
        params = StdioServerParameters(command=sys.executable, args=proxy_argv(config)[1:])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            started = time.monotonic()
            await session.initialize()
            assert time.monotonic() - started < 8
            names = {t.name for t in (await session.list_tools()).tools}
            assert "crashy__echo" in names and "noisy__echo" in names
            assert not any(n.startswith(("dead__", "mute__", "missing_binary__")) for n in names)

            started = time.monotonic()
            with pytest.raises(Exception, match="stopped before answering"):
                await session.call_tool("crashy__crash", {})
            assert time.monotonic() - started < 3
            result = await session.call_tool("noisy__echo", {"still": "here"})
            assert json.loads(result.content[0].text) == {"still": "here"}
            # crashy restarts (backoff <= 1 s) and answers again.
            for _ in range(100):
                try:
                    result = await session.call_tool("crashy__echo", {"back": True})
                    break
                except Exception:
                    await anyio.sleep(0.2)
            assert json.loads(result.content[0].text) == {"back": True}

    anyio.run(main)


def test_check_tools_import_and_errors(tmp_path, git_repo):
    config = write_config(tmp_path, time_and_git(git_repo))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, timeout=60)

    out = run("check", "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert "time" in out.stdout and "ready" in out.stdout and "2 tools" in out.stdout

    out = run("tools", "--config", str(config), "--json")
    catalog = json.loads(out.stdout)
    row = next(r for r in catalog["tools"] if r["name"] == "git__git_status")
    assert row["server"] == "git" and row["original"] == "git_status" and row["description"]
    out = run("tools", "--config", str(config))
    assert "TOOLS (" in out.stdout and "time__convert_time" in out.stdout

    bad = write_config(tmp_path, fake("ok") + fake("dead", "exit_at_start"), startup_timeout=3.0)
    out = run("check", "--config", str(bad))
    assert out.returncode == 1 and "exited with status 3" in out.stdout

    broken = tmp_path / "broken.toml"
    broken.write_text('[servers.git]\ncommand = "x"\nargs = ["a", 2]\n')
    out = run("serve", "--config", str(broken))
    assert out.returncode == 2 and "servers.git.args[1]: expected a string" in out.stderr

    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {"K": "${HOME}"}}
                }
            }
        )
    )
    out = run("import", str(claude))
    assert out.returncode == 0 and "[servers.time]" in out.stdout and "${HOME}" in out.stdout
    out = run("check", "--config", str(claude))
    assert out.returncode == 0, out.stdout + out.stderr

    out = run("--version")
    assert out.stdout.startswith("aggregator ")


def test_terminal_user_gets_a_greeting(tmp_path):
    import pty

    config = write_config(tmp_path, fake("a"))
    leader, follower = pty.openpty()
    process = subprocess.Popen(proxy_argv(config), stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(follower)
    try:
        deadline = time.monotonic() + 20
        seen = b""
        os.set_blocking(process.stderr.fileno(), False)
        while b"mcpServers" not in seen and time.monotonic() < deadline:
            chunk = process.stderr.read()
            seen += chunk or b""
            time.sleep(0.05)
        text = seen.decode()
        tools = len(FakeServer([]).tools())
        assert "a " in text and f"{tools} tools" in text and '"serve"' in text and "--stdio" in text
    finally:
        os.close(leader)
        process.terminate()
        process.wait(timeout=15)
    assert process.stdout.read() == b""  # nothing but MCP ever goes to stdout


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def test_children_get_no_secrets_and_requests_spawn_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AGG_TEST_SECRET_TOKEN", "do-not-pass-me")
    config = write_config(tmp_path, fake("a", env='{ CONFIGURED = "yes" }'))
    proxy = RawProxy(config)
    marker = tmp_path / "spawned"
    try:
        proxy.request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
                "command": f"touch {marker}",
                "args": ["x"],
            },
        )
        keys = json.loads(proxy.request(2, "tools/call", {"name": "a__env"})["result"]["content"][0]["text"])
        assert "CONFIGURED" in keys and "PATH" in keys and "AGG_TEST_SECRET_TOKEN" not in keys
        before = children_of(proxy.process.pid)
        for index, name in enumerate([f"a__echo; touch {marker}", f"$(touch {marker})", "../../bin/sh"]):
            proxy.request(10 + index, "tools/call", {"name": name, "arguments": {"command": f"touch {marker}"}})
        proxy.request(20, "resources/read", {"uri": f"file://{marker}"})
        assert children_of(proxy.process.pid) == before and not marker.exists()
    finally:
        code, log = proxy.close()
    assert code == 0 and "do-not-pass-me" not in log


def test_sigterm_drains_what_is_in_flight(tmp_path):
    import signal

    marker = f"AGG_TEST_{uuid.uuid4().hex}"
    env = f'{{ MARKER = "{marker}" }}'
    config = write_config(tmp_path, fake("a", env=env) + fake("b", env=env), drain_timeout=3.0)
    proxy = RawProxy(config)
    proxy.request(
        1,
        "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    )
    proxy.send(
        b'{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"a__slow","arguments":{"seconds":1.5}}}\n'
    )
    proxy.send(b'{"jsonrpc":"2.0","id":"hang","method":"tools/call","params":{"name":"b__hang"}}\n')
    time.sleep(0.3)
    started = time.monotonic()
    proxy.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # The session open (stdio's one) is still served while the drain waits.
    proxy.send(b'{"jsonrpc":"2.0","id":"late","method":"tools/call","params":{"name":"a__echo","arguments":{}}}\n')
    answers = {}
    while len(answers) < 3:
        message = proxy.receive()
        answers[message["id"]] = message
    assert "result" in answers["late"], answers["late"]
    assert answers["slow"]["result"]["content"][0]["text"] == "slept"  # finished within the drain
    assert answers["hang"]["error"]["data"]["reason"] == "unavailable"  # failed at the deadline
    assert 2.5 < time.monotonic() - started < 3 + 4 + 3
    assert proxy.process.wait(timeout=15) == 0
    assert not processes_with(marker)


PRINTF_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "printf", "version": "0"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(id: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def piped(config, lines: list[dict], last_newline: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    """`printf '<lines>' | aggregator serve --stdio`: the finished process (exit code 0) and
    its answers by id."""
    text = "\n".join(json.dumps(line) for line in lines) + ("\n" if last_newline else "")
    done = subprocess.run(proxy_argv(config), input=text.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    answers = {message["id"]: message for message in map(json.loads, done.stdout.splitlines()) if "id" in message}
    return done, answers


def test_end_of_input_finishes_what_was_received(tmp_path, git_repo):
    """`printf '<initialize>\\n<initialized>\\n<calls>\\n' | aggregator serve --stdio` answers
    every request it received before the end of its input, then exits."""
    config = write_config(tmp_path, time_and_git(git_repo) + fake("slow"), startup_timeout=20.0)
    started = time.monotonic()
    lines = [
        PRINTF_INITIALIZE,
        INITIALIZED,
        call(2, "time__get_current_time", {"timezone": "UTC"}),
        call(3, "slow__slow", {"seconds": 1}),
    ]
    done, answers = piped(config, lines)
    assert sorted(answers) == [1, 2, 3], done.stdout.decode()[-2000:]
    assert "UTC" in answers[2]["result"]["content"][0]["text"]
    assert "result" in answers[3], answers[3]
    assert time.monotonic() - started < 30


def test_end_of_input_answers_what_the_drain_did_not_finish(tmp_path):
    """A request still in flight when drain_timeout ends after end of input gets an error
    answer on stdout (cancelled upstream), as at shutdown; then the proxy exits."""
    config = write_config(tmp_path, fake("a"), drain_timeout=1.0)
    started = time.monotonic()
    lines = [PRINTF_INITIALIZE, INITIALIZED, call(2, "a__hang", {}), call(3, "a__echo", {"x": 1})]
    done, answers = piped(config, lines)
    assert sorted(answers) == [1, 2, 3], done.stdout.decode()[-2000:]
    assert "result" in answers[3]
    error = answers[2]["error"]
    assert (
        error["data"]["reason"] == "unavailable" and "did not answer before the aggregator stopped" in error["message"]
    )
    assert "cancelling them" in done.stderr.decode()
    assert time.monotonic() - started < 30


def test_a_last_line_without_its_newline_is_still_answered(tmp_path):
    """`printf '<initialize>\\n<call>' | aggregator serve --stdio`: the unterminated last line
    is a message at end of input, answered before the proxy exits."""
    config = write_config(tmp_path, fake("slow"), startup_timeout=20.0)
    done, answers = piped(config, [PRINTF_INITIALIZE, call(2, "slow__slow", {"seconds": 0.2})], last_newline=False)
    assert sorted(answers) == [1, 2], done.stdout.decode()[-2000:]
    assert "result" in answers[2], answers[2]


def test_malformed_notifications_go_unanswered_and_oversized_requests_keep_their_id(tmp_path):
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    proxy = RawProxy(config, "--log-level", "info")
    try:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        assert proxy.request(1, "initialize", init)["result"]
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        # Malformed notifications: never answered (the next line out is the ping's answer).
        for line in (
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}',
            b'{"jsonrpc":"2.0","method":"notifications/progress","params":7}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":[1]}',
            b'{"jsonrpc":"1.0","method":"notifications/initialized"}',
        ):
            proxy.send(line + b"\n")
        assert proxy.request(2, "ping") == {"jsonrpc": "2.0", "id": 2, "result": {}}
        # A request over the 16 MiB line limit whose id comes first: answered with that id.
        head = b'{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"a__echo","arguments":{"x":"'
        proxy.send(head + b"a" * (20 << 20) + b'"}}}\n')
        answer = proxy.receive()
        assert answer["id"] == "big" and answer["error"]["code"] == -32600, answer
        assert answer["error"]["data"]["reason"] == "too_large"
        assert "20971" in answer["error"]["message"] and "16777216" in answer["error"]["message"]
        # A method and no id in its first 64 KiB: taken for a notification, never answered;
        # nor is an oversized answer of the client's (a result and no id); the ping's answer
        # is the next line out.
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/message","params":{"x":"' + b"a" * (17 << 20) + b'"}}\n')
        proxy.send(b'{"jsonrpc":"2.0","result":{"x":"' + b"a" * (17 << 20) + b'"},"id":5}\n')
        assert proxy.request(3, "ping") == {"jsonrpc": "2.0", "id": 3, "result": {}}
        # The official SDKs write the id last ({"method", "params", "jsonrpc", "id"}): it is
        # read from the line's end, whatever its size.
        proxy.send(b'{"method":"tools/call","params":{"x":"' + b"a" * (17 << 20) + b'"},"jsonrpc":"2.0","id":"last"}\n')
        answer = proxy.receive()
        assert answer["id"] == "last" and answer["error"]["data"]["reason"] == "too_large", answer
        # Neither method nor id nor result in its first 64 KiB: id null, as JSON-RPC says.
        proxy.send(b'{"jsonrpc":"2.0","params":{"x":"' + b"a" * (17 << 20) + b'"},"id":5,"method":"ping"}\n')
        assert proxy.receive()["id"] is None
        assert proxy.request(4, "ping") == {"jsonrpc": "2.0", "id": 4, "result": {}}
    finally:
        code, log = proxy.close()
    assert code == 0, log
    assert "Traceback" not in log

"""A legacy client in front of a modern server that asks for input (``core.era.input_bridge``):
the official Python SDK 1.x's elicitation, sampling and roots callbacks answer what the
official SDK 2.x server asks through ``Resolve(...)``, and each call returns their values;
a raw legacy client sees an error answer fail its call and a cancel withdraw the question.
The server is ``tests/e2e/modern_asking_server.py``; the proxy finds its era itself."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest

from tests.e2e.conftest import ROOT, RawProxy, http_proxy, write_config
from tests.loopback import mcp_over_http

pytestmark = pytest.mark.e2e
SERVER = ROOT / "tests" / "e2e" / "modern_asking_server.py"
CLIENT = ROOT / "tests" / "e2e" / "sdk1_bridge_client.py"
PYTHON2 = ROOT / ".venv" / "bin" / "python"  # the official Python SDK 2.x
STDIO_SERVER = f'[servers.m]\ncommand = "{PYTHON2}"\nargs = ["{SERVER}"]\n'
INIT = {"protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "1"}}


def sdk1(python1, *args):
    out = subprocess.run([str(python1), str(CLIENT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def modern_http_server():
    """The asking server over Streamable HTTP on 127.0.0.1; yields its URL."""
    return mcp_over_http([str(PYTHON2), str(SERVER), "http", "PORT"], env={"PATH": "/usr/bin:/bin"})


def test_sdk1_over_stdio_answers_every_question_of_a_modern_server(python1, tmp_path):
    seen = sdk1(python1, "stdio", str(write_config(tmp_path, STDIO_SERVER)), sys.executable)
    assert seen["version"] == "2025-11-25"
    assert seen["results"] == {
        "name": [False, "hello ada"],
        "summarize": [False, "summary: MAKE IT LOUD"],
        "roots": [False, "roots: file:///work/one, file:///work/two"],  # stdio alone: the client's roots
        "both": [False, "grace: TWO AT ONCE"],
        "twice": [False, "alan and edsger"],
        "steps": [False, "barbara after 2 steps"],
    }
    assert seen["progress"] == [1, 2]  # reported on the retry, under the client's own token
    assert seen["asked"] == [
        "elicit: Your name?",
        "sample: make it loud",
        "roots",
        "elicit: Your name?",
        "sample: two at once",
        "elicit: Your name?",
        "elicit: Who else, alan?",
        "elicit: Your name?",
    ]


def test_sdk1_over_http_to_a_modern_http_server_is_asked_for_its_own_roots(python1, tmp_path):
    with modern_http_server() as url:
        config = write_config(tmp_path, f'[servers.m]\nurl = "{url}"\n', roots=["file:///proxy/root"])
        with http_proxy(config) as (port, _log):
            seen = sdk1(python1, "http", f"http://127.0.0.1:{port}/mcp")
    assert seen["results"]["name"] == [False, "hello ada"]
    assert seen["results"]["summarize"] == [False, "summary: MAKE IT LOUD"]
    # A modern server's roots question is its call's own: the caller answers it, even of a
    # shared server behind a network front (the answer serves that call only).
    assert seen["results"]["roots"] == [False, "roots: file:///work/one, file:///work/two"]
    assert seen["results"]["twice"] == [False, "alan and edsger"]
    assert "roots" in seen["asked"]


@contextmanager
def raw_proxy(tmp_path, capabilities):
    """The proxy over stdio in front of the asking server, a raw legacy client initialized
    with ``capabilities``; killed after 60 s whatever happens (so every read is bounded)."""
    proxy = RawProxy(write_config(tmp_path, STDIO_SERVER))
    watchdog = threading.Timer(60, proxy.process.kill)
    watchdog.start()
    try:
        assert "result" in proxy.request(0, "initialize", dict(INIT, capabilities=capabilities))
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        yield proxy
        code, log = proxy.close()
        assert code == 0, log
    finally:
        watchdog.cancel()
        if proxy.process.poll() is None:
            proxy.process.kill()


def test_an_error_answer_fails_the_call_with_why(tmp_path):
    with raw_proxy(tmp_path, {"elicitation": {}}) as proxy:
        proxy.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "m__name"}}).encode()
            + b"\n"
        )
        asked = proxy.receive()
        assert asked["method"] == "elicitation/create" and asked["params"]["message"] == "Your name?"
        error = {"jsonrpc": "2.0", "id": asked["id"], "error": {"code": -1, "message": "nobody there"}}
        proxy.send(json.dumps(error).encode() + b"\n")
        failed = proxy.receive()
        assert failed["id"] == 1 and failed["error"]["data"]["reason"] == "input_failed"
        assert "nobody there" in failed["error"]["message"]
        assert proxy.request(2, "ping") == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_a_cancel_while_asked_withdraws_the_question_and_the_call_can_be_made_again(tmp_path):
    with raw_proxy(tmp_path, {"elicitation": {}}) as proxy:
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "m__name"}}
        proxy.send(json.dumps(call).encode() + b"\n")
        asked = proxy.receive()
        proxy.send(
            json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}).encode()
            + b"\n"
        )
        withdrawn = proxy.receive_any()
        assert withdrawn["method"] == "notifications/cancelled" and withdrawn["params"]["requestId"] == asked["id"]
        proxy.send(json.dumps(call).encode() + b"\n")  # the id is free again, the server is fine
        again = proxy.receive()
        answer = {"jsonrpc": "2.0", "id": again["id"], "result": {"action": "accept", "content": {"name": "bo"}}}
        proxy.send(json.dumps(answer).encode() + b"\n")
        done = proxy.receive()
        assert done["id"] == 1 and done["result"]["content"][0]["text"] == "hello bo"

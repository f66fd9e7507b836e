"""``aggregator status`` and ``aggregator reload --admin`` against an endpoint that answers
what no aggregator would (JSON of another shape), and with a token no HTTP header can
carry: one line on stderr and exit status 1, never a traceback."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("aggregator")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console script with ``args``; ``env`` added to an environment without a token."""
    argv = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "aggregator"]
    environment = {name: value for name, value in os.environ.items() if name != "AGGREGATOR_ADMIN_TOKEN"}
    environment.update(env or {})
    out = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env=environment
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out


@contextmanager
def answering(body: bytes) -> Iterator[tuple[str, list[str]]]:
    """A 127.0.0.1 HTTP server that answers every GET and POST with ``body`` as JSON;
    yields its HOST:PORT and the Authorization headers it was sent."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            seen.append(self.headers.get("authorization", ""))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    "body",
    [
        b'{"servers":[1]}',
        b'{"servers":[{}]}',
        b'{"servers":[],"sessions":[{}]}',
        b'{"servers":[],"uptime":"x"}',
        b'{"servers":[],"uptime":1e400}',
        b'{"servers":{"a":1}}',
        b'{"servers":[],"errors":[{"time":"now","level":"error","message":"m"}]}',
        b'{"servers":[],"catalog":{"p":[1]}}',
        b'{"servers":[],"readiness":[]}',
    ],
)
def test_status_of_an_answer_of_another_shape_is_one_line(body: bytes) -> None:
    with answering(body) as (address, _):
        out = run("status", "--admin", address)
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "status.json: not a status answer" in lines[0], out.stderr


def test_status_json_still_prints_an_answer_of_another_shape() -> None:
    with answering(b'{"servers":[1]}') as (address, _):
        out = run("status", "--admin", address, "--json")
    assert out.returncode == 1 and '"servers"' in out.stdout


@pytest.mark.parametrize("token", ["токен-токен-токен", "line\nbreak-token-123", "with space-token-1234"])
def test_a_token_no_header_can_carry_is_one_line(token: str) -> None:
    with answering(b'{"ok": true, "errors": [], "changes": []}') as (address, seen):
        by_env = run("reload", "--admin", address, env={"AGGREGATOR_ADMIN_TOKEN": token})
        by_option = run("status", "--admin", address, "--token", token)
    assert seen == []  # nothing was sent
    for out, source in ((by_env, "(AGGREGATOR_ADMIN_TOKEN)"), (by_option, "(--token or AGGREGATOR_ADMIN_TOKEN)")):
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert f"the admin token {source} cannot be sent in an HTTP header" in lines[0]
        assert token.splitlines()[0] not in out.stderr  # the token is not shown


def test_a_good_token_is_sent_as_a_bearer_token() -> None:
    with answering(b'{"ok": true, "errors": [], "changes": []}') as (address, seen):
        out = run("reload", "--admin", address, env={"AGGREGATOR_ADMIN_TOKEN": "a+b%2F&c=d~0123456789"})
    assert out.returncode == 0 and "nothing changed" in out.stdout
    assert seen == ["Bearer a+b%2F&c=d~0123456789"]

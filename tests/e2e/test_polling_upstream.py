"""A Streamable HTTP upstream that polls (SEP-1699): it closes a call's event stream mid-call
and answers on the stream a client resumes with GET and Last-Event-ID after the server's
``retry`` delay. The server is ``polling_server.mjs`` (the official TypeScript SDK with an
event store); the clients are the official TypeScript SDK's, through ``aggregator serve
--http``.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.conftest import http_proxy
from tests.e2e.polling import HERE, REQUEST_TIMEOUT, polling_server, proxy_config, read_records, resumptions

CLIENT = HERE / "http_tool_client.mjs"

pytestmark = pytest.mark.e2e


def start_client(proxy_port: int, tool: str, arguments: dict, timeout_ms: int | None = None) -> subprocess.Popen:
    argv = ["node", str(CLIENT), f"http://127.0.0.1:{proxy_port}/mcp", tool, json.dumps(arguments)]
    return subprocess.Popen(
        argv + ([str(timeout_ms)] if timeout_ms else []),
        cwd=HERE,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def outcome(client: subprocess.Popen) -> dict:
    out, err = client.communicate(timeout=REQUEST_TIMEOUT + 30)
    assert client.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_two_clients_get_their_polled_answers_after_the_servers_retry_delay(tmp_path):
    retry = 1.5
    with (
        polling_server(tmp_path, "--retry-ms", str(int(retry * 1000))) as (port, records),
        http_proxy(proxy_config(tmp_path, port), "--log-level", "info") as (proxy_port, log),
    ):
        started = time.monotonic()
        # One call's stream is closed once; the other's three times, each resumed stream too.
        once = start_client(proxy_port, "p__poll", {"tag": "first", "closes": 1, "gap_ms": 300})
        thrice = start_client(proxy_port, "p__poll", {"tag": "second", "closes": 3, "gap_ms": 1800})
        first, second = outcome(once), outcome(thrice)
        took = time.monotonic() - started
    assert first["text"] == "polled first" and not first["isError"], first
    assert second["text"] == "polled second" and not second["isError"], second
    # Progress sent before each close arrived, including what came on resumed streams.
    assert first["progress"] == [1] and second["progress"] == [1, 2, 3], (first, second)
    # Well within the request timeout: nobody waited for it.
    assert took < REQUEST_TIMEOUT / 2, took
    assert retry * 1.0 < first["elapsed_ms"] / 1000 < retry + 5, first
    assert 3 * retry < second["elapsed_ms"] / 1000 < 3 * retry + 8, second
    streams = resumptions(read_records(records))
    assert sorted(len(resumed) for resumed in streams.values()) == [1, 3], streams
    sessions = {r["session"] for r in read_records(records) if "get" in r}
    for resumed in streams.values():
        for delay, get in resumed:
            # The proxy waited the server's retry delay (give or take a busy machine).
            assert retry - 0.1 <= delay <= retry + 1.5, (delay, get)
            assert get["protocol"] == "2025-11-25" and get["session"] is not None
    assert len(sessions) == 1, sessions  # the session's own headers, on every GET
    text = log.read_text()
    assert text.count("before its answer; resuming it in 1.50s") == 4, text[-3000:]
    assert "Traceback" not in text


def test_the_conformance_tool_completes_through_the_proxy(tmp_path):
    with (
        polling_server(tmp_path, "--retry-ms", "500") as (port, records),
        http_proxy(proxy_config(tmp_path, port, prefix=""), "--log-level", "info") as (proxy_port, log),
    ):
        result = outcome(start_client(proxy_port, "test_reconnection", {}))
    assert result["text"] == "Reconnection test completed", result
    assert result["elapsed_ms"] < 5000, result
    assert [len(r) for r in resumptions(read_records(records)).values()] == [1]


def test_a_broken_connection_is_resumed_too(tmp_path):
    with (
        polling_server(tmp_path, "--retry-ms", "300") as (port, records),
        http_proxy(proxy_config(tmp_path, port), "--log-level", "info") as (proxy_port, log),
    ):
        result = outcome(start_client(proxy_port, "p__drop_connection", {"tag": "x"}))
        after = outcome(start_client(proxy_port, "p__poll", {"tag": "after", "closes": 0}))
    assert result["text"] == "survived x" and result["elapsed_ms"] < 5000, result
    assert after["text"] == "polled after"
    found = read_records(records)
    assert sum(1 for r in found if "dropped" in r) == 1
    assert sum(1 for r in found if "get" in r and r["lastEventId"]) == 1
    text = log.read_text()
    assert ") broke (the server closed the connection" in text and "resuming it in 0.30s" in text, text[-3000:]
    assert "Traceback" not in text and "cannot reach" not in text  # the connection to the server went on


def test_a_stream_without_event_ids_fails_its_call_at_once(tmp_path):
    with (
        polling_server(tmp_path, "--no-event-store") as (port, records),
        http_proxy(proxy_config(tmp_path, port), "--log-level", "info") as (proxy_port, log),
    ):
        failed = start_client(proxy_port, "p__close_unresumable", {})
        answered = start_client(proxy_port, "p__poll", {"tag": "direct", "closes": 0})
        failed, answered = outcome(failed), outcome(answered)
        # The server was not taken for dead: a call after the failed one is answered.
        after = outcome(start_client(proxy_port, "p__poll", {"tag": "after", "closes": 0}))
    assert "gave no event id to resume from" in json.dumps(failed), failed
    assert failed["elapsed_ms"] < 5000, failed  # at once, not after the 30 s request timeout
    assert answered["text"] == "polled direct" and after["text"] == "polled after", (answered, after)
    assert not any("get" in r and r["lastEventId"] for r in read_records(records))
    text = log.read_text()
    assert "cannot resume the answer to tools/call" in text and "Traceback" not in text


def test_a_cancelled_call_is_not_resumed(tmp_path):
    # The server asks for 20 s between reconnections; the client gives up after 2 s.
    with (
        polling_server(tmp_path, "--retry-ms", "20000") as (port, records),
        http_proxy(proxy_config(tmp_path, port), "--log-level", "info") as (proxy_port, log),
    ):
        gave_up = outcome(start_client(proxy_port, "p__poll", {"tag": "late"}, timeout_ms=2000))
        deadline = time.monotonic() + 10
        while "stopped resuming" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        after = outcome(start_client(proxy_port, "p__poll", {"tag": "after", "closes": 0}))
    assert "timed out" in gave_up["error"]["message"].lower(), gave_up
    text = log.read_text()
    assert "resuming it in 20.00s" in text, text[-3000:]
    assert "stopped resuming the answer to tools/call" in text and "the request was cancelled" in text, text[-3000:]
    assert after["text"] == "polled after"
    # It never asked the server for the rest of the cancelled call's stream.
    assert not any("get" in r and r["lastEventId"] for r in read_records(records))

"""Traces end to end: a client's trace context crosses two traced proxies (the second an
HTTP upstream of the first) to a real server, and every span reaches an OTLP/HTTP
collector as the OpenTelemetry SDK exports them."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import events, fake, http_proxy, initialize, post, write_config
from tests.e2e.span_collector import Collector
from tests.loopback import serve_in_thread, stop_serving

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


def test_a_trace_crosses_two_proxies_to_the_server(tmp_path, monkeypatch):
    collector = serve_in_thread(Collector)
    Collector.spans = []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within a tenth of a second
    try:
        inner_dir = tmp_path / "inner"
        inner_dir.mkdir()
        monkeypatch.setenv("OTEL_SERVICE_NAME", "inner")
        with http_proxy(write_config(inner_dir, fake("f"))) as (inner, _):
            monkeypatch.setenv("OTEL_SERVICE_NAME", "outer")
            outer_config = write_config(tmp_path, f'[servers.b]\nurl = "http://127.0.0.1:{inner}/mcp"\n')
            with http_proxy(outer_config) as (outer, log):
                session = initialize(outer)
                call = {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "b__f__echo", "arguments": {"text": "hi"}},
                }
                headers = {"mcp-session-id": session, "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
                status, _, body = post(outer, call, headers)
                assert status == 200, body
                [answer] = events(body)
                assert "result" in answer, answer
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and len(traced()) < 4:
                    time.sleep(0.1)
                spans = traced()
                assert len(spans) == 4, (spans, log.read_text()[-2000:])
                with Collector.lock:
                    others = {span.name for _, span in Collector.spans if span.trace_id.hex() == TRACE_ID}
                assert others - {span.name for _, span in spans} <= {"logging/setLevel f"}, others
    finally:
        stop_serving(collector)
    by_kind = {(service, span.kind): span for service, span in spans}
    # SPAN_KIND_SERVER = 2, SPAN_KIND_CLIENT = 3
    outer_server, outer_client = by_kind["outer", 2], by_kind["outer", 3]
    inner_server, inner_client = by_kind["inner", 2], by_kind["inner", 3]
    assert outer_server.parent_span_id.hex() == CALLER_SPAN  # the caller's, from its header
    assert outer_client.parent_span_id == outer_server.span_id
    assert inner_server.parent_span_id == outer_client.span_id  # across the hop, in _meta and headers
    assert inner_client.parent_span_id == inner_server.span_id
    assert outer_server.name == "tools/call b__f__echo" and inner_server.name == "tools/call f__echo"
    assert outer_client.name == "tools/call b" and inner_client.name == "tools/call f"
    assert '"hi"' not in json.dumps([str(span) for _, span in spans])  # no arguments in spans


def traced() -> list:
    """The tools/call spans of TRACE_ID collected so far (others: the upstreams' own listing,
    and the inner proxy's logging/setLevel to its server, which the call's log level caused)."""
    with Collector.lock:
        return [
            (s, span)
            for s, span in Collector.spans
            if span.trace_id.hex() == TRACE_ID and span.name.startswith("tools/call")
        ]


def test_the_first_call_to_a_per_session_server_is_traced_to_it(tmp_path, monkeypatch):
    """A per-session server's connection opens on its session's first call, which waits for
    it and leaves once it is ready: that call too gets its client span, under its server
    span, and its trace context reaches the server (a second traced proxy, whose server span
    continues the trace under that client span)."""
    collector = serve_in_thread(Collector)
    Collector.spans = []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        inner_dir = tmp_path / "inner"
        inner_dir.mkdir()
        monkeypatch.setenv("OTEL_SERVICE_NAME", "inner")
        with http_proxy(write_config(inner_dir, fake("f"))) as (inner, _):
            monkeypatch.setenv("OTEL_SERVICE_NAME", "outer")
            outer_config = write_config(
                tmp_path, f'[servers.b]\nurl = "http://127.0.0.1:{inner}/mcp"\nisolation = "per-session"\n'
            )
            with http_proxy(outer_config) as (outer, log):
                session = initialize(outer)
                call = {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "b__f__echo", "arguments": {"text": "first"}},
                }
                headers = {"mcp-session-id": session, "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
                status, _, body = post(outer, call, headers)
                assert status == 200, body
                [answer] = events(body)
                assert "result" in answer, answer
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and len(traced()) < 4:
                    time.sleep(0.1)
                time.sleep(0.3)  # (a span more than the four would be late by no more than a batch)
                spans = traced()
                assert len(spans) == 4, ([(s, span.name) for s, span in spans], log.read_text()[-2000:])
    finally:
        stop_serving(collector)
    by_kind = {(service, span.kind): span for service, span in spans}
    outer_server, outer_client = by_kind["outer", 2], by_kind["outer", 3]
    inner_server = by_kind["inner", 2]
    assert outer_server.parent_span_id.hex() == CALLER_SPAN
    assert outer_client.parent_span_id == outer_server.span_id
    assert outer_client.name.startswith("tools/call b@")  # the session's own connection
    assert inner_server.parent_span_id == outer_client.span_id  # the context reached the server

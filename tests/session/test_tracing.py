"""The spans of ``aggregator.telemetry.tracing``, collected in memory: one per client request, a
child per request sent upstream, the trace context passed on in ``_meta``."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from aggregator.core.commands import ToServer
from aggregator.telemetry import tracing as tracing_module
from aggregator.telemetry.tracing import Tracing, trace_headers

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def call(id, name="a__echo", meta=None):
    params = {"name": name, "arguments": {"secret": "do not trace me"}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


def test_a_request_and_its_upstream_hop_are_two_spans_of_the_callers_trace(traced):
    tracing, exporter = traced
    message = call(7, meta={"traceparent": PARENT, "baggage": "tenant=blue", "progressToken": 3})
    tracing.request(1, message)
    upstream = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": dict(message["params"], name="echo")}
    commands = [ToServer("a", upstream), ToServer("a", {"jsonrpc": "2.0", "method": "notifications/x"})]
    tracing.forwarded(1, 7, commands)
    sent = commands[0].message["params"]["_meta"]
    assert sent["progressToken"] == 3 and sent["baggage"] == "tenant=blue"  # the rest kept
    assert sent["traceparent"].startswith(f"00-{TRACE_ID}-") and sent["traceparent"] != PARENT
    assert upstream["params"]["_meta"]["traceparent"] == PARENT  # the router's message is not changed
    assert commands[1].message == {"jsonrpc": "2.0", "method": "notifications/x"}  # not a request
    assert exporter.get_finished_spans() == ()  # nothing ends before the answer
    tracing.answered(1, {"jsonrpc": "2.0", "id": 7, "result": {"content": []}})
    client, server = exporter.get_finished_spans()
    assert server.kind == SpanKind.SERVER and client.kind == SpanKind.CLIENT
    assert server.name == "tools/call a__echo" and client.name == "tools/call a"
    assert format(server.context.trace_id, "032x") == TRACE_ID == format(client.context.trace_id, "032x")
    assert format(server.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert client.parent.span_id == server.context.span_id
    assert sent["traceparent"] == f"00-{TRACE_ID}-{client.context.span_id:016x}-01"  # the hop's own span
    assert server.attributes["mcp.method.name"] == "tools/call" and server.attributes["jsonrpc.request.id"] == "7"
    assert client.attributes["mcp.server.name"] == "a"
    assert "do not trace me" not in repr([dict(s.attributes) for s in (client, server)])
    assert server.status.status_code == StatusCode.UNSET


def test_a_request_without_trace_context_starts_a_trace(traced):
    tracing, exporter = traced
    tracing.request(1, {"jsonrpc": "2.0", "id": "x", "method": "tools/list"})
    tracing.answered(1, {"jsonrpc": "2.0", "id": "x", "result": {"tools": []}})
    [span] = exporter.get_finished_spans()
    assert span.parent is None and span.name == "tools/list"


def test_errors_cancellations_and_vanished_clients_end_their_spans(traced):
    tracing, exporter = traced
    for id in (1, 2, 3):
        tracing.request(5, call(id))
        tracing.forwarded(5, id, [ToServer("a", {"jsonrpc": "2.0", "id": 100 + id, "method": "tools/call"})])
    tracing.answered(5, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad arguments"}})
    tracing.ended(5, 2, "cancelled")
    tracing.answered(5, {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})  # not an answer
    assert len(exporter.get_finished_spans()) == 4
    tracing.client_gone(5)
    spans = exporter.get_finished_spans()
    assert len(spans) == 6
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert [s.status.description for s in servers] == ["-32602: bad arguments", "cancelled", "the client went away"]
    assert all(s.status.status_code == StatusCode.ERROR for s in spans)
    tracing.answered(5, {"jsonrpc": "2.0", "id": 3, "result": {}})  # late: nothing left to end
    assert len(exporter.get_finished_spans()) == 6


def test_a_request_of_an_unknown_client_or_odd_id_is_ignored(traced):
    tracing, exporter = traced
    tracing.request(1, {"jsonrpc": "2.0", "id": None, "method": "ping"})
    tracing.forwarded(9, 1, [ToServer("a", {"id": 1, "method": "x"})])
    tracing.answered(9, {"id": 1, "result": {}})
    tracing.request(1, {"jsonrpc": "2.0", "id": 1, "method": ["odd"], "params": "odd"})
    tracing.answered(1, {"jsonrpc": "2.0", "id": 1, "result": {}})
    [span] = exporter.get_finished_spans()
    assert span.name == "?"


def test_http_headers_give_the_context_only_when_meta_has_none():
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    Tracing.adopt_headers(message, {"traceparent": PARENT, "tracestate": "k=v", "accept": "*/*"})
    assert message["params"]["_meta"] == {"traceparent": PARENT, "tracestate": "k=v"}
    own = f"00-{TRACE_ID}-1111111111111111-01"
    message = call(2, meta={"traceparent": own})
    Tracing.adopt_headers(message, {"traceparent": PARENT, "baggage": "a=b"})
    assert message["params"]["_meta"] == {"traceparent": own}
    assert trace_headers(message) == {"traceparent": own}
    assert trace_headers(call(3)) == {} and trace_headers(b"bytes") == {}


@pytest.mark.parametrize(
    ("environment", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),  # stdout is a stdio proxy's MCP stream
    ],
)
def test_the_environment_turns_tracing_on(monkeypatch, caplog, environment, on):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    made = tracing_module.from_environment()
    assert (made is not None) == on
    if made is not None:
        made.shutdown()
    if environment.get("OTEL_TRACES_EXPORTER") == "console":
        assert "not supported" in caplog.text


@pytest.mark.parametrize(
    "meta",
    [
        {"traceparent": "00-x\r\nX-Evil: 1"},
        {"traceparent": "\u00e9t\u00e9"},
        {"traceparent": PARENT[:-1]},
        {"traceparent": PARENT, "tracestate": "k=v\r\nX-Evil: 1", "baggage": "b=\u00e9"},
        {"traceparent": PARENT, "baggage": "x" * 9000},
    ],
)
def test_only_legal_trace_values_become_headers(meta):
    """What a caller put in ``_meta`` goes to an HTTP upstream as headers only if it is a
    legal header value (a malformed one would end the shared connection's request)."""
    headers = trace_headers(call(1, meta=meta))
    assert all(value.isascii() and value.isprintable() and len(value) <= 8192 for value in headers.values())
    if meta.get("traceparent") == PARENT:
        assert headers == {"traceparent": PARENT}
    else:
        assert headers == {}


def test_malformed_caller_values_are_not_read(traced):
    tracing, exporter = traced
    tracing.request(1, call(1, meta={"traceparent": "00-x\r\nX: 1", "baggage": "bad key=x\nFORGED"}))
    tracing.answered(1, {"jsonrpc": "2.0", "id": 1, "result": {}})
    [span] = exporter.get_finished_spans()
    assert span.parent is None  # a trace of its own, as without a context


def test_shutdown_does_not_wait_for_a_collector_that_never_answers(monkeypatch):
    """A provider whose shutdown hangs (a collector that accepts and never answers) holds
    the exit for SHUTDOWN_WAIT at most."""
    import threading
    import time

    release = threading.Event()

    class Hanging:
        def get_tracer(self, name):
            return TracerProvider().get_tracer(name)

        def shutdown(self):
            release.wait(30)

    monkeypatch.setattr(tracing_module, "SHUTDOWN_WAIT", 0.3)
    started = time.monotonic()
    Tracing(Hanging(), owned=True).shutdown()
    assert time.monotonic() - started < 2
    release.set()

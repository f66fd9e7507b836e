"""OpenTelemetry traces: a span per client request across the hop (optional).

A client's request gets a server span (``SpanKind.SERVER``) from the moment the hub reads
it until its answer is queued for the client (or it is cancelled, or its client goes).
Each request the routing of it sends upstream gets a client span (``SpanKind.CLIENT``),
a child of that one, whose W3C trace context (``traceparent``, ``tracestate``,
``baggage``) replaces the one in the forwarded request's ``params._meta``, as the
2026-07-28 specification documents; an upstream that traces continues the trace there.
The server span's parent is the caller's trace context: its ``_meta``, or for a request
over HTTP the same headers when its ``_meta`` has none (``adopt_headers``). A request that
waited (for its per-session connection to open, for its shared server to be listed
again) leaves with an upstream event's commands: the router shows them to ``forwarded``
too (``Router.watch_held``), so its hop is traced as any other.

Tracing is on when the ``otel`` extra is installed and the standard OpenTelemetry
environment asks for an exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``OTEL_TRACES_EXPORTER=otlp``): spans go over
OTLP/HTTP in batches, from a thread of the SDK's own. Off, nothing here runs: the hub
checks one attribute, and a caller's trace context in ``_meta`` passes through untouched.
The hub uses its own tracer provider, never the process-wide one (tests build many).

Nothing of a request's arguments or results goes into a span: its method, its id, the
exposed name it asks for, the server it went to, and how it ended.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from aggregator.core.commands import Command, RequestEnded, ToClient, ToServer
from aggregator.jsonrpc.kinds import REQUEST

log = logging.getLogger(__name__)

TRACE_KEYS = ("traceparent", "tracestate", "baggage")
# The exposed name a request asks for, by method (a span's name and an attribute).
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "resources/subscribe": "uri"}
_EXPORTERS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# A W3C traceparent (version, trace id, parent id, flags; a later version may add fields).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[ -~]*)?")
_LONGEST = 8192  # characters of a tracestate or baggage value passed on (W3C: 512 and 8192)
SHUTDOWN_WAIT = 2.0  # seconds the spans still batched may take to leave at exit


def _legal(name: str, value: object) -> bool:
    """Whether a caller's trace value may be read and passed on (as an HTTP header too):
    a well-formed traceparent; printable ASCII of bounded length for the others. Anything
    else is dropped, never passed on: one caller's bytes must not break a shared
    connection's request, nor reach the log."""
    if type(value) is not str or len(value) > _LONGEST or not value.isascii() or not value.isprintable():
        return False
    return name != "traceparent" or _TRACEPARENT.fullmatch(value) is not None


def _carrier(meta: object) -> dict[str, str]:
    """The legal trace values of a ``_meta`` (or of headers); none without a traceparent
    but baggage alone."""
    if not isinstance(meta, dict):
        return {}
    return {name: meta[name] for name in TRACE_KEYS if name in meta and _legal(name, meta[name])}


def wanted() -> bool:
    """Whether the environment asks for traces."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return exporter != "" or any(os.environ.get(name) for name in _EXPORTERS)


def from_environment() -> Tracing | None:
    """Tracing as the environment asks for it, or None (off; or the extra is missing,
    which is said once)."""
    if not wanted():
        return None
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter not in ("otlp", ""):
        # The console exporter writes to stdout, which is the MCP stream of a stdio proxy.
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (only otlp); tracing is off", exporter)
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "the environment asks for OpenTelemetry traces, but the otel extra is not installed"
            " (pip install 'mcp-aggregator[otel]'); tracing is off"
        )
        return None
    from aggregator import __version__

    name = os.environ.get("OTEL_SERVICE_NAME") or "aggregator"
    resource = Resource.create({"service.name": name, "service.version": __version__})
    # Shut down by ``shutdown``, bounded; not at interpreter exit, where a collector that
    # never answers would hold the exit for the exporter's whole timeout.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    # The propagators warn about a caller's malformed baggage quoting it: its bytes are the
    # caller's, and the values are checked here (``_legal``) before they are read.
    logging.getLogger("opentelemetry.baggage").setLevel(logging.ERROR)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing(provider, owned=True)


class _Traced:
    """One client request's spans: its own, and those of what it sent upstream."""

    __slots__ = ("span", "context", "upstream")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span
        self.context = context  # the caller's context (its baggage) with this span in it
        self.upstream: list[Any] = []


class Tracing:
    """The spans of the requests in flight, by client and request id."""

    def __init__(self, provider: Any, *, owned: bool = False) -> None:
        from opentelemetry import trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.trace import SpanKind, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._owned = owned  # made here from the environment: shut down (flushed) with the hub
        self.tracer = provider.get_tracer("aggregator")
        self._trace = trace
        self._server, self._client = SpanKind.SERVER, SpanKind.CLIENT
        self._error = StatusCode.ERROR
        self._propagator = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        self._open: dict[int, dict[Any, _Traced]] = {}  # client key -> request id -> spans

    # --- a client's request ---------------------------------------------------------------

    def request(self, key: int, message: dict[str, Any], transport: str | None = None) -> None:
        """A client's request arrived: its server span starts, under the caller's context."""
        id = message.get("id")
        if type(id) not in (int, str):
            return
        method = message.get("method")
        method = method if type(method) is str else "?"
        params = message.get("params")
        meta = params.get("_meta") if type(params) is dict else None
        carrier = _carrier(meta)
        parent = self._propagator.extract(carrier)
        attributes: dict[str, Any] = {"mcp.method.name": method, "jsonrpc.request.id": str(id)}
        named = _NAMED.get(method)
        target = params.get(named) if named and type(params) is dict else None
        if type(target) is str:
            attributes["mcp.request.target"] = target[:200]
        span = self.tracer.start_span(
            f"{method} {target[:200]}" if type(target) is str else method,
            context=parent,
            kind=self._server,
            attributes=attributes,
        )
        spans = self._open.setdefault(key, {})
        earlier = spans.pop(id, None)  # an id used again while in flight: the router refuses it
        if earlier is not None:
            self._end(earlier, "the id was used again")
        spans[id] = _Traced(span, self._trace.set_span_in_context(span, parent))

    def forwarded(self, key: int, id: Any, commands: list[Command]) -> None:
        """What routing the request ``id`` of client ``key`` queued: each request to an
        upstream gets a client span and carries its trace context in ``_meta``."""
        spans = self._open.get(key)
        traced = spans.get(id) if spans is not None and type(id) in (int, str) else None
        if traced is None:
            return
        for index, command in enumerate(commands):
            if type(command) is not ToServer:
                continue
            message = command.message
            if type(message) is not dict or "method" not in message or "id" not in message:
                continue
            method = message["method"]
            span = self.tracer.start_span(
                f"{method} {command.server}",
                context=traced.context,
                kind=self._client,
                attributes={"mcp.method.name": str(method), "mcp.server.name": command.server},
            )
            traced.upstream.append(span)
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, context=self._trace.set_span_in_context(span, traced.context))
            params = message.get("params")
            params = dict(params) if type(params) is dict else {}
            meta = params.get("_meta")
            meta = {k: v for k, v in meta.items() if k not in TRACE_KEYS} if type(meta) is dict else {}
            meta.update(carrier)
            params["_meta"] = meta
            commands[index] = attrs.evolve(command, message={**message, "params": params})

    def answered(self, key: int, message: dict[str, Any]) -> None:
        """A message queued for client ``key``: if it answers a traced request, its spans end."""
        spans = self._open.get(key)
        if not spans or "method" in message:
            return
        id = message.get("id")
        traced = spans.pop(id, None) if type(id) in (int, str) else None
        if traced is not None:
            error = message.get("error")
            why = None
            if type(error) is dict:
                why = f"{error.get('code')}: {str(error.get('message'))[:200]}"
            self._end(traced, why)

    def ended(self, key: int, id: Any, why: str) -> None:
        """Client ``key``'s request ``id`` ended unanswered (cancelled)."""
        spans = self._open.get(key)
        traced = spans.pop(id, None) if spans and type(id) in (int, str) else None
        if traced is not None:
            self._end(traced, why)

    def client_gone(self, key: int) -> None:
        """Client ``key`` went: what it still waited for ends with it."""
        for traced in (self._open.pop(key, None) or {}).values():
            self._end(traced, "the client went away")

    def _end(self, traced: _Traced, why: str | None) -> None:
        for span in traced.upstream:
            if why is not None:
                span.set_status(self._error, why)
            span.end()
        if why is not None:
            traced.span.set_status(self._error, why)
        traced.span.end()

    # --- the hub ------------------------------------------------------------------------

    async def traced(
        self,
        key: int,
        message: dict[str, Any],
        route: Callable[[int, int, dict[str, Any]], Awaitable[list[Command]]],
    ) -> list[Command]:
        """Client ``key``'s request, routed (``route``: the hub's) in a span of its own; what
        it sends upstream, in child spans."""
        self.request(key, message)
        commands = await route(key, REQUEST, message)
        self.forwarded(key, message.get("id"), commands)
        return commands

    def handlers(self, handlers: dict[type, Callable[[Any], None]]) -> dict[type, Callable[[Any], None]]:
        """The hub's handlers of answers and cancellations (``handlers``), ending spans first."""
        to_client, request_ended = handlers[ToClient], handlers[RequestEnded]

        def answered(command: ToClient) -> None:
            if type(command.message) is dict:
                self.answered(command.session, command.message)
            to_client(command)

        def ended(command: RequestEnded) -> None:
            self.ended(command.session, command.id, "cancelled")
            request_ended(command)

        return {ToClient: answered, RequestEnded: ended}

    # --- HTTP ---------------------------------------------------------------------------

    @staticmethod
    def adopt_headers(message: dict[str, Any], headers: dict[str, str]) -> None:
        """A request over HTTP whose ``_meta`` has no trace context takes its headers'
        (``headers``: lower-cased names)."""
        carrier = _carrier(headers)
        if not carrier:
            return
        params = message.get("params")
        if params is None:
            params = message["params"] = {}
        if type(params) is not dict:
            return
        meta = params.get("_meta")
        if meta is None:
            meta = params["_meta"] = {}
        if type(meta) is dict and "traceparent" not in meta:
            for name, value in carrier.items():
                meta.setdefault(name, value)

    def shutdown(self) -> None:
        """Send what is still batched (a provider made from the environment)."""
        for key in list(self._open):
            self.client_gone(key)
        if self._owned:
            # In a thread, waited for a while: a collector that is slow or gone must not
            # hold the exit (or a second signal) for the exporter's timeout.
            done = threading.Thread(target=self.provider.shutdown, name="otel shutdown", daemon=True)
            done.start()
            done.join(SHUTDOWN_WAIT)
            if done.is_alive():
                log.warning("tracing: the spans still batched could not be sent within %.0fs", SHUTDOWN_WAIT)


def trace_headers(message: Any) -> dict[str, str]:
    """The W3C trace context a request to an HTTP upstream carries in its ``_meta``, as
    headers too: only legal values (``_legal``), only with a well-formed traceparent."""
    if type(message) is not dict:
        return {}
    params = message.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    if type(meta) is not dict or "traceparent" not in meta:
        return {}
    carrier = _carrier(meta)
    return carrier if "traceparent" in carrier else {}

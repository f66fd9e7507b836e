"""An OTLP/HTTP collector the tracing tests run in a thread: it keeps every span it is sent."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Collector(BaseHTTPRequestHandler):
    spans: list = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource in request.resource_spans:
                service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
                for scope in resource.scope_spans:
                    self.spans.extend((service, span) for span in scope.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

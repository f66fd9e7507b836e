"""A test-side HTTP balancer: each request to it goes to the next of its backends in turn
(round robin, no stickiness), streamed back as it comes (SSE included). It records where
each request went, so that a test can see a session served by several proxies.

Loopback only; one thread per request (an event stream holds its thread until either side
closes); close-delimited answers (HTTP/1.0), which every client reads."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class RoundRobin:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self._next = itertools.cycle(range(len(ports)))
        self._lock = threading.Lock()
        self.seen: list[tuple[int, str, str]] = []  # (backend index, HTTP method, JSON-RPC method or "")

    def pick(self, method: str, body: bytes) -> int:
        try:
            rpc = json.loads(body).get("method", "") if body else ""
        except (ValueError, AttributeError):
            rpc = ""
        with self._lock:
            index = next(self._next)
            self.seen.append((index, method, rpc if type(rpc) is str else ""))
        return index


def _handler(balancer: RoundRobin) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: object) -> None:  # quiet
            return

        def _forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            port = balancer.ports[balancer.pick(self.command, body)]
            upstream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["host"] = f"127.0.0.1:{port}"
            try:
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("connection", "close")
                self.end_headers()
                while chunk := response.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, http.client.HTTPException):
                pass  # either side went away: the client's connection closes
            finally:
                upstream.close()

        do_GET = do_POST = do_DELETE = _forward

    return Forward


@contextmanager
def round_robin(ports: list[int], port: int = 0) -> Iterator[tuple[int, RoundRobin]]:
    """A balancer over ``ports`` of 127.0.0.1 (on ``port``; 0: a free one): its port, and
    what it saw."""
    balancer = RoundRobin(ports)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(balancer))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], balancer
    finally:
        server.shutdown()
        server.server_close()

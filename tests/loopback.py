"""What tests that talk to a listener on 127.0.0.1 share: a free port, waiting until
something listens on it, an HTTP server in a thread, and the raw ``initialize`` request a
bare HTTP client sends."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen | None = None, seconds: float = 20) -> None:
    """Return once a connection to ``port`` succeeds; fail if ``process`` exits or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process is None or process.poll() is None, "the server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


@contextmanager
def mcp_over_http(
    argv: list[str], env: dict[str, str] | None = None, stderr: object = subprocess.DEVNULL
) -> Iterator[str]:
    """A server started from ``argv`` (each ``PORT`` in it, and ``$PORT`` in its environment,
    a free port of 127.0.0.1) until it listens; yields its MCP endpoint's URL, stops it after."""
    port = free_port()
    environment = None if env is None else {**env, "PORT": str(port)}
    process = subprocess.Popen(
        [part.replace("PORT", str(port)) for part in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,  # type: ignore[arg-type]
        env=environment,
    )
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=15)


def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer of ``handler`` on a free port of 127.0.0.1, serving in a daemon
    thread until ``stop_serving``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_serving(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()

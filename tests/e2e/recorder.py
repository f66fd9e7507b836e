"""A minimal Streamable HTTP MCP server that records the headers of every request it gets
(what reaches an HTTP upstream: ``test_upstream_http``, ``test_access_tokens``)."""

from __future__ import annotations

import json
import uuid
from http.server import BaseHTTPRequestHandler

from tests.loopback import serve_in_thread, stop_serving


class Recorder:
    """A minimal Streamable HTTP MCP server that records every request's headers."""

    def __init__(self, redirect_to: int | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], dict]] = []
        self.sessions: set[str] = set()
        self.initializes = 0
        self.redirect_to = redirect_to
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                recorder.requests.append(("GET", {k.lower(): v for k, v in self.headers.items()}, {}))
                self.send_response(405)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_DELETE(self):
                recorder.requests.append(("DELETE", {k.lower(): v for k, v in self.headers.items()}, {}))
                recorder.sessions.discard(self.headers.get("mcp-session-id"))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                recorder.requests.append(("POST", headers, body))
                if recorder.redirect_to is not None:
                    self.send_response(307)
                    self.send_header("location", f"http://127.0.0.1:{recorder.redirect_to}/mcp")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                method = body.get("method")
                extra = {}
                if method == "initialize":
                    recorder.initializes += 1
                    session = uuid.uuid4().hex
                    recorder.sessions.add(session)
                    extra["mcp-session-id"] = session
                    result = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "recorder", "version": "1"},
                    }
                elif headers.get("mcp-session-id") not in recorder.sessions:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                elif "id" not in body:
                    self.send_response(202)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                elif method == "tools/list":
                    result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}
                elif method == "tools/call":
                    result = {"content": [{"type": "text", "text": "ok"}]}
                else:
                    result = {}
                data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = serve_in_thread(Handler)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        stop_serving(self.server)

"""A Streamable HTTP MCP server on 127.0.0.1 whose tools answer with what no parser reads
(``Hostile``), for the tests of unreadable answers and of what the CLI logs about an HTTP
upstream."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

from tests.loopback import serve_in_thread, stop_serving


def deep(levels: int) -> str:
    """A JSON object ``levels`` objects deep."""
    return '{"d":' * levels + "1" + "}" * levels


class Hostile:
    """A Streamable HTTP MCP server whose tools answer with what no parser reads, as a
    JSON body or as an event stream; ``ok`` answers normally."""

    ANSWERS = {
        # tool: (content type, body for request id N: '%' stands for N)
        "garbage": ("application/json", b'\xff\xfe{"jsonrpc"'),
        "array": ("application/json", b"[1,2,3]"),
        "deep_json": ("application/json", ('{"jsonrpc":"2.0","id":%,"result":{"x":' + deep(1100) + "}}").encode()),
        # The id comes after 100 KB no parser reads: no scan of the text finds it.
        "late_id": (
            "application/json",
            ('{"jsonrpc":"2.0","result":{"x":' + "[" * 50_000 + "]" * 50_000 + '},"id":%}').encode(),
        ),
        "open_sse": (
            "text/event-stream",
            b'event: message\ndata: {"jsonrpc":"2.0","id":%,"result":{"x":' + b"[" * 100_000 + b"\n\n",
        ),
        "garbage_sse": ("text/event-stream", b"event: message\ndata: {\xff\xfe not json\n\n"),
        # Content after the answer, or before it, in one JSON body: two JSON texts.
        "two_answers": (
            "application/json",
            b'{"jsonrpc":"2.0","id":%,"result":{}}{"jsonrpc":"2.0","id":%,"result":{}}',
        ),
        "note_then_answer": (
            "application/json",
            b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}'
            b'{"jsonrpc":"2.0","id":%,"result":{"content":[]}}',
        ),
        # A notification alone, and an unreadable one alone on the request's event stream.
        "note_only": (
            "application/json",
            b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}',
        ),
        # An answer to another id (as a body, and as the only event of a stream), nothing at all.
        "other_id": ("application/json", b'{"jsonrpc":"2.0","id":"another","result":{}}'),
        "other_id_sse": ("text/event-stream", b'event: message\ndata: {"jsonrpc":"2.0","id":987654,"result":{}}\n\n'),
        "empty_body": ("application/json", b""),
        "accepted": ("202", b""),
        "bad_note_sse": (
            "text/event-stream",
            b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"data":NaN}}\n\n',
        ),
        # The server could not read what it was sent, and says so without an id.
        "null_id": ("application/json", b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'),
        # More than the max_message_bytes of the test that calls it (64 KiB).
        "huge": ("application/json", b'{"jsonrpc":"2.0","id":%,"result":{"x":"' + b"y" * 200_000 + b'"}}'),
        "huge_sse": (
            "text/event-stream",
            b'data: {"jsonrpc":"2.0","id":%,"result":{"x":"' + b"y" * 200_000 + b'"}}\n\n',
        ),
    }

    def __init__(self, *, modern: bool = False, dual: bool = False, refuse_initialize: bool = False) -> None:
        """``modern``: answer ``server/discover`` as a 2026-07-28 server does (else as a
        legacy server that does not know it, with a result of no DiscoverResult's shape).
        ``dual``: as a dual-era server that takes a session-less POST carrying ``_meta`` for
        a modern request, refuse it (400, -32020) when it is not one. ``refuse_initialize``:
        refuse every ``initialize`` that way."""
        answers = self.ANSWERS

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.send_header("mcp-session-id", "s1")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.reply(405)

            def do_DELETE(self):
                self.reply(200)

            def do_POST(self):
                message = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if "id" not in message:
                    return self.reply(202)
                id, method = message["id"], message.get("method")
                carries_meta = "_meta" in (message.get("params") or {}) and "mcp-session-id" not in self.headers
                if (
                    dual
                    and carries_meta
                    and method != "server/discover"
                    or refuse_initialize
                    and method == "initialize"
                ):
                    error = {
                        "code": -32020,
                        "message": "Bad Request: no MCP-Protocol-Version header for a modern request",
                    }
                    return self.reply(400, json.dumps({"jsonrpc": "2.0", "id": id, "error": error}).encode())
                if method == "server/discover" and modern:
                    result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
                elif method == "initialize":
                    result = {
                        "protocolVersion": message["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "hostile", "version": "1"},
                    }
                elif method == "tools/list":
                    result = {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in [*answers, "ok"]]}
                elif method == "tools/call" and message["params"]["name"] in answers:
                    kind, body = answers[message["params"]["name"]]
                    if kind == "202":
                        return self.reply(202)
                    return self.reply(200, body.replace(b"%", json.dumps(id).encode()), kind)
                else:
                    result = {"content": [{"type": "text", "text": "ok"}]}
                self.reply(200, json.dumps({"jsonrpc": "2.0", "id": id, "result": result}).encode())

        self.server = serve_in_thread(Handler)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        stop_serving(self.server)

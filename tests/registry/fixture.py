"""A small MCP registry on 127.0.0.1 for the tests: the API v0.1 over the server.json
documents in ``servers/`` (the real servers the tests install, at the versions they
install, and a remote and an OCI entry), with search, cursor paging, ``updated_since``
and ``version=latest``; the same API over ``hostile/`` (entries a registry should never
send: shell metacharacters in a package name, an option as an argument, a version range,
a deleted entry, a deprecated one, a remote over http to a public host, a name that breaks
the schema); and answers that misbehave, each under its own first path segment:

    /v0.1/...               the registry
    /hostile/v0.1/...       the registry of hostile entries
    /huge/...               6 MiB of whitespace before the JSON (no Content-Length)
    /huge-declared/...      a Content-Length of 100 MB (and no body)
    /slow/...               one byte every 0.2 s
    /malformed/...          JSON cut short
    /deep/...               arrays nested 5,000 deep
    /wrong-schema/...       entries of the wrong shape (one good one among them)
    /redirect/...           a redirect to the registry
    /loop-cursor/...        a page whose nextCursor never changes

``python -m tests.registry.fixture`` serves it until Ctrl-C (the URL is printed).
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

HERE = Path(__file__).parent
OFFICIAL = "io.modelcontextprotocol.registry/official"
# When each entry was last updated (for updated_since); the rest: DEFAULT_UPDATED.
UPDATED = {
    "io.github.modelcontextprotocol/server-time": "2026-10-19T12:00:00Z",
    "io.github.modelcontextprotocol/server-git": "2026-10-19T12:00:00Z",
    "io.github.modelcontextprotocol/server-fetch": "2026-10-24T12:00:00Z",
}
DEFAULT_UPDATED = "2026-08-31T12:00:00Z"


def load_items(directory: Path) -> list[dict[str, Any]]:
    """Each file as an API item (``server`` and ``_meta``), ``isLatest`` worked out per name
    where the file does not say it, sorted by name and version."""
    items = []
    for file in sorted(directory.glob("*.json")):
        doc = json.loads(file.read_text())
        item = doc if "server" in doc else {"server": doc}
        meta = item.setdefault("_meta", {}).setdefault(OFFICIAL, {})
        name = item["server"].get("name")
        meta.setdefault("status", "active")
        meta.setdefault("publishedAt", UPDATED.get(name, DEFAULT_UPDATED))
        meta.setdefault("updatedAt", UPDATED.get(name, DEFAULT_UPDATED))
        items.append(item)
    for item in items:
        meta = item["_meta"][OFFICIAL]
        if "isLatest" not in meta:
            same = [i for i in items if i["server"].get("name") == item["server"].get("name")]
            meta["isLatest"] = item is max(same, key=lambda i: _version_key(str(i["server"].get("version"))))
    return sorted(items, key=lambda i: (str(i["server"].get("name")), _version_key(str(i["server"].get("version")))))


def _version_key(version: str) -> tuple[tuple[int, Any], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.+-]", version))


class RegistryFixture:
    """The registry, served from a thread while the ``with`` block runs."""

    def __init__(self) -> None:
        self.catalogs = {"": load_items(HERE / "servers"), "hostile": load_items(HERE / "hostile")}
        self.requests: list[str] = []  # every path asked, in order
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> RegistryFixture:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fixture = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                fixture.requests.append(self.path)
                parts = urlsplit(self.path)
                segments = parts.path.strip("/").split("/")
                mode = "" if segments[0] == "v0.1" else segments.pop(0)
                query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
                fixture.answer(self, mode, segments, query)

        return Handler

    # --- the API ----------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, mode: str, segments: list[str], query: dict[str, str]) -> None:
        misbehaving = getattr(self, f"_mode_{mode.replace('-', '_')}", None)
        if mode not in self.catalogs:
            if misbehaving is None:
                return _send(handler, 404, {"error": "no such mode"})
            return misbehaving(handler, segments, query)
        items = self.catalogs[mode]
        if segments[:2] != ["v0.1", "servers"]:
            return _send(handler, 404, {"error": "not found"})
        if len(segments) == 2:
            return self._list(handler, items, query)
        if len(segments) == 5 and segments[3] == "versions":
            name, version = unquote(segments[2]), unquote(segments[4])
            for item in items:
                server, meta = item["server"], item["_meta"][OFFICIAL]
                if server.get("name") == name and (
                    server.get("version") == version or (version == "latest" and meta["isLatest"])
                ):
                    return _send(handler, 200, item)
            return _send(handler, 404, {"title": "Not Found", "detail": "Server not found"})
        return _send(handler, 404, {"error": "not found"})

    def _list(self, handler: BaseHTTPRequestHandler, items: list[dict[str, Any]], query: dict[str, str]) -> None:
        try:
            limit = int(query.get("limit", "30"))
        except ValueError:
            return _send(handler, 400, {"detail": "limit: not a number"})
        if not 1 <= limit <= 100:
            return _send(handler, 422, {"detail": "limit: 1 to 100"})
        chosen = items
        if query.get("version") == "latest":
            chosen = [i for i in chosen if i["_meta"][OFFICIAL]["isLatest"]]
        if "search" in query:
            needle = query["search"].lower()
            chosen = [i for i in chosen if needle in str(i["server"].get("name")).lower()]
        if "updated_since" in query:
            try:
                since = _when(query["updated_since"])
            except ValueError:
                return _send(handler, 400, {"detail": "updated_since: not RFC 3339"})
            chosen = [i for i in chosen if _when(i["_meta"][OFFICIAL]["updatedAt"]) > since]
        start = 0
        if "cursor" in query:
            try:
                after = base64.urlsafe_b64decode(query["cursor"].encode()).decode()
            except ValueError:
                return _send(handler, 400, {"detail": "cursor: not one of ours"})
            keys = [_cursor_key(i) for i in chosen]
            start = next((n + 1 for n, key in enumerate(keys) if key == after), len(chosen))
        page = chosen[start : start + limit]
        metadata: dict[str, Any] = {"count": len(page)}
        if start + limit < len(chosen):
            metadata["nextCursor"] = base64.urlsafe_b64encode(_cursor_key(page[-1]).encode()).decode()
        _send(handler, 200, {"servers": page, "metadata": metadata})

    # --- answers that misbehave ------------------------------------------------------

    def _mode_huge(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        try:
            for _ in range(96):
                handler.wfile.write(b" " * 65536)
            handler.wfile.write(b'{"servers": [], "metadata": {}}')
        except OSError:
            pass  # the client stopped reading, as it should

    def _mode_huge_declared(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "100000000")
        handler.end_headers()

    def _mode_slow(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        try:
            for byte in b'{"servers": [], "metadata": {}}' + b" " * 200:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def _mode_slow_headers(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        try:  # a status line, then the headers a byte at a time: no read ever times out
            handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for byte in b"X-Pad: " + b"a" * 200:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def _mode_gzip(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        """Compressed when the client accepts gzip, as a server may."""
        data = json.dumps({"servers": self.catalogs[""][:1], "metadata": {}}).encode()
        accepted = handler.headers.get("Accept-Encoding", "")
        self._send_encoded(handler, data, "gzip" in accepted)

    def _mode_gzip_always(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        self._send_encoded(handler, json.dumps({"servers": [], "metadata": {}}).encode(), True)

    def _send_encoded(self, handler: BaseHTTPRequestHandler, data: bytes, compressed: bool) -> None:
        if compressed:
            data = gzip.compress(data)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if compressed:
            handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _mode_malformed(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        _send_bytes(handler, 200, b'{"servers": [{"server": {"name": "io.example/cut", "descr')

    def _mode_deep(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        _send_bytes(handler, 200, b"[" * 5000 + b"]" * 5000)

    def _mode_wrong_schema(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        good = next(i for i in self.catalogs[""] if i["server"]["name"].endswith("/server-everything"))
        wrong = [
            {"server": {"name": 5, "version": "1.0.0", "description": "a number for a name"}},
            {"server": {"name": "io.example/long", "version": "1.0.0", "description": "x" * 101}},
            {"server": {"name": "io.example/args", "version": "1", "description": "d", "packages": {"a": 1}}},
            "not an object",
            good,
        ]
        if len(segments) == 5:  # one entry: the wrong shape
            name = unquote(segments[2])
            return _send(handler, 200, {"server": {"name": name, "version": "1.0.0", "description": 7}})
        _send(handler, 200, {"servers": wrong, "metadata": {"count": len(wrong)}})

    def _mode_redirect(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        handler.send_response(302)
        handler.send_header("Location", f"{self.url}/{'/'.join(segments)}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _mode_loop_cursor(self, handler: BaseHTTPRequestHandler, segments: list[str], query: dict[str, str]) -> None:
        page = self.catalogs[""][:1]
        _send(handler, 200, {"servers": page, "metadata": {"count": 1, "nextCursor": "again"}})


def _cursor_key(item: dict[str, Any]) -> str:
    return f"{item['server'].get('name')}@{item['server'].get('version')}"


def _when(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    _send_bytes(handler, status, json.dumps(body).encode())


def _send_bytes(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    try:
        handler.wfile.write(data)
    except OSError:
        pass


if __name__ == "__main__":
    with RegistryFixture() as registry:
        print(registry.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass

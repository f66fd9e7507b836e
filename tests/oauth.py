"""An authorization server small enough for a test: it publishes its metadata (RFC 8414)
and signing keys (JWKS), mints access tokens with joserfc, introspects opaque ones
(RFC 7662), and can be told to answer slowly, hugely or with an error. It serves HTTP from
a thread on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, OctKey

from tests.loopback import stop_serving

RESOURCE = "http://127.0.0.1/mcp"  # the proxy's canonical URI in these tests (http: loopback)


class AuthServer:
    def __init__(self) -> None:
        self.keys = [ECKey.generate_key("P-256", parameters={"kid": "k1"})]
        self.mode = "ok"  # "ok", "slow", "huge", "error"
        self.slow_seconds = 3.0
        self.fetches: dict[str, int] = {}  # path -> requests
        self.opaque: dict[str, dict[str, Any]] = {}  # opaque token -> its introspection answer
        self.introspection_auth: list[str | None] = []  # the Authorization header of each
        self.redirects: dict[str, str] = {}  # path -> where a 302 sends a request for it
        self.busy = 0  # requests being answered now
        self.most_busy = 0  # the most answered at once
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.port = self._server.server_address[1]
        self.issuer = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        stop_serving(self._server)

    # --- what it says ---------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "jwks_uri": f"{self.issuer}/jwks",
            "introspection_endpoint": f"{self.issuer}/introspect",
            "response_types_supported": ["code"],
        }

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.as_dict(private=False) for key in self.keys]}

    def rotate(self, kid: str = "k2") -> None:
        """A new signing key replaces the old one in the published set."""
        self.keys = [ECKey.generate_key("P-256", parameters={"kid": kid})]

    def mint(
        self,
        *,
        key: Any = None,
        alg: str = "ES256",
        header: dict[str, Any] | None = None,
        lifetime: float = 300,
        **claims: Any,
    ) -> str:
        """A signed access token for ``RESOURCE``; ``claims`` override (None removes one)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "sub": "alice",
            "aud": RESOURCE,
            "exp": now + int(lifetime),
            "iat": now,
            "scope": "mcp",
        }
        body.update(claims)
        body = {name: value for name, value in body.items() if value is not None}
        signer = key or self.keys[0]
        head = {"alg": alg, "typ": "at+jwt", **({"kid": signer.kid} if getattr(signer, "kid", None) else {})}
        head.update(header or {})
        return jwt.encode(head, body, signer, algorithms=[alg])

    def count(self, path: str) -> int:
        with self._lock:
            return self.fetches.get(path, 0)

    # --- serving --------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                path = self.path.partition("?")[0]
                with server._lock:
                    server.fetches[path] = server.fetches.get(path, 0) + 1
                    server.busy += 1
                    server.most_busy = max(server.most_busy, server.busy)
                try:
                    self._answer(path)
                finally:
                    with server._lock:
                        server.busy -= 1

            def _answer(self, path: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                form = self.rfile.read(length).decode() if length else ""
                if server.mode == "slow":
                    time.sleep(server.slow_seconds)
                if server.mode == "error":
                    self._send(500, b"{}")
                    return
                if path in server.redirects:
                    self.send_response(302)
                    self.send_header("location", server.redirects[path])
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if path == "/.well-known/oauth-authorization-server":
                    document: Any = server.metadata()
                elif path == "/jwks":
                    document = server.jwks()
                elif path == "/introspect":
                    server.introspection_auth.append(self.headers.get("authorization"))
                    fields = dict(part.split("=", 1) for part in form.split("&") if "=" in part)
                    document = server.opaque.get(fields.get("token", ""), {"active": False})
                else:
                    self._send(404, b"{}")
                    return
                body = json.dumps(document).encode()
                if server.mode == "huge":
                    body = b'{"keys": [' + b'{"kty": "oct", "k": "' + b"A" * (2 << 20) + b'"}]}'
                self._send(200, body)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

        return Handler


def hmac_key() -> OctKey:
    return OctKey.generate_key(256, parameters={"kid": "k1"})


def auth_table(server: AuthServer, **more: Any) -> dict[str, Any]:
    """An [auth] table trusting ``server`` (its key set found through its metadata)."""
    return {
        "resource": RESOURCE,
        "issuers": [{"issuer": server.issuer}],
        "scopes_supported": ["mcp", "admin"],
        "required_scopes": ["mcp"],
        "fetch_timeout": 1.0,
        **more,
    }

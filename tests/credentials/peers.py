"""Real HTTP peers for the credentials tests, each a ThreadingHTTPServer on 127.0.0.1: a
small OAuth authorization server (metadata, a login form, codes with PKCE, refresh with
rotation, token exchange, dynamic registration, revocation) and an MCP server over
Streamable HTTP that wants its tokens and echoes the one it received in a tool result."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from tests.loopback import serve_in_thread, stop_serving

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


class _Handler(BaseHTTPRequestHandler):
    owner: Any

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.owner.get(self)

    def do_POST(self) -> None:
        self.owner.post(self)

    def send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        kind = "text/html" if isinstance(body, bytes) else "application/json"
        for name, value in {"content-type": kind, "content-length": str(len(data)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def form(self) -> dict[str, str]:
        length = int(self.headers.get("content-length") or 0)
        return dict(parse_qsl(self.rfile.read(length).decode()))

    def json_body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")


def _serve(owner: Any) -> Any:
    handler = type("Handler", (_Handler,), {"owner": owner})
    return serve_in_thread(handler)


class AuthServer:
    """An OAuth 2.1 authorization server, enough for the proxy's flows. ``metadata`` entries
    override (or, set to None, remove) those of its metadata document."""

    def __init__(
        self, *, metadata: dict[str, Any] | None = None, lifetime: int = 3600, refresh_delay: float = 0.0
    ) -> None:
        self.lock = threading.Lock()
        self.server = _serve(self)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.overrides = metadata or {}
        self.lifetime = lifetime
        self.refresh_delay = refresh_delay
        self.clients: dict[str, str | None] = {"configured-client": None, "secret-client": "s3cret-s3cret"}
        self.codes: dict[str, dict[str, Any]] = {}
        self.access: dict[str, dict[str, Any]] = {}  # token -> user, audience, scope
        self.refresh: dict[str, dict[str, Any]] = {}
        self.revoked: list[str] = []
        self.counts: Counter[str] = Counter()
        self.registered: list[dict[str, Any]] = []
        self.issued: list[str] = []  # every code and token it gave out
        self.iss_in_response = True  # the authorization response carries iss
        self.iss_value: str | None = None  # what it carries instead of the issuer
        self.echo_description = False  # a refused exchange's error_description echoes the subject token

    def close(self) -> None:
        stop_serving(self.server)

    def metadata(self) -> dict[str, Any]:
        base = self.issuer
        document: dict[str, Any] = {
            "issuer": base,
            "authorization_endpoint": f"{base}/authorize",
            "token_endpoint": f"{base}/token",
            "registration_endpoint": f"{base}/register",
            "revocation_endpoint": f"{base}/revoke",
            "code_challenge_methods_supported": ["S256"],
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", EXCHANGE],
            "authorization_response_iss_parameter_supported": True,
        }
        document.update(self.overrides)
        return {key: value for key, value in document.items() if value is not None}

    def mint(self, user: str, audience: str, lifetime: int | None = None) -> str:
        """An access token of ``user`` for ``audience`` (what a client of the proxy holds)."""
        token = "at-" + secrets.token_urlsafe(24)
        with self.lock:
            self.access[token] = {"user": user, "audience": audience, "expires": time.time() + (lifetime or 3600)}
        return token

    def valid(self, token: str, audience: str) -> bool:
        with self.lock:
            found = self.access.get(token)
        return found is not None and found["audience"] == audience and found["expires"] > time.time()

    # --- HTTP ----------------------------------------------------------------------------

    def get(self, request: _Handler) -> None:
        path, _, query = request.path.partition("?")
        self.counts[f"GET {path}"] += 1
        if path == "/.well-known/oauth-authorization-server":
            request.send(200, self.metadata())
        elif path == "/authorize":
            params = dict(parse_qsl(query))
            if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
                request.send(400, b"<p>PKCE S256 required</p>")
                return
            hidden = html.escape(query, quote=True)
            page = (
                f'<form method="post" action="/authorize"><input type="hidden" name="request" value="{hidden}">'
                '<input name="username"><input name="password" type="password"><button>Sign in</button></form>'
            )
            request.send(200, page.encode())
        else:
            request.send(404, {"error": "not_found"})

    def post(self, request: _Handler) -> None:
        path = request.path.partition("?")[0]
        self.counts[f"POST {path}"] += 1
        if path == "/authorize":
            self._login(request)
        elif path == "/token":
            self._token(request)
        elif path == "/register":
            body = request.json_body()
            client_id = f"dyn-{len(self.registered) + 1}"
            with self.lock:
                self.registered.append(body)
                self.clients[client_id] = None
            request.send(201, {"client_id": client_id, **body})
        elif path == "/revoke":
            form = request.form()
            with self.lock:
                self.revoked.append(form.get("token", ""))
                self.access.pop(form.get("token", ""), None)
                self.refresh.pop(form.get("token", ""), None)
            request.send(200, {})
        else:
            request.send(404, {"error": "not_found"})

    def _login(self, request: _Handler) -> None:
        form = request.form()
        params = dict(parse_qsl(form.get("request", "")))
        if form.get("password") != "wonderland":
            request.send(401, b"<p>wrong password</p>")
            return
        code = "code-" + secrets.token_urlsafe(16)
        with self.lock:
            self.codes[code] = {**params, "user": form["username"]}
            self.issued.append(code)
        answer = {"code": code, "state": params.get("state", "")}
        if self.iss_in_response:
            answer["iss"] = self.iss_value or self.issuer
        request.send(302, headers={"location": f"{params['redirect_uri']}?{urlencode(answer)}"})

    def _client(self, request: _Handler, form: dict[str, str]) -> str | None:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            return client_id if self.clients.get(client_id) == secret else None
        client_id = form.get("client_id", "")
        known = client_id in self.clients and self.clients[client_id] is None
        return client_id if known or client_id.startswith("https://") else None

    def _issue(self, user: str, audience: str, scope: str, client_id: str) -> dict[str, Any]:
        access = "at-" + secrets.token_urlsafe(24)
        refresh = "rt-" + secrets.token_urlsafe(24)
        with self.lock:
            self.access[access] = {"user": user, "audience": audience, "expires": time.time() + self.lifetime}
            self.refresh[refresh] = {"user": user, "audience": audience, "scope": scope, "client": client_id}
            self.issued += [access, refresh]
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "refresh_token": refresh,
            "scope": scope,
        }

    def _token(self, request: _Handler) -> None:
        form = request.form()
        client_id = self._client(request, form)
        if client_id is None:
            request.send(401, {"error": "invalid_client"})
            return
        grant = form.get("grant_type")
        self.counts[grant or "none"] += 1
        if grant == "authorization_code":
            with self.lock:
                code = self.codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            if (
                code is None
                or code["client_id"] != client_id
                or code["redirect_uri"] != form.get("redirect_uri")
                or code["code_challenge"] != challenge
                or code["resource"] != form.get("resource")
            ):
                request.send(400, {"error": "invalid_grant"})
                return
            request.send(200, self._issue(code["user"], code["resource"], code.get("scope", ""), client_id))
        elif grant == "refresh_token":
            if self.refresh_delay:
                time.sleep(self.refresh_delay)
            with self.lock:
                old = self.refresh.pop(form.get("refresh_token", ""), None)
            if old is None:
                request.send(400, {"error": "invalid_grant"})
                return
            request.send(200, self._issue(old["user"], old["audience"], old["scope"], client_id))
        elif grant == EXCHANGE:
            with self.lock:
                subject = self.access.get(form.get("subject_token", ""))
            if subject is None or form.get("subject_token_type") != "urn:ietf:params:oauth:token-type:access_token":
                said = {"error": "invalid_grant"}
                if self.echo_description:  # as some servers do: what it was sent, in its description
                    said["error_description"] = f"subject_token {form.get('subject_token')} is not known here"
                request.send(400, said)
                return
            issued = self._issue(subject["user"], form["audience"], form.get("scope", ""), client_id)
            issued.pop("refresh_token")
            issued["issued_token_type"] = "urn:ietf:params:oauth:token-type:access_token"
            request.send(200, issued)
        else:
            request.send(400, {"error": "unsupported_grant_type"})


class JwtIssuer:
    """The in-repo authorization server (``tests/authserver``) as ``ProtectedMcp`` trusts it:
    its tokens are JWTs; one whose ``iss``, ``aud`` and ``exp`` fit is taken (the signature is
    the resource server's business, tested there; this server only echoes what it got)."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    def valid(self, token: str, audience: str) -> bool:
        try:
            payload = token.split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (IndexError, ValueError):
            return False
        return claims.get("iss") == self.issuer and claims.get("aud") == audience and claims.get("exp", 0) > time.time()


class ProtectedMcp:
    """An MCP server over Streamable HTTP (JSON answers, no session) that takes only tokens
    its authorization server issued for it, and whose tool ``whoami`` answers with the
    bearer token it received."""

    def __init__(self, auth: AuthServer | JwtIssuer) -> None:
        self.auth = auth
        self.server = _serve(self)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/mcp"
        self.metadata_url = f"{self.base}/.well-known/oauth-protected-resource/mcp"
        self.seen: list[str | None] = []  # the Authorization header of each POST
        # ... of each tools/call POST alone (other sessions' handshakes and listings come and
        # go beside a test's calls, in any order)
        self.calls: list[str | None] = []
        self.refusing_calls = 0  # how many of the next tools/call POSTs get a 401, whatever their token

    def close(self) -> None:
        stop_serving(self.server)

    def get(self, request: _Handler) -> None:
        path = urlsplit(request.path).path
        if path == "/.well-known/oauth-protected-resource/mcp":
            request.send(
                200, {"resource": self.url, "authorization_servers": [self.auth.issuer], "scopes_supported": ["mcp"]}
            )
        else:
            request.send(405, {"error": "no GET stream"})

    def post(self, request: _Handler) -> None:
        header = request.headers.get("authorization")
        self.seen.append(header)
        token = header[7:] if header and header.lower().startswith("bearer ") else ""
        message = request.json_body()
        refused = not self.auth.valid(token, self.url)
        if type(message) is dict and message.get("method") == "tools/call":
            self.calls.append(header)
            if self.refusing_calls and not refused:
                self.refusing_calls -= 1
                refused = True
        if refused:
            challenge = f'Bearer resource_metadata="{self.metadata_url}", scope="mcp"'
            request.send(401, {"error": "invalid_token"}, {"www-authenticate": challenge})
            return
        if "id" not in message:
            request.send(202)
            return
        method = message.get("method")
        if method == "initialize":
            result: Any = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "protected", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": token}]}
        else:
            request.send(200, {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}})
            return
        request.send(200, {"jsonrpc": "2.0", "id": message["id"], "result": result})

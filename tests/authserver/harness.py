"""Start the authorization server as a process for a test, and talk to it.

``start_authserver(*options)`` runs ``python -m tests.authserver --port 0 ...`` on 127.0.0.1,
reads the issuer URL from its first stdout line, and on exit stops that process by its id
(TERM, then KILL). The ``AuthServer`` handle it yields has the helpers a test needs: metadata,
keys, registration, the authorization code flow driven through the login form, token
requests, and (with ``--test-admin``) key rotation and minting. This module imports neither
Flask nor authlib: only the server process does.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import httpx

ROOT = Path(__file__).parents[2]
USERS = ("alice:alice-password:admins,dev", "bob:bob-password")
START_TIMEOUT = 30.0


def pkce_pair() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def decode_unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a JWT, read without checking its signature."""
    import json

    def part(text: str) -> dict[str, Any]:
        return dict(json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))))

    header, claims, _ = token.split(".")
    return part(header), part(claims)


@attrs.frozen(kw_only=True)
class Registered:
    client_id: str
    client_secret: str | None
    redirect_uri: str

    @property
    def auth(self) -> tuple[str, str] | None:
        return (self.client_id, self.client_secret) if self.client_secret else None


@attrs.define(eq=False)
class AuthServer:
    issuer: str
    pid: int
    log_path: Path
    http: httpx.Client

    def url(self, path: str) -> str:
        return f"{self.issuer}{path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metadata(self) -> dict[str, Any]:
        return dict(self.http.get(self.url("/.well-known/oauth-authorization-server")).raise_for_status().json())

    def jwks(self) -> dict[str, Any]:
        return dict(self.http.get(self.url("/jwks")).raise_for_status().json())

    def register(
        self, *, public: bool = False, redirect_uri: str = "http://127.0.0.1:1/callback", **fields: Any
    ) -> Registered:
        body = {"redirect_uris": [redirect_uri], "client_name": "test client", **fields}
        if public:
            body["token_endpoint_auth_method"] = "none"
        answer = self.http.post(self.url("/register"), json=body).raise_for_status().json()
        return Registered(
            client_id=answer["client_id"], client_secret=answer.get("client_secret"), redirect_uri=redirect_uri
        )

    def authorize_request(
        self, client: Registered, *, challenge: str, resource: str | None = None, scope: str | None = None, **extra: str
    ) -> dict[str, str]:
        params = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": client.redirect_uri,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": secrets.token_urlsafe(8),
            **extra,
        }
        if resource is not None:
            params["resource"] = resource
        if scope is not None:
            params["scope"] = scope
        return params

    def login(self, params: dict[str, str], *, user: str, password: str, decision: str = "approve") -> httpx.Response:
        """Fill the login form as a browser would: GET the page, POST it back with its fields."""
        page = self.http.get(self.url("/authorize"), params=params)
        assert page.status_code == 200, page.text
        return self.http.post(
            self.url("/authorize"), data={**params, "username": user, "password": password, "decision": decision}
        )

    def code_flow(
        self,
        client: Registered,
        *,
        user: str = "alice",
        password: str = "alice-password",
        resource: str | None = None,
        scope: str | None = None,
    ) -> dict[str, Any]:
        """The whole authorization code flow with PKCE; the token endpoint's JSON answer."""
        verifier, challenge = pkce_pair()
        params = self.authorize_request(client, challenge=challenge, resource=resource, scope=scope)
        redirect = self.login(params, user=user, password=password)
        assert redirect.status_code == 302, redirect.text
        query = redirected_query(redirect)
        assert query["state"] == params["state"] and query["iss"] == self.issuer
        answer = self.token(
            client,
            grant_type="authorization_code",
            code=query["code"],
            redirect_uri=client.redirect_uri,
            code_verifier=verifier,
            **({"resource": resource} if resource else {}),
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def token(self, client: Registered, **form: str) -> httpx.Response:
        if client.client_secret is None:
            form = {"client_id": client.client_id, **form}
        return self.http.post(self.url("/token"), data=form, auth=client.auth)

    def rotate(self, *, drop_old: bool = False) -> str:
        answer = self.http.post(self.url("/admin/rotate"), json={"drop_old": drop_old}).raise_for_status().json()
        return str(answer["kid"])

    def mint(
        self,
        claims: dict[str, Any] | None = None,
        *,
        unpublished: bool = False,
        bare: bool = False,
        header: dict[str, Any] | None = None,
    ) -> str:
        """A JWT signed by the server's current key (or its unpublished one): ``claims`` over a
        valid default set, a ``None`` value removing that claim."""
        body = {"claims": claims or {}, "unpublished": unpublished, "bare": bare, "header": header}
        return str(self.http.post(self.url("/admin/mint"), json=body).raise_for_status().json()["token"])


def redirected_query(response: httpx.Response) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(response.headers["location"]).query).items()}


@contextmanager
def start_authserver(*options: str, users: tuple[str, ...] = USERS) -> Iterator[AuthServer]:
    args = [sys.executable, "-m", "tests.authserver", "--host", "127.0.0.1", "--port", "0"]
    for user in users:
        args += ["--user", user]
    with tempfile.TemporaryDirectory(prefix="authserver-") as workdir:
        log_path = Path(workdir) / "stderr.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(args + list(options), cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
        try:
            issuer = _first_line(process)
            with httpx.Client(timeout=10.0) as http:
                yield AuthServer(issuer=issuer, pid=process.pid, log_path=log_path, http=http)
        finally:
            _stop(process)


def _first_line(process: subprocess.Popen[bytes]) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(START_TIMEOUT):
            raise RuntimeError(f"the authorization server printed no URL in {START_TIMEOUT} s")
    line = process.stdout.readline().decode().strip()
    if not line.startswith("http://"):
        raise RuntimeError(f"the authorization server did not start (exit status {process.poll()})")
    return line


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()

"""What the proxy keeps of a person's browser on its OAuth pages: a signed session cookie,
and the small HTML pages those paths answer. Pure: no I/O.

The cookie says which browser this is (a random session id) and, once the person signed in
at the proxy's own authorization server, who (issuer and subject). It is signed with
HMAC-SHA256 under a key drawn at random when the process starts (``BrowserSessions``): it
only has to outlive one consent (the flows it binds live in memory too, so a restart ends
them anyway), and a key of its own cannot be confused with, nor tell anything of, the
vault key. With ``[cluster] keys`` and ``store`` the key is the key ring's ``browser``
subkey instead (the flows are in the store), so every replica reads the cookie. A cookie
that is not ours, altered, past its time, or not even ASCII is no session at all.

Its attributes: HttpOnly (no script reads it), SameSite=Lax (sent on the top-level GET
that an authorization server redirects to, never on another site's POST), Path the
directory of the OAuth paths, Secure when the proxy's public URL is https, and a lifetime
of ``SESSION_SECONDS`` (also inside the signed value, so an old cookie replayed is refused).

The consent form's CSRF token is an HMAC of the session id and the flow: it cannot be made
without the key, and is good only in the browser that was shown the form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import secrets
import time
from collections.abc import Callable, Mapping

import attrs
import orjson

from aggregator.credentials.principal import Principal

COOKIE = "aggregator-oauth"
SESSION_SECONDS = 3600
MAX_COOKIE = 2048
HTML_HEADERS = [
    ("content-type", "text/html; charset=utf-8"),
    ("cache-control", "no-store"),
    ("referrer-policy", "no-referrer"),
    ("content-security-policy", "default-src 'none'; frame-ancestors 'none'"),
    ("x-frame-options", "DENY"),
]


@attrs.frozen(kw_only=True)
class BrowserSession:
    """One browser on the OAuth pages: its id, and who signed in there (None: nobody yet)."""

    id: str
    principal: Principal | None = None
    expires: float = 0.0


class BrowserSessions:
    """Makes and reads the signed session cookie, and the CSRF tokens bound to it."""

    def __init__(
        self, *, path: str, secure: bool, key: bytes | None = None, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.key = key or secrets.token_bytes(32)
        self.path = path
        self.secure = secure
        self.wall_clock = wall_clock

    def new(self, principal: Principal | None = None) -> BrowserSession:
        """A new session (a new id: signing in never keeps the id a browser came with)."""
        return BrowserSession(
            id=secrets.token_urlsafe(16), principal=principal, expires=self.wall_clock() + SESSION_SECONDS
        )

    def set_cookie(self, session: BrowserSession) -> tuple[str, str]:
        """The ``Set-Cookie`` header that gives a browser ``session``."""
        body: dict[str, object] = {"id": session.id, "exp": int(session.expires)}
        if session.principal is not None:
            body["iss"], body["sub"] = session.principal.issuer, session.principal.subject
        payload = base64.urlsafe_b64encode(orjson.dumps(body)).rstrip(b"=").decode("ascii")
        value = f"{payload}.{self._sign('cookie', payload)}"
        attributes = f"; Path={self.path}; Max-Age={SESSION_SECONDS}; HttpOnly; SameSite=Lax"
        return "set-cookie", f"{COOKIE}={value}{attributes}{'; Secure' if self.secure else ''}"

    def read(self, headers: Mapping[str, str]) -> BrowserSession | None:
        """The session a request's cookie proves, or None (none, forged, altered, expired)."""
        value = cookie_value(headers.get("cookie", ""), COOKIE)
        if value is None or len(value) > MAX_COOKIE or value.count(".") != 1 or not value.isascii():
            return None  # (a value outside ASCII is none of ours)
        payload, signature = value.split(".")
        if not hmac.compare_digest(signature.encode("ascii"), self._sign("cookie", payload).encode("ascii")):
            return None
        try:
            body = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, orjson.JSONDecodeError):
            return None
        if type(body) is not dict or not isinstance(body.get("id"), str) or not isinstance(body.get("exp"), int):
            return None
        if body["exp"] <= self.wall_clock():
            return None
        issuer, subject = body.get("iss"), body.get("sub")
        principal = (
            Principal(issuer=issuer, subject=subject) if isinstance(issuer, str) and isinstance(subject, str) else None
        )
        return BrowserSession(id=body["id"], principal=principal, expires=float(body["exp"]))

    def csrf_token(self, session: BrowserSession, flow: str) -> str:
        return self._sign("consent", f"{session.id}\n{flow}")

    def csrf_good(self, session: BrowserSession, flow: str, token: str) -> bool:
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self.csrf_token(session, flow).encode())

    def _sign(self, purpose: str, text: str) -> str:
        message = f"{purpose}\n{text}".encode("utf-8", "surrogatepass")
        digest = hmac.new(self.key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def cookie_value(header: str, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` header (the first if sent twice)."""
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def page(title: str, *paragraphs: str, form: str = "") -> bytes:
    """A small HTML page: a title, paragraphs of text (escaped here), and a form (markup)."""
    text = "".join(f"<p>{html.escape(paragraph)}</p>" for paragraph in paragraphs)
    return (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<h1>{html.escape(title)}</h1>{text}{form}"
    ).encode()

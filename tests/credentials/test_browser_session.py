"""The connect page's session cookie: signed, its attributes, and every way a cookie that is
not the proxy's own, or is past its time, is no session at all."""

from __future__ import annotations

import base64

import orjson

from aggregator.credentials.browser import COOKIE, SESSION_SECONDS, BrowserSessions, cookie_value
from aggregator.credentials.principal import Principal

ALICE = Principal(issuer="https://idp.example", subject="alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def sent(sessions: BrowserSessions, principal: Principal | None = ALICE) -> tuple[str, dict[str, str]]:
    """A new session's Set-Cookie value, and the request headers a browser sends back with it."""
    _, header = sessions.set_cookie(sessions.new(principal))
    value = header.split(";", 1)[0].split("=", 1)[1]
    return header, {"cookie": f"other=1; {COOKIE}={value}"}


def test_a_cookie_round_trips_with_its_attributes():
    sessions = BrowserSessions(path="/oauth", secure=False)
    header, headers = sent(sessions)
    attributes = header.split("; ")[1:]
    assert attributes == ["Path=/oauth", f"Max-Age={SESSION_SECONDS}", "HttpOnly", "SameSite=Lax"]
    read = sessions.read(headers)
    assert read is not None and read.principal == ALICE
    assert sessions.read({"cookie": "other=1"}) is None and sessions.read({}) is None
    secure = BrowserSessions(path="/", secure=True)
    assert sent(secure)[0].endswith("; Secure")
    # A browser not signed in yet has a session without a user.
    anonymous = sessions.read(sent(sessions, None)[1])
    assert anonymous is not None and anonymous.principal is None


def test_a_tampered_or_forged_cookie_is_no_session():
    sessions = BrowserSessions(path="/oauth", secure=False)
    _, headers = sent(sessions)
    value = cookie_value(headers["cookie"], COOKIE)
    assert value is not None
    payload, signature = value.split(".")
    body = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
    # Another subject, the signature kept: refused.
    other = base64.urlsafe_b64encode(orjson.dumps({**body, "sub": "mallory"})).rstrip(b"=").decode()
    assert sessions.read({"cookie": f"{COOKIE}={other}.{signature}"}) is None
    # A signature changed by one character, or cut: refused.
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    for forged in (f"{payload}.{flipped}", payload, f"{payload}.", f"{payload}.{signature}.x", "", "."):
        assert sessions.read({"cookie": f"{COOKIE}={forged}"}) is None, forged
    # The same cookie made with another key (another process, or a forger's): refused.
    elsewhere = BrowserSessions(path="/oauth", secure=False)
    assert elsewhere.read(headers) is None
    # A signed value that is not the cookie's shape: refused, never an exception.
    for shape in (b"[]", b'{"id": 1, "exp": 2}', b'{"id": "x"}', b"not json"):
        text = base64.urlsafe_b64encode(shape).rstrip(b"=").decode()
        assert sessions.read({"cookie": f"{COOKIE}={text}.{sessions._sign('cookie', text)}"}) is None


def test_a_cookie_past_its_time_is_refused():
    clock = Clock()
    sessions = BrowserSessions(path="/oauth", secure=False, wall_clock=clock)
    _, headers = sent(sessions)
    clock.now += SESSION_SECONDS - 1
    assert sessions.read(headers) is not None
    clock.now += 1
    assert sessions.read(headers) is None


def test_a_csrf_token_is_good_for_one_session_and_one_flow():
    sessions = BrowserSessions(path="/oauth", secure=False)
    mine, theirs = sessions.new(ALICE), sessions.new(ALICE)
    token = sessions.csrf_token(mine, "flow-1")
    assert sessions.csrf_good(mine, "flow-1", token)
    assert not sessions.csrf_good(theirs, "flow-1", token)
    assert not sessions.csrf_good(mine, "flow-2", token)
    assert not sessions.csrf_good(mine, "flow-1", "") and not sessions.csrf_good(mine, "flow-1", "\udcff")


def test_a_cookie_outside_ascii_is_no_session():
    sessions = BrowserSessions(path="/oauth", secure=False)
    # how a header's raw bytes b"a.\xc3\xa9" reach a handler (latin-1), and as text
    for value in ("a.\u00c3\u00a9", "a.\u00e9\u00e9", "\u00e9.abc"):
        assert sessions.read({"cookie": f"{COOKIE}={value}"}) is None

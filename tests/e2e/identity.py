"""What the end-to-end tests of servers acting as each user share: a 2025-11-25 session with
an access token, a user's token from the suite's authorization server, and a person at a
browser going through the proxy's connect page (signing in, consenting, logging in)."""

from __future__ import annotations

import base64
import html
import json
from urllib.parse import parse_qsl, urljoin, urlsplit

import httpx

from tests.authserver.harness import decode_unverified
from tests.e2e.conftest import events, post

RESOURCE = "http://127.0.0.1/mcp"
VAULT_KEY = base64.b64encode(bytes(range(32))).decode()


def token_of(authserver, user: str, scope: str = "mcp") -> str:
    client = authserver.register()
    answer = authserver.code_flow(client, user=user, password=f"{user}-password", resource=RESOURCE, scope=scope)
    return str(answer["access_token"])


class Session:
    """A 2025-11-25 client session over Streamable HTTP with an access token."""

    def __init__(self, port: int, token: str, capabilities: dict | None = None) -> None:
        self.port, self.token, self.next_id = port, token, 1
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities or {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
        status, headers, body = post(port, init, self.headers())
        assert status == 200, body
        self.id = headers["mcp-session-id"]
        post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, self.headers())

    def headers(self) -> dict[str, str]:
        found = {"authorization": f"Bearer {self.token}", "mcp-protocol-version": "2025-11-25"}
        if getattr(self, "id", None):
            found["mcp-session-id"] = self.id
        return found

    def request(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        status, _, body = post(self.port, message, self.headers())
        assert status == 200, body
        return [m for m in events(body) if m.get("id") == self.next_id][0]

    def notification(self, method: str) -> dict:
        """The first message ``method`` on the session's GET stream (what waited for it comes first)."""
        headers = {**self.headers(), "accept": "text/event-stream", "host": f"127.0.0.1:{self.port}"}
        with httpx.stream("GET", f"http://127.0.0.1:{self.port}/mcp", headers=headers, timeout=10) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("data: ") and line[6:].strip() and json.loads(line[6:]).get("method") == method:
                    return dict(json.loads(line[6:]))
        raise AssertionError(f"no {method}")

    def whoami(self) -> dict:
        return self.request("tools/call", {"name": "docs__whoami", "arguments": {}})


def claims_of(answer: dict) -> dict:
    assert "result" in answer, answer
    return decode_unverified(answer["result"]["content"][0]["text"])[1]


def sign_in(url: str, user: str, *, browser: httpx.Client | None = None) -> httpx.Response:
    """A person at a browser with the URL they were given: the proxy's connect page sends a
    browser it does not know to sign in at the proxy's authorization server (its login form),
    then shows its consent page; its button leads to the server's authorization server (the
    same one here: its login form again), which redirects to the proxy's callback. The last
    answer: the callback's, or the connect page's when it refused. ``browser``: one with its
    cookies already (a new one by default)."""
    own = browser is None
    browser = browser or httpx.Client()
    try:
        page = consent_page(browser, url, user)
        if page.status_code != 200:
            return page
        return browser.get(login(browser, press(browser, url, page), user))
    finally:
        if own:
            browser.close()


def consent_page(browser: httpx.Client, url: str, user: str) -> httpx.Response:
    """The connect page at ``url``, signing ``browser`` in as ``user`` first if the proxy
    does not know it: its consent page (200), or its refusal."""
    assert "/oauth/connect?flow=" in url and "authorize" not in url
    page = browser.get(url)
    if page.status_code == 303:  # not signed in here yet
        back = login(browser, page.headers["location"], user)
        signed_in = browser.get(back)
        assert signed_in.status_code == 303, signed_in.text
        page = browser.get(urljoin(back, signed_in.headers["location"]))
    return page


def press(browser: httpx.Client, url: str, page: httpx.Response) -> str:
    """The consent page's button; the authorization server's URL it redirects to."""
    form = {name: hidden(page.text, name) for name in ("flow", "csrf")}
    pressed = browser.post(url.split("?", 1)[0], data=form)
    assert pressed.status_code == 303, pressed.text
    return str(pressed.headers["location"])


def login(browser: httpx.Client, url: str, user: str) -> str:
    """The authorization server's login form at ``url``, filled; where it redirects to."""
    params = dict(parse_qsl(urlsplit(url).query))
    base = url.split("/authorize", 1)[0]
    assert browser.get(url).status_code == 200
    form = {**params, "username": user, "password": f"{user}-password", "decision": "approve"}
    redirect = browser.post(f"{base}/authorize", data=form)
    assert redirect.status_code == 302, redirect.text
    return str(redirect.headers["location"])


def hidden(text: str, name: str) -> str:
    return html.unescape(text.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])

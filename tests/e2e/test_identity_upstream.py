"""Servers that act as the calling user, end to end: the proxy as a resource server in
front of the suite's authorization server (``tests/authserver``, a process), and a
protected MCP server over Streamable HTTP that takes only tokens issued for it and whose
tool ``whoami`` echoes the token it received. Each user's session reaches it as that user:
by token exchange (RFC 8693), never passing the caller's own token on, or by the user's
own grant, asked for when there is none."""

from __future__ import annotations

import base64
import html
import json
import sqlite3
import subprocess
import sys
import time
from urllib.parse import parse_qsl, urlsplit

import anyio
import httpx
import mcp_types as types
import pytest
import trio
from mcp import Client, UrlElicitationRequiredError
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.authserver.harness import decode_unverified
from tests.credentials.peers import JwtIssuer, ProtectedMcp
from tests.e2e.chromium import consent_in_chromium, needs_chromium
from tests.e2e.conftest import ROOT, events, http_proxy, post, stateless, write_config
from tests.e2e.identity import (
    RESOURCE,
    VAULT_KEY,
    Session,
    claims_of,
    consent_page,
    hidden,
    login,
    press,
    sign_in,
    token_of,
)
from tests.e2e.span_collector import Collector
from tests.loopback import serve_in_thread, stop_serving

pytestmark = pytest.mark.e2e
EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


@pytest.fixture
def protected(authserver):
    server = ProtectedMcp(JwtIssuer(authserver.issuer))
    yield server
    server.close()


def config_for(tmp_path, authserver, server: str) -> object:
    return write_config(
        tmp_path,
        f'''
[auth]
resource = "{RESOURCE}"
scopes_supported = ["mcp"]

[[auth.issuers]]
issuer = "{authserver.issuer}"

[credentials]
vault = "tokens.db"
vault_key = "{VAULT_KEY}"
{server}''',
        startup_timeout=2.0,
    )


def modern_whoami(port: int, token: str, capabilities: dict, responses: dict | None = None) -> dict:
    """``docs__whoami`` as a 2026-07-28 request without a session."""
    params: dict = {"name": "docs__whoami", "arguments": {}}
    if responses is not None:
        params["inputResponses"] = responses
    body, headers = stateless(7, "tools/call", params)
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = capabilities
    headers.update({"authorization": f"Bearer {token}", "mcp-name": "docs__whoami"})
    status, _, answer = post(port, body, headers)
    assert status == 200, answer
    return [m for m in events(answer) if m.get("id") == 7][0]


def test_token_exchange_gives_each_user_their_own_identity(tmp_path, authserver, protected):
    proxy_client = authserver.register(
        grant_types=["authorization_code", EXCHANGE], redirect_uri="http://127.0.0.1:2/cb"
    )
    server = f'''
[servers.docs]
url = "{protected.url}"
auth = "token-exchange"
[servers.docs.oauth]
issuer = "{authserver.issuer}"
client_id = "{proxy_client.client_id}"
client_secret = "{proxy_client.client_secret}"
'''
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    with http_proxy(config_for(tmp_path, authserver, server)) as (port, log):
        alice, bob = Session(port, alice_token), Session(port, bob_token)
        first = claims_of(alice.whoami())
        assert first["sub"] == "alice" and first["aud"] == protected.url
        assert claims_of(bob.whoami())["sub"] == "bob"
        # Cached per user and server: the same exchanged token serves alice's next call.
        again = alice.whoami()
        assert claims_of(again) == first
        # A second session of alice's gets alice, and never bob's token.
        assert claims_of(Session(port, alice_token).whoami())["sub"] == "alice"
        # The server refuses what it was sent (401): a new exchange, the call goes through.
        # (Counted among its calls alone: the other sessions' handshakes and listings may
        # still be arriving, in any order, and are none of this.)
        protected.refusing_calls = 1
        before = len(protected.calls)
        assert claims_of(alice.whoami())["sub"] == "alice"
        assert len(protected.calls) == before + 2  # refused, then sent again with a new exchange
        assert protected.calls[-1] != protected.calls[-2]
        # Who each session is shows in the status (to an operator: a token with the admin
        # scope); no token does, there or in the metrics.
        assert post(port, None, alice.headers(), path="/status.json", method="GET")[0] == 403
        operator = {"authorization": f"Bearer {token_of(authserver, 'alice', 'mcp aggregator:admin')}"}
        shown = b"".join(
            post(port, None, operator, path=path, method="GET")[2] for path in ("/status.json", "/metrics")
        )
        assert f"alice ({authserver.issuer})".encode() in shown
        text = log.read_text()
    # The callers' own tokens never went upstream, and no token reached the log.
    assert f"Bearer {alice_token}" not in protected.seen and f"Bearer {bob_token}" not in protected.seen
    for token in (alice_token, bob_token, *[(h or "")[7:] for h in protected.seen]):
        assert not token or (token not in text and token.encode() not in shown)


def test_the_users_own_grant_is_asked_for(tmp_path, authserver, protected):
    server = f"""
[servers.docs]
url = "{protected.url}"
auth = "oauth"
"""
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    config = config_for(tmp_path, authserver, server)
    with http_proxy(config) as (port, log):
        # A client that cannot elicit: a clear error naming the URL to open.
        plain = Session(port, alice_token)
        asked = plain.whoami()["error"]
        assert asked["data"]["reason"] == "unauthorized" and asked["data"]["url"] in asked["message"]
        # A 2025-11-25 client that takes URL elicitations: -32042, the URL in data.elicitations.
        eliciting = Session(port, alice_token, {"elicitation": {"url": {}}})
        required = eliciting.whoami()["error"]
        assert required["code"] == -32042
        [elicitation] = required["data"]["elicitations"]
        assert elicitation["mode"] == "url" and elicitation["elicitationId"]
        url = elicitation["url"]
        # The proxy's connect page, naming nobody; never the authorization server's URL.
        assert url.startswith(f"http://127.0.0.1:{port}/oauth/connect?flow=") and "state=" not in log.read_text()
        assert set(dict(parse_qsl(urlsplit(url).query))) == {"flow"}
        # Bob opening alice's link: the connect page signs his browser in, sees it is not
        # alice's, and grants nothing (the phishing of the spec's URL elicitation).
        stolen = sign_in(url, "bob")
        assert stolen.status_code == 403 and "made for another user" in stolen.text
        assert "error" in eliciting.whoami()
        # Alice consents; her call, retried, goes through as alice.
        [elicitation] = eliciting.whoami()["error"]["data"]["elicitations"]
        url = elicitation["url"]
        done = sign_in(url, "alice")
        assert done.status_code == 200, done.text
        # The client that was asked hears the grant is given.
        complete = eliciting.notification("notifications/elicitation/complete")
        assert complete["params"] == {"elicitationId": elicitation["elicitationId"]}
        assert sign_in(url, "alice").status_code == 400  # a state is used once
        claims = claims_of(eliciting.whoami())
        assert claims["sub"] == "alice" and claims["aud"] == protected.url
        # About to expire: refreshed before it is sent (the server rotates the refresh token).
        with sqlite3.connect(tmp_path / "tokens.db") as db:
            db.execute("UPDATE grants SET expires_at = 0")
        sent = len(protected.calls)
        assert claims_of(eliciting.whoami())["sub"] == "alice"
        assert protected.calls[sent] != protected.calls[sent - 1]  # a new access token
        # Bob has no grant of his own: he is asked, never served with alice's.
        assert Session(port, bob_token).whoami()["error"]["data"]["reason"] == "unauthorized"
        # A 401 from the server after consent: asked again.
        protected.refusing_calls = 1
        assert eliciting.whoami()["error"]["code"] == -32042
        done = sign_in(Session(port, alice_token).whoami()["error"]["data"]["url"], "alice")
        assert done.status_code == 200, done.text
        assert claims_of(Session(port, alice_token).whoami())["sub"] == "alice"
        # Revoked: the next call asks again.
        revoke = subprocess.run(
            [sys.executable, "-m", "aggregator", "auth", "revoke", "alice", "docs", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert revoke.returncode == 0, revoke.stderr
        assert Session(port, alice_token).whoami()["error"]["data"]["reason"] == "unauthorized"
        # A 2026-07-28 caller: the input request form of URL elicitation when it declared it,
        # else the error naming the URL (-32042 is 2025-11-25 only).
        unable = modern_whoami(port, alice_token, {})["error"]
        assert unable["code"] != -32042 and unable["data"]["url"] in unable["message"]
        asked = modern_whoami(port, alice_token, {"elicitation": {"url": {}}})["result"]
        assert asked["resultType"] == "input_required"
        [request] = asked["inputRequests"].values()
        assert request["method"] == "elicitation/create" and request["params"]["mode"] == "url"
        assert sign_in(request["params"]["url"], "alice").status_code == 200
        [key] = asked["inputRequests"]
        again = modern_whoami(port, alice_token, {"elicitation": {"url": {}}}, {key: {"action": "accept"}})
        assert claims_of(again)["sub"] == "alice"
        text = log.read_text()
    for token in (alice_token, bob_token, *[(h or "")[7:] for h in protected.seen]):
        assert not token or token not in text
    assert "code=" not in text and "state=" not in text


def test_only_the_users_own_browser_completes_their_grant(tmp_path, authserver, protected):
    """The connect page and the callback, attacked: alice's link opened by bob's browser,
    the button pressed without the page's CSRF token, the callback reached by a browser
    without the cookie, with a cookie altered, and a cookie forged. Each is refused, and
    alice has no grant until her own browser goes the whole way."""
    server = f"""
[servers.docs]
url = "{protected.url}"
auth = "oauth"
"""
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    with http_proxy(config_for(tmp_path, authserver, server)) as (port, log):
        alice = Session(port, alice_token)
        connect = f"http://127.0.0.1:{port}/oauth/connect"

        def link() -> str:
            return str(alice.whoami()["error"]["data"]["url"])

        def granted() -> int:
            with sqlite3.connect(tmp_path / "tokens.db") as db:
                return int(db.execute("SELECT count(*) FROM grants").fetchone()[0])

        with httpx.Client() as bob:
            # Bob's browser, signed in at the proxy through a link of his own, opens alice's.
            own = consent_page(bob, Session(port, bob_token).whoami()["error"]["data"]["url"], "bob")
            assert own.status_code == 200 and f"bob ({authserver.issuer})" in own.text
            theirs = link()
            refused = bob.get(theirs)
            assert refused.status_code == 403 and "made for another user" in refused.text
            # His page's token does not press alice's button, nor does none at all.
            flow = dict(parse_qsl(urlsplit(theirs).query))["flow"]
            for form in ({"flow": flow, "csrf": hidden(own.text, "csrf")}, {"flow": flow}):
                assert bob.post(connect, data=form).status_code == 403
            # A browser that has just signed in as bob is refused the same way.
            assert sign_in(theirs, "bob").status_code == 403

        with httpx.Client() as browser:
            # Alice's own consent page, its button pressed without its CSRF token: refused.
            url = link()
            page = consent_page(browser, url, "alice")
            assert page.status_code == 200 and f"alice ({authserver.issuer})" in page.text
            assert "server 'docs'" in html.unescape(page.text)
            flow = hidden(page.text, "flow")
            for form in ({"flow": flow}, {"flow": flow, "csrf": ""}, {"flow": flow, "csrf": "made-up"}):
                assert browser.post(connect, data=form).status_code == 403
            # The callback reached by a browser without the cookie: refused, and the flow is over.
            callback = login(browser, press(browser, url, page), "alice")
            without = httpx.get(callback)
            assert without.status_code == 400 and "did not open the link" in without.text
            assert browser.get(callback).status_code == 400

            # An altered cookie: refused at the callback.
            url = link()
            callback = login(browser, press(browser, url, consent_page(browser, url, "alice")), "alice")
            [cookie] = list(browser.cookies.jar)
            kept = cookie.value
            payload, signature = kept.split(".")
            body = json.loads(base64.urlsafe_b64decode(payload + "=="))
            cookie.value = (
                base64.urlsafe_b64encode(json.dumps({**body, "id": "x" * 22}).encode()).decode() + "." + signature
            )
            assert browser.get(callback).status_code == 400
            # A cookie forged to name alice (a made-up signature): the connect page does not know
            # the browser and sends it to sign in; the consent page is not shown.
            forged = base64.urlsafe_b64encode(json.dumps({**body, "sub": "alice"}).encode()).decode().rstrip("=")
            cookie.value = f"{forged}.{base64.urlsafe_b64encode(bytes(32)).decode().rstrip('=')}"
            opened = browser.get(link())
            assert opened.status_code == 303 and opened.headers["location"].startswith(
                authserver.issuer + "/authorize?"
            )
            assert "error" in alice.whoami() and granted() == 0

            # Her own browser, the whole way: granted, and she acts as herself.
            cookie.value = kept
            assert sign_in(link(), "alice", browser=browser).status_code == 200
        assert granted() == 1 and claims_of(alice.whoami())["sub"] == "alice"
        text = log.read_text()
    assert "made for" in text or "opened by" in text
    assert kept not in text and "csrf" not in text.lower()


def test_the_official_sdk_client_consents_by_url(tmp_path, authserver, protected):
    """The official Python SDK as the caller: in 2025-11-25 it raises -32042 with the URL, hears
    ``notifications/elicitation/complete`` once the user signed in, and its retried call goes
    through as that user; in 2026-07-28 its elicitation callback is handed the URL and the call,
    retried by the SDK with the answer, goes through."""
    server = f"""
[servers.docs]
url = "{protected.url}"
auth = "oauth"
"""
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    opened: list[str] = []

    async def open_url(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams), params
        opened.append(params.url)
        signed = await anyio.to_thread.run_sync(sign_in, params.url, "bob")
        assert signed.status_code == 200, signed.text
        return types.ElicitResult(action="accept")

    def client(port: int, token: str, mode: str, handler=None) -> Client:
        transport = streamable_http_client(
            f"http://127.0.0.1:{port}/mcp",
            http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}),
        )
        return Client(transport, mode=mode, cache=None, elicitation_callback=open_url, message_handler=handler)

    async def legacy(port: int) -> dict:
        completed: list[str | None] = []
        heard = anyio.Event()

        async def handler(message) -> None:
            if isinstance(message, types.ElicitCompleteNotification):
                completed.append(message.params.elicitation_id)
                heard.set()

        async with client(port, alice_token, "legacy", handler) as sdk:
            with pytest.raises(MCPError) as refused:
                await sdk.call_tool("docs__whoami", {})
            assert refused.value.code == -32042
            [elicitation] = UrlElicitationRequiredError.from_error(refused.value.error).elicitations
            assert "/oauth/connect?flow=" in elicitation.url and elicitation.elicitation_id
            done = await anyio.to_thread.run_sync(sign_in, elicitation.url, "alice")
            assert done.status_code == 200, done.text
            with anyio.fail_after(10):
                await heard.wait()
            assert completed == [elicitation.elicitation_id]
            called = await sdk.call_tool("docs__whoami", {})
        return decode_unverified(getattr(called.content[0], "text", ""))[1]

    async def modern(port: int) -> dict:
        async with client(port, bob_token, "2026-07-28") as sdk:
            called = await sdk.call_tool("docs__whoami", {})
        return decode_unverified(getattr(called.content[0], "text", ""))[1]

    async def within(run, port: int) -> dict:
        with anyio.fail_after(60):
            return await run(port)

    with http_proxy(config_for(tmp_path, authserver, server)) as (port, log):
        claims = anyio.run(within, legacy, port)
        assert claims["sub"] == "alice" and claims["aud"] == protected.url
        claims = anyio.run(within, modern, port)
        assert claims["sub"] == "bob" and len(opened) == 1
        text = log.read_text()
    for token in (alice_token, bob_token, *[(h or "")[7:] for h in protected.seen]):
        assert not token or token not in text


@needs_chromium
def test_the_connect_page_in_a_real_browser(tmp_path, authserver, protected):
    server = f"""
[servers.docs]
url = "{protected.url}"
auth = "oauth"
"""
    alice_token = token_of(authserver, "alice")
    with http_proxy(config_for(tmp_path, authserver, server)) as (port, _):
        alice = Session(port, alice_token)
        url = alice.whoami()["error"]["data"]["url"]
        text, cookies = trio.run(consent_in_chromium, url, tmp_path / "browser", authserver.issuer)
        assert "Access granted" in text, text
        [cookie] = [c for c in cookies if c["name"] == "aggregator-oauth"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/oauth"
        assert not cookie["secure"]  # plain http on loopback
        assert claims_of(alice.whoami())["sub"] == "alice"


def test_no_token_reaches_a_span(tmp_path, authserver, protected, monkeypatch):
    """Traced, a proxy with ``[auth]`` in front of a server reached by token exchange and one
    reached by the user's own grant: no token, the caller's or one sent upstream, is in a span."""
    proxy_client = authserver.register(
        grant_types=["authorization_code", EXCHANGE], redirect_uri="http://127.0.0.1:2/cb"
    )
    servers = f'''
[servers.docs]
url = "{protected.url}"
auth = "oauth"

[servers.ex]
url = "{protected.url}"
auth = "token-exchange"
[servers.ex.oauth]
issuer = "{authserver.issuer}"
client_id = "{proxy_client.client_id}"
client_secret = "{proxy_client.client_secret}"
'''
    alice_token = token_of(authserver, "alice")
    collector = serve_in_thread(Collector)
    Collector.spans = []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        with http_proxy(config_for(tmp_path, authserver, servers)) as (port, log):
            alice = Session(port, alice_token)
            assert sign_in(alice.whoami()["error"]["data"]["url"], "alice").status_code == 200
            assert claims_of(alice.whoami())["sub"] == "alice"
            exchanged = alice.request("tools/call", {"name": "ex__whoami", "arguments": {}})
            assert claims_of(exchanged)["sub"] == "alice"
            # Again, on the session's own connections now open: each call is traced to its server.
            assert claims_of(alice.whoami())["sub"] == "alice"
            assert "result" in alice.request("tools/call", {"name": "ex__whoami", "arguments": {}})
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not CALLS <= names():
                time.sleep(0.1)
        assert CALLS <= names(), names()
    finally:
        stop_serving(collector)
    with Collector.lock:
        spans = "\n".join(str(span) for _, span in Collector.spans)
    tokens = {alice_token, *[(h or "")[7:] for h in protected.seen]} - {""}
    assert len(tokens) >= 3, tokens  # the caller's, the user's own grant, the exchanged one
    for token in tokens:
        assert token not in spans and token.split(".")[2] not in spans
    assert proxy_client.client_secret not in spans
    assert "code=" not in spans and "state=" not in spans and "Bearer" not in spans


CALLS = {"tools/call docs__whoami", "tools/call ex__whoami", "tools/call docs@1", "tools/call ex@1"}


def names() -> set[str]:
    """The names of the spans collected so far."""
    with Collector.lock:
        return {span.name for _, span in Collector.spans}


def names_listed(session: Session, method: str = "tools/list", kind: str = "tools") -> list[str]:
    answer = session.request(method)
    assert "result" in answer, answer
    return [item["name"] for item in answer["result"][kind]]


def readyz(port: int, token: str) -> tuple[int, dict]:
    status, _, body = post(port, None, {"authorization": f"Bearer {token}"}, path="/readyz", method="GET")
    return status, json.loads(body)


def test_a_new_session_lists_a_server_acting_as_its_user(tmp_path, authserver, protected):
    """A server reached by token exchange answers 401 to anything without a user's token: the
    proxy never connects to it anonymously. A new session's first tools/list waits for its own
    connection and shows the server's tools; search mode finds them likewise; readiness does
    not wait for such a server, and the status and check show it as per user."""
    proxy_client = authserver.register(
        grant_types=["authorization_code", EXCHANGE], redirect_uri="http://127.0.0.1:2/cb"
    )
    server = f'''
[servers.docs]
url = "{protected.url}"
auth = "token-exchange"
[servers.docs.oauth]
issuer = "{authserver.issuer}"
client_id = "{proxy_client.client_id}"
client_secret = "{proxy_client.client_secret}"

[proxy.discovery]
mode = "auto"
'''
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    config = config_for(tmp_path, authserver, server)
    with http_proxy(config) as (port, log):
        status, ready = readyz(port, alice_token)
        assert status == 200, ready
        assert ready["servers"]["docs"] == {"state": "per user", "sessions": 0}
        alice = Session(port, alice_token)
        assert names_listed(alice) == ["docs__whoami"]
        # Search mode's find_tools, a new session's first request, finds it too.
        found = Session(port, bob_token).request("tools/call", {"name": "find_tools", "arguments": {"query": "whoami"}})
        assert [tool["name"] for tool in found["result"]["structuredContent"]["tools"]] == ["docs__whoami"]
        assert claims_of(alice.whoami())["sub"] == "alice"
        status, ready = readyz(port, alice_token)
        assert status == 200 and ready["servers"]["docs"] == {"state": "per user", "sessions": 2}, ready
        operator = {"authorization": f"Bearer {token_of(authserver, 'alice', 'mcp aggregator:admin')}"}
        status, _, body = post(port, None, operator, path="/status.json", method="GET")
        [row] = [row for row in json.loads(body)["servers"] if row["name"] == "docs"]
        assert row["state"] == "per user" and row["sessions"] == 2, row
        text = log.read_text()
    # Never connected without a user: every request it got carried a token, and nothing was refused.
    assert protected.seen and None not in protected.seen
    assert "401" not in text and "WARNING" not in text, text
    check = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "per user" in check.stdout and "needs a user" in check.stdout and "down" not in check.stdout


def test_a_session_is_shown_how_to_grant_a_server_acting_as_its_user(tmp_path, authserver, protected):
    """``auth = "oauth"`` before the user's grant: the first tools/list shows the server's grant
    tool, whose call asks for the grant; once given, the call says so, the session lists the
    server's own tools, and a new session of the same user lists them at once."""
    server = f"""
[servers.docs]
url = "{protected.url}"
auth = "oauth"
"""
    alice_token, bob_token = token_of(authserver, "alice"), token_of(authserver, "bob")
    with http_proxy(config_for(tmp_path, authserver, server)) as (port, log):
        alice = Session(port, alice_token, {"elicitation": {"url": {}}})
        assert names_listed(alice) == ["docs__grant_access"]
        required = alice.request("tools/call", {"name": "docs__grant_access", "arguments": {}})["error"]
        assert required["code"] == -32042
        [elicitation] = required["data"]["elicitations"]
        assert sign_in(elicitation["url"], "alice").status_code == 200
        granted = alice.request("tools/call", {"name": "docs__grant_access", "arguments": {}})
        assert "granted" in granted["result"]["content"][0]["text"], granted
        assert names_listed(alice) == ["docs__whoami"]
        assert names_listed(Session(port, alice_token)) == ["docs__whoami"]
        # Bob has granted nothing: he sees the grant tool, never alice's listing or token.
        bob = Session(port, bob_token)
        assert names_listed(bob) == ["docs__grant_access"]
        assert (
            bob.request("tools/call", {"name": "docs__grant_access", "arguments": {}})["error"]["data"]["reason"]
            == "unauthorized"
        )
        status, ready = readyz(port, alice_token)
        assert status == 200, ready
        text = log.read_text()
    assert None not in protected.seen
    for token in (alice_token, bob_token, *[(h or "")[7:] for h in protected.seen]):
        assert not token or token not in text

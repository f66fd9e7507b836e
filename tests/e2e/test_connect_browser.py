"""The connect page in a real browser (Debian's ``chromium``, headless, driven over the
DevTools protocol): the link a user is given signs the browser in at the proxy's
authorization server, shows the consent page, and its button leads through the server's
authorization server back to the callback, which the browser's own cookie gets through;
the cookie is HttpOnly, SameSite=Lax and scoped to the OAuth paths."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.e2e.conftest import http_proxy
from tests.e2e.test_identity_upstream import Session, claims_of, config_for, protected, token_of
from tests.e2e.test_status_page import CHROMIUM, needs_chromium

pytestmark = pytest.mark.e2e
__all__ = ["protected"]  # the fixture, used here


class Page:
    """One tab of a headless chromium, over its DevTools WebSocket."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        number = next(self.ids)
        await self.socket.send_message(json.dumps({"id": number, "method": method, "params": params or {}}))
        while True:
            message = json.loads(await self.socket.get_message())
            if message.get("id") == number:
                return dict(message)

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return answer.get("result", {}).get("result", {}).get("value")

    async def wait_for(self, expression: str) -> None:
        """Until ``expression`` is true in the page (navigations come and go meanwhile)."""
        while True:  # (bounded by the caller's fail_after)
            if await self.evaluate(expression):
                return
            await trio.sleep(0.1)

    async def sign_in(self, user: str) -> None:
        """The authorization server's login form, filled and approved."""
        await self.wait_for("!!document.getElementById('username')")
        await self.evaluate(
            f"document.getElementById('username').value = {json.dumps(user)};"
            f"document.getElementById('password').value = {json.dumps(user + '-password')};"
            "document.getElementById('approve').click(); true"
        )


async def consent_in_chromium(url: str, profile: Path, issuer: str) -> tuple[str, list[dict[str, Any]]]:
    """Open ``url`` in chromium and go the whole way as alice; the last page's text and the
    browser's cookies."""
    process = await trio.lowlevel.open_process(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(60):
            active = profile / "DevToolsActivePort"
            while True:
                if active.exists() and active.read_text().strip():
                    break
                await trio.sleep(0.1)
            port = int(active.read_text().split()[0])
            async with httpx.AsyncClient() as http:
                targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            target = next(t for t in targets if t["type"] == "page")
            async with open_websocket_url(target["webSocketDebuggerUrl"]) as socket:
                page = Page(socket)
                await page.call("Page.navigate", {"url": url})
                await page.sign_in("alice")  # at the proxy's own authorization server
                await page.wait_for("!!document.getElementById('connect')")
                assert "alice" in await page.evaluate("document.body.innerText")
                await page.evaluate("document.getElementById('connect').click(); true")
                await page.wait_for(f"location.href.startsWith({json.dumps(issuer + '/authorize')})")
                await page.sign_in("alice")  # at the server's
                await page.wait_for("document.title === 'Access granted' || document.title === 'Not granted'")
                text = await page.evaluate("document.body.innerText")
                cookies = (await page.call("Network.getAllCookies"))["result"]["cookies"]
                return str(text), list(cookies)
    finally:
        process.kill()
        await process.wait()


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

"""A real browser for the end-to-end tests: Debian's ``chromium``, headless (``CHROMIUM``;
tests that need it are marked ``needs_chromium``), driven over the DevTools protocol
(``Page``), or asked for a page's DOM (``test_status_page``). ``consent_in_chromium`` goes
through the proxy's connect page as a person would."""

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

from tests.required import REQUIRED

CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists() and not REQUIRED,
    reason="needs /usr/bin/chromium (Debian: apt-get install -y chromium)",
)


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

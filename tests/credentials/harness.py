"""What the credentials tests share: a config naming the peers, the credentials it opens,
the proxy's HTTP listener serving the OAuth callback, a program that consents as a person
would, and the proxy's connection to a server driven line by line."""

from __future__ import annotations

import base64
import json
import os
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import trio

from aggregator.config import Config, structure_config
from aggregator.credentials.service import UserCredentials
from aggregator.fronts.http.endpoint import StreamableHttpEndpoint
from aggregator.hub.hub import Hub
from aggregator.upstreams.streamable_http_upstream import run_streamable_http_server
from tests.loopback import INIT, free_port
from tests.session.harness import FakeUpstreams

KEY = base64.b64encode(os.urandom(32)).decode()


def make_config(tmp_path: Any, servers: dict[str, Any], port: int | None = None, **credentials: Any) -> Config:
    return structure_config(
        {
            "http": {"listen": f"127.0.0.1:{port or free_port()}"},
            "credentials": {"vault": str(tmp_path / "tokens.db"), "vault_key": KEY, **credentials},
            "servers": servers,
        },
        environ={},
    )


@asynccontextmanager
async def opened(config: Config, transport: httpx.AsyncBaseTransport | None = None):
    """UserCredentials for ``config`` (its vault open), closed after."""
    async with httpx.AsyncClient(transport=transport, follow_redirects=False) as client:
        credentials = await UserCredentials.open(config, client, environ={})
        try:
            yield credentials
        finally:
            await credentials.aclose()


@asynccontextmanager
async def proxy_listener(config: Config, credentials: UserCredentials):
    """The proxy's HTTP listener at ``config.http.listen``, serving the OAuth callback (a hub
    with one in-memory server behind it)."""
    hub_config = structure_config(
        {"proxy": {"startup_timeout": 5.0}, "servers": {"a": {"command": "fake"}}}, environ={}
    )
    hub = Hub(hub_config, connector=FakeUpstreams({"a": []}))
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        endpoint = StreamableHttpEndpoint(hub, config.http, callback=credentials.callback)
        assert config.http.listen is not None
        await nursery.start(endpoint.serve, config.http.listen)
        yield endpoint
        nursery.cancel_scope.cancel()


async def through_connect(browser: httpx.AsyncClient, url: str) -> str:
    """Open the proxy's connect page at ``url`` in ``browser`` (no [auth]: no sign-in) and
    press its button; the authorization server's URL it sends the browser to."""
    assert url.startswith("http://127.0.0.1:") and "/oauth/connect?flow=" in url, url
    page = await browser.get(url)
    assert page.status_code == 200, page.text
    form = {name: hidden_field(page.text, name) for name in ("flow", "csrf")}
    pressed = await browser.post(url.split("?", 1)[0], data=form)
    assert pressed.status_code == 303, pressed.text
    return pressed.headers["location"]


def hidden_field(text: str, name: str) -> str:
    import html

    return html.unescape(text.split(f'name="{name}" value="', 1)[1].split('"', 1)[0])


async def consent(url: str, *, username: str = "alice", seen: list[str] | None = None) -> httpx.Response:
    """What a person does with the URL they are given, done by a program: open the proxy's
    connect page, press its button, fill the authorization server's login form, post it,
    follow the redirect to the proxy's callback; the callback's answer. ``seen`` gets the
    authorization server's URL."""
    async with httpx.AsyncClient(follow_redirects=False) as browser:
        url = await through_connect(browser, url)
        if seen is not None:
            seen.append(url)
        page = await browser.get(url)
        assert page.status_code == 200, page.text
        hidden = page.text.split('name="request" value="', 1)[1].split('"', 1)[0]
        import html

        form = {"request": html.unescape(hidden), "username": username, "password": "wonderland"}
        base = url.split("/authorize", 1)[0]
        redirect = await browser.post(f"{base}/authorize", data=form)
        assert redirect.status_code == 302, redirect.text
        return await browser.get(redirect.headers["location"])


class Upstream:
    """The proxy's Streamable HTTP connection to a server, driven line by line."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.next_id = 1

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.next_id += 1
        await self.channel.send.send_all(json.dumps(message).encode() + b"\n")
        with trio.fail_after(10):
            got = await self.channel.messages.receive()
        assert not isinstance(got.decoded, Exception), got
        return got.decoded[1]


@asynccontextmanager
async def upstream(server_config: Any, auth: httpx.Auth):
    async with trio.open_nursery() as nursery:
        channel = await nursery.start(partial(run_streamable_http_server, server_config, 1 << 20, 64, auth=auth))
        yield Upstream(channel)
        nursery.cancel_scope.cancel()


INITIALIZE = INIT["params"]

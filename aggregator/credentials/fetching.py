"""Every HTTP request the proxy makes as an OAuth client, bounded: the URL checked first
(``urls``; a host name's addresses too), no redirect followed, one deadline for the whole
exchange, and at most ``max_bytes`` of answer read. A refused URL is never handed to the
HTTP client, so nothing connects for it.

Answers are JSON objects (metadata, registration, tokens); what an endpoint said is kept
out of logs, since it may hold a token.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import trio

from aggregator.credentials.problems import CredentialError, UnsafeUrl
from aggregator.credentials.urls import address_refusal, is_loopback, url_refusal

log = logging.getLogger(__name__)
USER_AGENT = "mcp-aggregator"


class Answer:
    """An endpoint's answer: its status, its headers and its body as a JSON object (empty
    when it sent none or something else)."""

    def __init__(self, status: int, headers: httpx.Headers, body: dict[str, Any]) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Fetcher:
    """The OAuth client's HTTP: ``get_json`` and ``post_form`` (``client`` is httpx's,
    owned by the caller: tests give one whose transport fails if it is ever called)."""

    def __init__(self, client: httpx.AsyncClient, *, timeout: float, max_bytes: int, resolve: bool = True) -> None:
        self.client = client
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.resolve = resolve  # check the addresses a host name resolves to (off: tests' fake names)

    async def get_json(self, url: str, what: str) -> Answer:
        return await self.request("GET", url, what)

    async def post_form(
        self, url: str, form: Mapping[str, str], what: str, *, basic: tuple[str, str] | None = None
    ) -> Answer:
        return await self.request("POST", url, what, form=form, basic=basic)

    async def post_json(self, url: str, body: Any, what: str) -> Answer:
        return await self.request("POST", url, what, json_body=body)

    async def check(self, url: str, what: str) -> None:
        """Raise ``UnsafeUrl`` unless ``url`` may be fetched."""
        refusal = url_refusal(url)
        if refusal is not None:
            raise UnsafeUrl(f"{what}: the URL {refusal}")
        host = urlsplit(url).hostname or ""
        if not self.resolve or is_loopback(host):
            return
        try:
            ipaddress.ip_address(host)
            return  # a literal address, checked above
        except ValueError:
            pass
        try:
            found = await trio.socket.getaddrinfo(host, None, type=trio.socket.SOCK_STREAM)
        except OSError as exc:
            raise CredentialError(f"{what}: cannot resolve the host: {exc.strerror or exc}") from None
        for *_, sockaddr in found:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address.is_loopback:
                raise UnsafeUrl(f"{what}: the host name resolves to a loopback address")
            refused = address_refusal(address)
            if refused is not None:
                raise UnsafeUrl(f"{what}: the host name resolves to {refused}")

    async def request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        form: Mapping[str, str] | None = None,
        json_body: Any = None,
        basic: tuple[str, str] | None = None,
    ) -> Answer:
        await self.check(url, what)
        headers = {"accept": "application/json", "user-agent": USER_AGENT}
        content: bytes | None = None
        if json_body is not None:
            content = orjson.dumps(json_body)
            headers["content-type"] = "application/json"
        auth = httpx.BasicAuth(*basic) if basic is not None else None
        with trio.move_on_after(self.timeout) as deadline:
            try:
                async with self.client.stream(
                    method, url, headers=headers, data=form, content=content, auth=auth
                ) as response:
                    body = await self._read(response, what)
                    status, response_headers = response.status_code, response.headers
            except httpx.HTTPError as exc:
                raise CredentialError(f"{what}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if deadline.cancelled_caught:
            raise CredentialError(f"{what}: no whole answer within {self.timeout:g}s")
        log.debug("oauth: %s %s: HTTP %d", method, what, status)
        if 300 <= status < 400:
            raise CredentialError(f"{what}: answered with a redirect (HTTP {status}), which is not followed")
        try:
            parsed = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            parsed = {}
            if 200 <= status < 300:
                raise CredentialError(f"{what}: the answer is not JSON") from None
        if not isinstance(parsed, dict):
            raise CredentialError(f"{what}: the answer is not a JSON object")
        return Answer(status, response_headers, parsed)

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise CredentialError(f"{what}: the answer is larger than {self.max_bytes} bytes")
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise CredentialError(f"{what}: the answer is larger than {self.max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def oauth_http_client() -> httpx.AsyncClient:
    """An httpx client for ``Fetcher``: no redirects, no cookies kept, the environment's
    proxies as usual; ``Fetcher`` times each exchange as a whole."""
    return httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(30.0), trust_env=True)

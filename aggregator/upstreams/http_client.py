"""The upstream HTTP client: plain-HTTP POSTs on kept-alive connections, everything else by httpx.

``UpstreamClient`` has the part of ``httpx.AsyncClient``'s interface the upstream
transports use (``stream``, ``delete``, ``aclose``). A POST to an ``http://`` URL, with no
proxy in the environment, goes out on a connection of its own pool: the request written in
one send, the response parsed by httptools (llhttp) as it arrives. That costs a fraction of
what httpx does on trio (through anyio, with its request and response models); measured in
``tests.bench.http_bench``. Everything else (TLS, proxies, GET event streams, DELETE) is
httpx's, which does it well. Failures raise httpx's own exceptions, so the callers see one
kind of error whichever path a request took.

A connection goes back to the pool only once its response was read to the end, and only
if both sides keep it alive. Before one is reused it is checked for anything the server
sent meanwhile (its close, most often): such a connection is dropped unused. A request is
never sent twice: one that fails after it was sent fails, with the reason.
"""

from __future__ import annotations

import logging
import os
import select
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httptools
import httpx
import trio

from aggregator.transports.outbox import read_when_ready, write_now
from aggregator.upstreams.network_link import CONNECT_TIMEOUT, USER_AGENT

log = logging.getLogger(__name__)
MAX_IDLE = 16  # connections kept between requests, per upstream
IDLE_FOR = 2.0  # seconds an idle connection is kept
MAX_HEAD = 64 * 1024  # bytes of a response's status line and headers
_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


class BadResponse(httpx.RemoteProtocolError):
    """A response that fails its request only (malformed, too large a head, a 101): the
    server may answer the next one well."""


def _plain(text: str) -> bool:
    return text.isascii() and "\r" not in text and "\n" not in text


class FastResponse:
    """What came back on a POST: status, headers, then the body as it arrives."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status_code = 0
        self.headers: dict[str, str] = {}

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while True:
            if connection.body:
                chunk = b"".join(connection.body)
                connection.body.clear()
                yield chunk
            if connection.complete:
                return
            await connection.receive()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])


class _Connection:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.socket = stream.socket
        self.fd = stream.socket.fileno()
        self.poll = select.poll()  # to see whether the server sent anything while it was idle
        self.poll.register(self.fd, select.POLLIN)
        self.parser = httptools.HttpResponseParser(self)
        self.response: FastResponse | None = None
        self.body: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.headers_done = False
        self.interim = False  # the response being parsed is a 1xx: skipped
        self.idle_since = 0.0  # when it last went back to the pool
        self.head_bytes = 0

    def begin(self, response: FastResponse) -> None:
        self.response = response
        self.body = []
        self.complete = self.headers_done = self.interim = False
        self.head_bytes = 0  # of the response's head, read so far

    def idle_and_open(self) -> bool:
        """Whether the server sent nothing (no close either) since the last answer."""
        try:
            return not self.poll.poll(0)
        except (OSError, ValueError):
            return False

    async def send(self, data: bytes) -> None:
        """Write ``data``: straight to the socket while it takes it, then by waiting."""
        try:
            sent = write_now(self.fd, data)
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        if sent < len(data):
            with memoryview(data) as view:
                await self.stream.send_all(view[sent:])

    async def receive(self) -> None:
        try:
            data = await read_when_ready(self.socket, self.fd)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise httpx.ReadError(f"the connection broke: {exc}") from exc
        if not data:
            if self.headers_done and self._ends_at_close():  # (HTTP/1.0 style: the body ends at the close)
                self.complete, self.keep_alive = True, False
                return
            raise httpx.RemoteProtocolError("the server closed the connection before its answer ended")
        if not self.headers_done:
            if self.head_bytes > MAX_HEAD:
                raise BadResponse(f"the response's headers are larger than {MAX_HEAD} bytes")
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:  # a 101: no protocol was asked to switch to
            raise BadResponse("the server switched protocols (HTTP 101) on a POST") from exc
        except httptools.HttpParserError as exc:
            raise BadResponse(f"malformed HTTP response: {exc}") from exc

    def _ends_at_close(self) -> bool:
        headers = self.response.headers if self.response is not None else {}
        return "content-length" not in headers and "transfer-encoding" not in headers

    def reusable(self) -> bool:
        return self.complete and self.keep_alive

    # llhttp's callbacks. Whatever follows a whole response on the connection is not read
    # into it: the connection is not used again.
    def on_message_begin(self) -> None:
        if self.complete:
            self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.headers_done and self.response is not None:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers = self.response.headers
            headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): skipped
            self.interim = True
            if self.response is not None:
                self.response.headers.clear()
            return
        self.headers_done = True
        if self.response is not None:
            self.response.status_code = status

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self.interim:
            self.interim = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # (llhttp forgets it once the message is over)


class UpstreamClient:
    """``httpx.AsyncClient`` for everything, with plain-HTTP POSTs on a pool of our own."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: Mapping[str, str], connect_timeout: float) -> None:
        self.httpx = client
        parts = urllib.parse.urlsplit(url)
        proxied = any(os.environ.get(name) for name in _PROXY_VARIABLES)
        plain = all(_plain(name) and _plain(value) for name, value in headers.items())
        # Credentials in the URL (Basic auth), a proxy, TLS, or configured headers that
        # cannot be sent as they are (httpx refuses them, and says so): httpx's path.
        self.fast = (
            parts.scheme == "http" and bool(parts.hostname) and not proxied and plain and "@" not in parts.netloc
        )
        self._host = parts.hostname or ""
        self._port = parts.port or 80
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = parts.netloc.rpartition("@")[2]
        self._base = f"host: {authority}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._url = url
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    @classmethod
    def for_server(cls, client: httpx.AsyncClient, config: Any, *, per_user: bool = False) -> UpstreamClient:
        """The client for a configured server (its URL and headers), around httpx's;
        ``per_user``: every request goes through httpx, which adds the user's credential."""
        upstream = cls(client, config.url, {"user-agent": USER_AGENT, **dict(config.headers)}, CONNECT_TIMEOUT)
        upstream.fast = upstream.fast and not per_user
        return upstream

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, *, content: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Any]:
        if method != "POST" or not self.fast or url != self._url:
            async with self.httpx.stream(method, url, content=content, headers=headers) as theirs:
                yield theirs
            return
        head = self._head(content, headers or {})
        connection, response = await self._send(head, content)
        if log.isEnabledFor(logging.INFO):  # as httpx does (the proxy shows it at debug only)
            log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, response.status_code)
        try:
            yield response
        finally:
            if connection.reusable() and len(self._idle) < MAX_IDLE:
                connection.idle_since = trio.current_time()
                self._idle.append(connection)
            else:
                await trio.aclose_forcefully(connection.stream)

    async def tidy(self) -> None:
        """Close the connections left idle for ``IDLE_FOR`` seconds (a burst over, its
        connections go), checking every second; run it beside the requests."""
        while True:
            await trio.sleep(1.0)
            old = trio.current_time() - IDLE_FOR
            while self._idle and self._idle[0].idle_since < old:  # the oldest first
                await trio.aclose_forcefully(self._idle.pop(0).stream)

    async def delete(self, url: str, *, headers: Mapping[str, str] | None = None) -> Any:
        return await self.httpx.delete(url, headers=headers)

    async def __aenter__(self) -> UpstreamClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the kept-alive connections (httpx's client is closed by its owner)."""
        for connection in self._idle:
            await trio.aclose_forcefully(connection.stream)
        self._idle.clear()

    def _head(self, content: bytes, headers: Mapping[str, str]) -> bytes:
        lines = [f"POST {self._target} HTTP/1.1\r\n", self._base]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise httpx.LocalProtocolError(f"the {name[:40]} header holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append(f"content-length: {len(content)}\r\n\r\n")
        try:
            return "".join(lines).encode("ascii")
        except UnicodeEncodeError as exc:
            raise httpx.LocalProtocolError(f"a header is not ASCII: {exc}") from exc

    async def _send(self, head: bytes, content: bytes) -> tuple[_Connection, FastResponse]:
        """Send the request and read up to the end of the response's headers."""
        connection = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.idle_and_open():
                connection = candidate
                break
            await trio.aclose_forcefully(candidate.stream)  # closed by the server while idle
        if connection is None:
            connection = await self._connect()
        response = FastResponse(connection)
        connection.begin(response)
        try:
            if len(content) < 65536:
                await connection.send(head + content)
            else:  # not copied into one buffer
                await connection.send(head)
                await connection.send(content)
            while not connection.headers_done:
                await connection.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await trio.aclose_forcefully(connection.stream)
            raise httpx.WriteError(f"the connection broke: {exc}") from exc
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        return connection, response

    async def _connect(self) -> _Connection:
        try:
            with trio.fail_after(self._connect_timeout):
                stream = await trio.open_tcp_stream(self._host, self._port)
        except trio.TooSlowError as exc:
            raise httpx.ConnectTimeout(f"no connection within {self._connect_timeout:g}s") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(stream)

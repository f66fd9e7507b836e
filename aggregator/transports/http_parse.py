"""Reading HTTP/1.1 requests: llhttp (through httptools) parses, this module keeps the limits.

``RequestReader.feed(data)`` parses whatever arrived in one pass and queues each complete
request (pipelined ones too) in ``ready``; a request that cannot be served queues a
``Refusal`` instead (the status to answer with and why), after which the connection reads
nothing more. llhttp is strict by default (no lenient flags are set): conflicting
``Content-Length`` and ``Transfer-Encoding``, a repeated ``Content-Length``, an obs-fold,
bare CR or LF, a NUL or a space before the colon are all refused, so a request cannot be
framed two ways (request smuggling). On top of it: only HTTP/1.0 and 1.1; a 1.1 request
must name its Host; the one transfer coding understood is chunked (anything else: 501, as
RFC 9112 6.1 asks); headers that may appear once and arrive twice are refused rather than
joined into a value nobody sent; the head is at most ``max_header`` bytes (431), counted
while it arrives, and the body at most ``max_body`` (413), refused from its declared length
before a byte of it is read.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import httptools

# Headers whose repetition has no agreed meaning: two Hosts (RFC 9112 3.2), two session
# ids, two event ids. Any other repeated header is joined with ", " (RFC 9110 5.3).
SINGLE_VALUED = frozenset(
    {
        "host",
        "content-type",
        "authorization",
        "origin",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    }
)
_VERSIONS = frozenset({"1.1", "1.0"})


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "
    body: bytes
    keep_alive: bool = True  # whether the client lets the connection serve another request
    head_only: bool = False  # a HEAD: its response has no body
    version11: bool = True  # HTTP/1.1 (chunked bodies can be sent), else 1.0


class Refusal(NamedTuple):
    status: int
    reason: str


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: a limit was crossed."""


class RequestReader:
    """Feed it bytes; it queues complete requests and refusals in ``ready``."""

    def __init__(self, max_body: int, max_header: int) -> None:
        self.max_body = max_body
        self.max_header = max_header
        self.ready: deque[Request | Refusal] = deque()
        self.done = False  # nothing more is read (a refusal, an upgrade, or the end)
        self.expects_continue = False  # the request read now waits for 100 Continue
        self._parser = httptools.HttpRequestParser(self)
        self._in_message = False  # a request has begun and is not complete
        self._in_head = False  # ... and its head is not complete
        self._fed = 0  # bytes fed since the request being read began (see _count)
        self._began = False  # a request began in the feed being parsed
        self._ended = False  # ... and one ended in it
        self._after_chunk_size = False  # a chunk's size was read, not yet its data
        self._trailer = 0  # bytes fed since (the trailers, after the last chunk)
        self._trailer_reset = False  # chunk data came in the feed being parsed
        self._refusal: Refusal | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_size = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._upgrade: tuple[Request, int] | None = None  # an Upgrade request whose body is read

    @property
    def in_message(self) -> bool:
        """Whether a request has begun to arrive and is not complete."""
        return self._in_message

    @property
    def refused(self) -> bool:
        """Whether a request was refused (its client may still be sending it)."""
        return self._refusal is not None

    @property
    def head_complete(self) -> bool:
        return (self._in_message and not self._in_head) or self._upgrade is not None

    @property
    def finished(self) -> bool:
        """Whether nothing more will come of this connection's input."""
        return self.done and self._upgrade is None

    def feed(self, data: bytes | bytearray) -> None:
        if self.done:
            if self._upgrade is not None:
                self._upgrade_body(data)
            return
        was_after = self._after_chunk_size
        self._began = self._ended = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data, exc.args[0] if exc.args else len(data))
            return
        except _Stop:
            pass
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                raise
        except httptools.HttpParserError as exc:
            self._refuse(*_refusal_for(str(exc)))
        if self._refusal is None and self._in_message:
            # Trailing: a whole feed came after a chunk's size and none of its data (the
            # trailers after the last chunk, which the parser holds until each line ends).
            self._count(len(data), was_after and self._after_chunk_size and not self._trailer_reset)
        self._trailer_reset = False
        if self._refusal is not None:
            self.ready.append(self._refusal)
            self.done = True

    def _count(self, size: int, trailing: bool) -> None:
        """Bound what a request still arriving has taken, parsed or held by the parser (a
        header line is held whole before it is seen): its head at most ``max_header``
        bytes, its trailers too, and the whole of it (chunk sizes included) at most twice
        ``max_body`` plus ``max_header``. A feed in which a request ended and this one began
        is not counted (part of it was the one before): the bound is loose by one read then,
        never too tight."""
        if not self._began:
            self._fed += size
        else:
            self._fed = 0 if self._ended else size
        if self._in_head and self._fed > self.max_header:
            self._refuse(431, "request headers too large")
        elif trailing:
            self._trailer += size
            if self._trailer > self.max_header:
                self._refuse(431, "request trailers too large")
        elif self._fed > 2 * self.max_body + self.max_header:
            self._refuse(413, f"request larger than {self.max_body} bytes of body allow")

    def _upgraded(self, data: bytes | bytearray, offset: int) -> None:
        """An Upgrade (or CONNECT) request: llhttp stops at its head. It is answered as an
        ordinary request (we switch no protocol; a client asking for h2c gets HTTP/1.1), so
        its body, if it declared a length, is read here; then the connection closes."""
        self.done = True
        last = self.ready[-1] if self.ready else None
        if not isinstance(last, Request):
            return
        self.ready.pop()
        request = last._replace(keep_alive=False)
        if request.method == "CONNECT" or "transfer-encoding" in request.headers:
            if "transfer-encoding" in request.headers:
                self.ready.append(Refusal(400, "an Upgrade request with a chunked body is not served"))
            else:
                self.ready.append(request)
            return
        self._upgrade = (request, int(request.headers.get("content-length") or 0))
        self._upgrade_body(bytes(data[offset:]))

    def _upgrade_body(self, data: bytes | bytearray) -> None:
        request, length = self._upgrade  # type: ignore[misc]
        self._body.append(bytes(data[: length - self._body_size]))
        self._body_size = min(length, self._body_size + len(data))
        if self._body_size >= length:
            self._upgrade = None
            self.ready.append(request._replace(body=b"".join(self._body)))
            self._body = []

    def end(self) -> None:
        """The client closed its side: a request it had begun is not coming."""
        self.done = True
        self._upgrade = None

    def _refuse(self, status: int, reason: str) -> None:
        if self._refusal is None:
            self._refusal = Refusal(status, reason)

    # --- llhttp's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._url = b""
        self._headers = {}
        self._head_size = 0
        self._body = []
        self._body_size = 0
        self._began = True
        self._after_chunk_size = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > self.max_header:
            self._refuse(431, "request headers too large")
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer of a chunked body: not read
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.max_header:
            self._refuse(431, "request headers too large")
            raise _Stop
        key = name.decode("ascii").lower()  # llhttp admits only token characters in names
        text = value.decode("latin-1").strip(" \t")
        headers = self._headers
        if key in headers:
            if key in SINGLE_VALUED:
                self._refuse(400, f"the {key} header may appear only once")
                raise _Stop
            text = f"{headers[key]}, {text}"
        headers[key] = text

    def on_headers_complete(self) -> None:
        self._in_head = False
        headers = self._headers
        version = self._parser.get_http_version()
        if version not in _VERSIONS:
            self._refuse(400, f"malformed HTTP request: HTTP/{version} is not served; use HTTP/1.1")
            raise _Stop
        if version == "1.1" and "host" not in headers:
            self._refuse(400, "malformed HTTP request: an HTTP/1.1 request must have a Host header")
            raise _Stop
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":
            self._refuse(501, "unsupported Transfer-Encoding: only one, chunked, is understood")
            raise _Stop
        length = headers.get("content-length")
        if length is not None and int(length) > self.max_body:  # llhttp checked its digits (and their size)
            self._refuse(413, f"request body larger than {self.max_body} bytes")
            raise _Stop
        self.expects_continue = version == "1.1" and headers.get("expect", "").lower() == "100-continue"

    def on_chunk_header(self) -> None:
        self._after_chunk_size = True

    def on_chunk_complete(self) -> None:
        self._after_chunk_size = False
        self._trailer, self._trailer_reset = 0, True

    def on_body(self, body: bytes) -> None:
        self._after_chunk_size = False
        self._trailer, self._trailer_reset = 0, True
        self._body_size += len(body)
        if self._body_size > self.max_body:
            self._refuse(413, f"request body larger than {self.max_body} bytes")
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._ended = True
        self.expects_continue = False
        parser = self._parser
        method = parser.get_method().decode("ascii")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.ready.append(
            Request(
                method,
                self._url.decode("ascii", "replace"),
                self._headers,
                body,
                parser.should_keep_alive(),
                method == "HEAD",
                parser.get_http_version() == "1.1",
            )
        )
        self._body = []


def _refusal_for(message: str) -> tuple[int, str]:
    """The status and reason for what llhttp refused (its message says what was wrong)."""
    if "Transfer-Encoding" in message and "Content-Length" not in message:
        return 501, f"unsupported Transfer-Encoding: only one, chunked, is understood ({message})"
    return 400, f"malformed HTTP request: {message}"

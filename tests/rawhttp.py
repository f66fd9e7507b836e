"""Raw HTTP/1.1 and WebSocket on the wire, for tests that send what no client library would.

Sans-IO readers (feed bytes, take a parsed response or frame) that are strict about what
the server sends back: a status line, well-formed headers, a body framed by
Content-Length, chunks or the connection's end. Anything else raises ``Malformed``, so a
test that uses them also checks that every answer is well-formed HTTP. Small blocking and
trio helpers drive them over a socket with a deadline.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import struct
import time
from typing import NamedTuple

STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9])(?: [\x20-\x7e\x80-\xff]*)?")
HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class Malformed(AssertionError):
    """The server sent something that is not a well-formed HTTP response or frame."""


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes
    streaming: bool  # an event stream: ``body`` is what had arrived when the headers did


class ResponseReader:
    """Feed bytes; ``next()`` returns one complete response, or None if more are needed."""

    def __init__(self, head: bool = False) -> None:
        self.buffer = b""
        self.eof = False
        self.head = head  # the request was HEAD: the response has no body

    def feed(self, data: bytes) -> None:
        if data:
            self.buffer += data
        else:
            self.eof = True

    def next(self) -> Response | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end == -1:
            if self.eof:
                raise Malformed(f"the connection ended inside a response's headers: {self.buffer[:200]!r}")
            return None
        lines = self.buffer[:end].split(b"\r\n")
        match = STATUS_LINE.fullmatch(lines[0])
        if match is None:
            raise Malformed(f"not a status line: {lines[0][:200]!r}")
        status = int(match[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or HEADER_NAME.fullmatch(name) is None:
                raise Malformed(f"not a header line: {line[:200]!r}")
            headers[name.decode("ascii").lower()] = value.strip().decode("latin-1")
        rest = self.buffer[end + 4 :]
        if headers.get("content-type", "").startswith("text/event-stream") or status == 101:
            self.buffer = b""
            return Response(status, headers, rest, True)
        if self.head or status in (204, 304) or status < 200:
            self.buffer = rest
            return Response(status, headers, b"", False)
        if "content-length" in headers:
            if not headers["content-length"].isdigit():
                raise Malformed(f"bad Content-Length {headers['content-length']!r}")
            length = int(headers["content-length"])
            if len(rest) < length:
                if self.eof:
                    raise Malformed("the connection ended inside a body")
                return None
            self.buffer = rest[length:]
            return Response(status, headers, rest[:length], False)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, remaining = _dechunk(rest, self.eof)
            if body is None:
                return None
            self.buffer = remaining
            return Response(status, headers, body, False)
        if not self.eof:
            return None
        self.buffer = b""
        return Response(status, headers, rest, False)


def _dechunk(data: bytes, eof: bool) -> tuple[bytes | None, bytes]:
    body = b""
    position = 0
    while True:
        line_end = data.find(b"\r\n", position)
        if line_end == -1:
            break
        size_text = data[position:line_end].split(b";", 1)[0].strip()
        if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_text):
            raise Malformed(f"bad chunk size {size_text[:50]!r}")
        size = int(size_text, 16)
        if size == 0:
            trailer_end = data.find(b"\r\n", line_end + 2)
            if trailer_end == -1:
                break
            return body, data[trailer_end + 2 :]
        if len(data) < line_end + 2 + size + 2:
            break
        body += data[line_end + 2 : line_end + 2 + size]
        position = line_end + 2 + size + 2
    if eof:
        raise Malformed("the connection ended inside a chunked body")
    return None, data


def exchange(port: int, data: bytes, *, timeout: float = 5.0, head: bool = False) -> Response:
    """Send raw bytes on a new connection and read one response (blocking, bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_response(sock, timeout=timeout, head=head)


def read_response(sock: socket.socket, *, timeout: float = 5.0, head: bool = False) -> Response:
    reader = ResponseReader(head=head)
    deadline = time.monotonic() + timeout
    while True:
        response = reader.next()
        if response is not None:
            return response
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no complete response within {timeout}s; had {reader.buffer[:300]!r}")
        sock.settimeout(left)
        try:
            reader.feed(sock.recv(65536))
        except ConnectionResetError:
            reader.feed(b"")


async def read_response_async(stream, reader: ResponseReader | None = None) -> Response:
    """One response from a trio stream (the caller bounds the time)."""
    reader = reader or ResponseReader()
    while True:
        response = reader.next()
        if response is not None:
            return response
        reader.feed(await stream.receive_some(65536))


def request_bytes(method: str, path: str, headers: list[tuple[str, str]] | dict[str, str], body: bytes = b"") -> bytes:
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    if body or method == "POST":
        items.append(("content-length", str(len(body))))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in items) + "\r\n"
    return head.encode("latin-1") + body


# --- WebSocket ------------------------------------------------------------------------------


def websocket_handshake(port: int, path: str = "/mcp", extra: bytes = b"") -> bytes:
    key = base64.b64encode(os.urandom(16))
    return (
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Version: 13\r\n"
        ).encode()
        + b"Sec-WebSocket-Key: "
        + key
        + b"\r\n"
        + extra
        + b"\r\n"
    )


def frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A client frame (masked, as clients must send)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    length = len(payload)
    if length < 126:
        head += bytes([0x80 | length])
    elif length < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", length)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", length)
    mask = os.urandom(4)
    if not length:
        return head + mask
    keys = (mask * (length // 4 + 1))[:length]
    return head + mask + (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(length, "big")


class FrameReader:
    """Server frames (unmasked) from fed bytes: (opcode, payload) or None."""

    def __init__(self, data: bytes = b"") -> None:
        self.buffer = data

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def next(self) -> tuple[int, bytes] | None:
        if len(self.buffer) < 2:
            return None
        first, second = self.buffer[0], self.buffer[1]
        if second & 0x80:
            raise Malformed("a server frame is masked")
        length, offset = second & 0x7F, 2
        if length == 126:
            if len(self.buffer) < 4:
                return None
            length, offset = struct.unpack("!H", self.buffer[2:4])[0], 4
        elif length == 127:
            if len(self.buffer) < 10:
                return None
            length, offset = struct.unpack("!Q", self.buffer[2:10])[0], 10
        if len(self.buffer) < offset + length:
            return None
        payload = self.buffer[offset : offset + length]
        self.buffer = self.buffer[offset + length :]
        return first & 0x0F, payload

"""Newline-delimited framing for stdio (MCP: one message per line, UTF-8). Sans-IO.

Split on b"\\n" only: U+2028, U+0085 and a lone "\\r" are legal inside JSON strings and
must never end a message (``str.splitlines`` would split on them). A trailing "\\r" is
JSON whitespace and harmless. A line longer than ``max_line`` is never held in memory
whole: the splitter reports an ``OversizedLine`` with its first and last bytes (enough to
find the request id, which SDKs write first or last) and discards the rest up to the next
newline.
"""

from __future__ import annotations

from typing import NamedTuple

_HEAD = 64 * 1024  # what ``salvage_envelope`` scans at most
_TAIL = 1024


class OversizedLine(NamedTuple):
    head: bytes
    size: int
    tail: bytes = b""  # its last bytes: where SDKs that write the id last put it


class LineSplitter:
    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._partial = bytearray()
        self._discarding: OversizedLine | None = None

    def feed(self, data: bytes | bytearray) -> list[bytes | OversizedLine]:
        """Take bytes, return the complete non-blank lines (without b"\\n") in order."""
        if type(data) is not bytes:  # a stream may hand out a bytearray: lines are bytes
            data = bytes(data)
        out: list[bytes | OversizedLine] = []
        pieces = data.split(b"\n")
        last = pieces.pop()  # bytes after the final newline: the start of a partial line
        for piece in pieces:
            if self._discarding is not None:
                head, size, tail = self._discarding
                out.append(OversizedLine(head, size + len(piece), (tail + piece)[-_TAIL:]))
                self._discarding = None
                continue
            if self._partial:
                self._partial += piece
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = piece
            if len(line) > self.max_line:
                out.append(OversizedLine(line[:_HEAD], len(line), line[-_TAIL:]))
            elif line.strip():
                out.append(line)
        if last:
            if self._discarding is not None:
                head, size, tail = self._discarding
                self._discarding = OversizedLine(head, size + len(last), (tail + last)[-_TAIL:])
            else:
                self._partial += last
                if len(self._partial) > self.max_line:
                    partial = self._partial
                    self._discarding = OversizedLine(bytes(partial[:_HEAD]), len(partial), bytes(partial[-_TAIL:]))
                    self._partial.clear()
        return out

    @property
    def pending(self) -> int:
        """Bytes held for an unfinished line."""
        return len(self._partial)

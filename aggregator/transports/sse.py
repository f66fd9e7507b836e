"""Server-Sent Events parsing (the client side), sans-IO.

Feed bytes, get events. Follows the WHATWG rules a client needs: lines end in LF, CRLF or
CR; ``data`` lines accumulate (joined by LF); ``event``, ``id`` and ``retry`` set fields;
a line starting with ":" is a comment; an empty line dispatches the event (nothing is
dispatched when no data arrived). An event larger than ``max_event`` is dropped and
reported, never held whole.
"""

from __future__ import annotations

from typing import NamedTuple


class SseEvent(NamedTuple):
    event: str
    data: str
    id: str | None


class SseParser:
    def __init__(self, max_event: int = 16 * 1024 * 1024) -> None:
        self.max_event = max_event
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self.dropped = 0
        self._buffer = b""
        self._data: list[str] = []
        self._size = 0
        self._event = ""
        self._id: str | None = None

    def feed(self, data: bytes) -> list[SseEvent]:
        self._buffer += data
        events: list[SseEvent] = []
        while True:
            buffer = self._buffer
            lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
            end = lf if cr == -1 else cr if lf == -1 else min(lf, cr)
            if end == -1:
                if len(buffer) > self.max_event:
                    self._buffer = b""
                    self._reset(dropped=True)
                return events
            if end == cr and end + 1 == len(buffer):
                return events  # a CR at the very end may be half of a CRLF: wait for more
            skip = 2 if buffer[end:end + 2] == b"\r\n" else 1
            line = buffer[:end]
            self._buffer = buffer[end + skip:]
            event = self._line(line.decode("utf-8", "replace"))
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            self._reset()
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._size += len(value)
            if self._size > self.max_event:
                self._reset(dropped=True)
            else:
                self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
            self.last_event_id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value)
        return None

    def _reset(self, dropped: bool = False) -> None:
        if dropped:
            self.dropped += 1
        self._data = []
        self._size = 0
        self._event = ""
        self._id = None

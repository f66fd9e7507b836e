"""Server-Sent Events parsing (the client side), sans-IO.

Feed bytes, get events. Follows the WHATWG rules a client needs: lines end in LF, CRLF or
CR; ``data`` lines accumulate (joined by LF); ``event``, ``id`` and ``retry`` set fields;
a line starting with ":" is a comment; an empty line dispatches the event (nothing is
dispatched when no data arrived). An event larger than ``max_event`` is dropped and
reported, never held whole.

What a client needs to resume a stream (MCP "Resumability and Redelivery") outlives each
event: ``last_event_id`` is the id of the last event the stream completed, taken when the
event's empty line arrives (so an event cut off mid-way is asked for again), also from an
event with no data (a 2025-11-25 server's "priming" event: an id and empty data, which is
dispatched with ``data == ""`` and carries no message); an ``id`` field with an empty value
clears it. ``retry`` is the reconnection delay in milliseconds the server asked for (ASCII
digits only, else ignored). ``restart()`` starts reading a new connection of the same stream.
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
        self._skipping = False  # the event under way was dropped: ignore its data up to its end
        self._line_cut = False  # the line under way was dropped: ignore the rest of it

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
                    self._line_cut = True
                    self._drop()
                return events
            if end == cr and end + 1 == len(buffer):
                return events  # a CR at the very end may be half of a CRLF: wait for more
            skip = 2 if buffer[end : end + 2] == b"\r\n" else 1
            line = buffer[:end]
            self._buffer = buffer[end + skip :]
            if self._line_cut:
                self._line_cut = False
                continue
            event = self._line(line.decode("utf-8", "replace"))
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            event = None
            if self._data:
                event = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            if self._id is not None:
                self.last_event_id = self._id or None
            self._reset()
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            if self._skipping:
                return None
            self._size += len(value)
            if self._size > self.max_event:
                self._drop()
            else:
                self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value) if len(value) <= 12 else 10**12  # int() refuses thousands of digits
        return None

    def restart(self) -> None:
        """Read a new connection of the same stream: forget any partial event and bytes,
        keep ``last_event_id`` and ``retry``."""
        self._buffer = b""
        self._line_cut = False
        self._reset()

    def _drop(self) -> None:
        """The event under way is too large: count it, free its data, skip the rest of it."""
        if not self._skipping:
            self.dropped += 1
        self._skipping = True
        self._data = []
        self._size = 0

    def _reset(self) -> None:
        self._data = []
        self._size = 0
        self._event = ""
        self._id = None
        self._skipping = False

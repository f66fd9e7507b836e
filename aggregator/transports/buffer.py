"""Compact storage for messages waiting to be written, and for those kept after. Sans-IO.

Why not a list of ``bytes``: every small ``orjson.dumps`` result pins an allocation of
about 4 KB, whatever its length (measured: 100,000 log notifications of 118 bytes held as
``dumps`` results took 393 MB of RSS; the same bytes appended to one ``bytearray``, 11 MB).
A queue that holds messages for a client that reads slowly, or history kept for a client
that may resume, must cost what its bytes cost, so it copies each message into one
``bytearray`` (a C-level copy of a few hundred bytes) and lets the original go.

``MessageLog`` numbers messages from 1 in the order they arrive. Messages up to ``sent``
have been taken for writing and are kept only as history, up to ``keep`` bytes (the
oldest are dropped first; with ``keep > 0`` the last one taken is always kept, so a final
answer can be replayed whatever its size). Messages after ``sent`` are waiting. Deleting
from the front of a ``bytearray`` is cheap in CPython (it moves the start), so trimming
history or taking the oldest waiting message never copies what stays.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable


class MessageLog:
    __slots__ = ("_data", "_ends", "_head", "_base", "first", "last", "sent", "keep")

    def __init__(self, keep: int = 0) -> None:
        self._data = bytearray()
        # Where each stored message ends, as an offset in the stream of every byte ever
        # appended; _ends[_head] belongs to message ``first``. _base is the offset of _data[0].
        self._ends = array("q")
        self._head = 0
        self._base = 0
        self.first = 1  # the oldest message still stored
        self.last = 0  # the newest message (0: none yet)
        self.sent = 0  # every message up to this one has been taken
        self.keep = keep

    def append(self, message: bytes) -> None:
        self._data += message
        self._ends.append(self._base + len(self._data))
        self.last += 1

    @property
    def waiting(self) -> int:
        """How many messages are waiting to be taken."""
        return self.last - self.sent

    @property
    def waiting_bytes(self) -> int:
        return self._end_of(self.last) - self._end_of(self.sent)

    @property
    def retained_bytes(self) -> int:
        """What the stored messages (waiting and history) cost."""
        return len(self._data)

    def _end_of(self, number: int) -> int:
        if number < self.first:
            return self._base
        return self._ends[self._head + number - self.first]

    def _slice(self, start: int, end: int) -> bytes:
        with memoryview(self._data) as view:
            return bytes(view[start - self._base : end - self._base])

    def take(self) -> bytes:
        """The oldest waiting message (there must be one)."""
        number = self.sent + 1
        data = self._slice(self._end_of(number - 1), self._end_of(number))
        self.sent = number
        self._trim()
        return data

    def take_all(self) -> list[bytes]:
        """Every waiting message, oldest first."""
        out = self._waiting_copies()
        self.sent = self.last
        self._trim()
        return out

    def take_all_framed(self, prefix: Callable[[int, int], bytes], suffix: bytes = b"") -> tuple[bytearray, int]:
        """Every waiting message, each between ``prefix(number, length)`` and ``suffix``, in
        one buffer built with one copy of each; and how many bytes the messages had."""
        out = bytearray()
        base = self._base
        start = first = self._end_of(self.sent)
        number = self.sent + 1
        ends = self._ends
        with memoryview(self._data) as view:
            for index in range(self._head + self.sent + 1 - self.first, self._head + self.last + 1 - self.first):
                end = ends[index]
                out += prefix(number, end - start)
                out += view[start - base : end - base]
                out += suffix
                start = end
                number += 1
        self.sent = self.last
        self._trim()
        return out, start - first

    def remove_waiting(self) -> list[bytes]:
        """Take the waiting messages out as if they had never come (not into history)."""
        out = self._waiting_copies()
        del self._data[self._end_of(self.sent) - self._base :]
        del self._ends[self._head + self.sent + 1 - self.first :]
        self.last = self.sent
        return out

    def _waiting_copies(self) -> list[bytes]:
        out = []
        base = self._base
        start = self._end_of(self.sent)
        with memoryview(self._data) as view:
            for index in range(self._head + self.sent + 1 - self.first, self._head + self.last + 1 - self.first):
                end = self._ends[index]
                out.append(bytes(view[start - base : end - base]))
                start = end
        return out

    def history(self, after: int) -> list[tuple[int, bytes]]:
        """The messages already taken, numbered, from the one after ``after`` on."""
        return [
            (number, self._slice(self._end_of(number - 1), self._end_of(number)))
            for number in range(max(after + 1, self.first), self.sent + 1)
        ]

    def drop_oldest(self, limit: int) -> int:
        """Forget the oldest messages, waiting or not, until at most ``limit`` bytes are
        stored (a ring buffer); return how many were dropped."""
        dropped = 0
        while self.first <= self.last and len(self._data) > limit:
            self._forget_first()
            dropped += 1
        if self.sent < self.first - 1:
            self.sent = self.first - 1
        return dropped

    def _trim(self) -> None:
        keep = self.keep
        while self.first <= self.sent and self._end_of(self.sent) - self._base > keep:
            if keep and self.first == self.sent:
                break
            self._forget_first()

    def _forget_first(self) -> None:
        end = self._ends[self._head]
        del self._data[: end - self._base]
        self._base = end
        self._head += 1
        self.first += 1
        if self._head > 1024 and self._head * 2 > len(self._ends):
            del self._ends[: self._head]
            self._head = 0

    def clear(self) -> None:
        """Forget everything stored; numbering goes on."""
        self._data = bytearray()
        self._ends = array("q")
        self._head = 0
        self._base = 0
        self.first = self.last + 1
        self.sent = self.last

"""The rules of a request's event stream on a Streamable HTTP upstream (MCP 2025-11-25
"Resumability and Redelivery"): how long to wait before resuming it, when to give up, and
which message on it is the request's answer, and stopping the reading of a request's stream
when it is cancelled or answered elsewhere."""

from __future__ import annotations

from typing import Any

import trio

from aggregator.jsonrpc.codec import loads
from aggregator.mcp.constants import CANCELLED

# Resuming a request's event stream (MCP 2025-11-25 "Resumability and Redelivery"): wait
# the server's ``retry`` (this when it gave none), never less than the floor (no busy
# retry) nor more than the cap (a server's absurd value); give up after this many
# resumptions in a row that brought nothing (no new event, ended within a second).
RESUME_DELAY = 1.0
RESUME_DELAY_FLOOR = 0.1
RESUME_DELAY_CAP = 30.0
MAX_EMPTY_RESUMES = 5
UNRESUMABLE = "the server closed the response stream before answering and gave no event id to resume from"


def retry_delay(retry_ms: int | None) -> float:
    """Seconds to wait before reconnecting an event stream, from its ``retry`` field."""
    if retry_ms is None:
        return RESUME_DELAY
    return min(max(retry_ms / 1000, RESUME_DELAY_FLOOR), RESUME_DELAY_CAP)


def is_answer(data: str) -> bool:
    """Whether a message on a request's event stream is its answer rather than a request or
    notification of the server's. Only a member name or a string equal to "method" puts the
    text '"method"' into JSON (a quote inside a string is escaped), so a C-level search
    decides nearly every answer; a parse decides the rest. Unreadable text counts as the
    answer: it is taken as the request's (refused) answer when delivered."""
    if '"method"' not in data:
        return True
    try:
        message = loads(data.encode())
    except ValueError:
        return True
    return type(message) is not dict or "method" not in message


class Reading:
    """A request's POST, and the resumptions of its event stream: how to stop them, and why."""

    __slots__ = ("scope", "resuming", "stopped")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.resuming = False
        self.stopped: str | None = None


def stop(reading: dict[int | str, Reading], id: Any, why: str) -> None:
    """Stop reading the stream of request ``id``, if it is read."""
    this = reading.get(id) if type(id) in (int, str) else None
    if this is not None:
        this.stopped = why
        this.scope.cancel()


def cancelled_request(line: bytes) -> Any:
    """The id a ``notifications/cancelled`` line cancels; None for any other line."""
    try:
        message = loads(line)
    except ValueError:
        return None
    if type(message) is not dict or message.get("method") != CANCELLED:
        return None
    params = message.get("params")
    return params.get("requestId") if type(params) is dict else None


def answered_id(data: str) -> Any:
    """The id of an answer that came on the GET stream (where a server must not send one)."""
    try:
        message = loads(data.encode())
    except ValueError:
        return None
    return message.get("id") if type(message) is dict else None

"""The rules of a request's event stream on a Streamable HTTP upstream (MCP 2025-11-25
"Resumability and Redelivery"): how long to wait before resuming it, when to give up, and
which message on it is the request's answer. Pure functions and constants."""

from __future__ import annotations

from aggregator.jsonrpc.codec import loads

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

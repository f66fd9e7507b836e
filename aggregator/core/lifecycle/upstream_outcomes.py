"""What an upstream's lifecycle tells the router to do, and how it reads its answers. Sans-IO.

``UpstreamLifecycle`` (``core.lifecycle.upstream_lifecycle``) returns these outcomes; the router acts
on them (``core.upstreams.upstream_control``). An answer to one of its requests is a result object
or an ``Error`` (its text for the log, the server's code and message); a result whose
``resultType`` is anything but ``complete`` (absent means complete) is an error there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from aggregator.core.commands import Answer
from aggregator.mcp import modern

# --- what to do ------------------------------------------------------------------------


class Send(NamedTuple):
    """Send ``message`` (a request or notification of the proxy's own) to the server."""

    message: dict[str, Any]


class Ready(NamedTuple):
    """The handshake is done; ``result`` is the server's checked initialize result."""

    result: dict[str, Any]


class Items(NamedTuple):
    """Every item of ``kind`` the server lists now (initial listing or re-listing)."""

    kind: str
    items: list[dict[str, Any]]


class Listing(NamedTuple):
    """A per-session connection's items of every kind it has, listed together."""

    listing: dict[str, list[dict[str, Any]]]


class Serving(NamedTuple):
    """The connection serves: a shared one has listed every kind, a per-session one has
    finished its handshake."""


class Failed(NamedTuple):
    """The connection cannot be used: ``reason`` for the log and the status; ``code`` is
    the JSON-RPC error code when the server answered with an error; ``refusal``: the error
    that answers the requests waiting for a per-session connection, when no credential of
    its user's could be sent (it says what the user must do)."""

    reason: str
    code: int | None = None
    refusal: dict[str, Any] | None = None


Outcome = Send | Ready | Items | Listing | Serving | Failed | Answer


class Error(NamedTuple):
    """An own request that did not give a usable result."""

    text: str
    code: int | None = None
    message: str | None = None


class Caller(NamedTuple):
    """What waits for the answer to a request made with ``request``."""

    caller: object


def result_of(method: str, message: dict[str, Any]) -> dict[str, Any] | Error:
    """The result of an answer, or why there is none (with the error's code)."""
    if "error" in message:
        error = message["error"]
        if type(error) is not dict:
            error = {}
        code, text = error.get("code"), error.get("message")
        return Error(
            f"{method} failed: {text} (code {code})",
            code if type(code) is int else None,
            text if type(text) is str else None,
        )
    result = message.get("result")
    if type(result) is not dict:
        return Error(f"{method}: the result is not an object")
    kind = result.get(modern.RESULT_TYPE, modern.COMPLETE)  # absent: complete (a legacy server)
    if kind != modern.COMPLETE:
        return Error(f"{method}: a result of type {repr(kind)[:60]} where a complete one was due")
    return result


def answer_of(waiter: Caller, outcome: dict[str, Any] | Error) -> Answer:
    if type(outcome) is Error:
        return Answer(waiter.caller, None, outcome.text, outcome.code, outcome.message)
    assert type(outcome) is dict
    return Answer(waiter.caller, outcome)

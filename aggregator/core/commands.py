"""What the core asks the trio layer to do: the commands its methods return. Sans-IO.

Every event method of the router returns a ``list[Command]``; the hub executes them in
order. Each command is a small named tuple, so building one costs no more than a tuple
and the hub can dispatch on its type.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias


class ToClient(NamedTuple):
    """Send ``message`` (a dict, or bytes already serialized) to client session ``session``.

    ``related`` names the client request the message belongs to, when it is not itself
    the response (progress, a server-to-client request made while serving it) or when the
    message is bytes: transports with one stream per request (Streamable HTTP) use it.
    """

    session: int
    message: Any
    related: Any = None


class ToServer(NamedTuple):
    """Send ``message`` to upstream ``server``."""

    server: str
    message: Any


class ControlReply(NamedTuple):
    """A response to one of the trio layer's own requests to ``server``."""

    server: str
    message: dict[str, Any]


class Refresh(NamedTuple):
    """Re-list ``kind`` (a catalog kind) from ``server``."""

    server: str
    kind: str


class StartUpstream(NamedTuple):
    """Start a session's own connection to a per-session server, named ``name``.

    ``capabilities`` are the client's, so the server sees exactly what its client can do.
    """

    server: str
    name: str
    session: int
    capabilities: dict[str, Any]


class StopUpstream(NamedTuple):
    """Stop the per-session connection ``name`` (its client went away)."""

    name: str


class WaitForStartup(NamedTuple):
    """Hold this client's `initialize` until startup is complete, then feed it again."""

    session: int


Command: TypeAlias = ToClient | ToServer | ControlReply | Refresh | StartUpstream | StopUpstream | WaitForStartup

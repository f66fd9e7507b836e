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


class UpstreamServing(NamedTuple):
    """The connection to ``server`` serves: a shared server is listed, a per-session one
    has finished its handshake (its supervisor marks it ready)."""

    server: str


class DropUpstream(NamedTuple):
    """Close the connection to ``server``: it cannot be used (``reason``, for the log and
    its status, names the server's JSON-RPC error code when it answered with one). A shared
    server is started again after its backoff, as after any loss."""

    server: str
    reason: str


class Answer(NamedTuple):
    """The answer to a request of the trio layer's own (``Router.own_call``), for the
    ``caller`` it named: its ``result``, or ``error`` (why there is none) with the server's
    error ``code`` and ``message``. Also what ``UpstreamLifecycle.request`` answers."""

    caller: object
    result: dict[str, Any] | None
    error: str = ""
    code: int | None = None
    message: str | None = None


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


class RequestEnded(NamedTuple):
    """Client session ``session``'s request ``id`` ended without an answer: the client
    cancelled it. A front with a response stream per request (Streamable HTTP) ends that
    stream; the id is free again."""

    session: int
    id: Any


Command: TypeAlias = (
    ToClient
    | ToServer
    | UpstreamServing
    | DropUpstream
    | Answer
    | StartUpstream
    | StopUpstream
    | WaitForStartup
    | RequestEnded
)

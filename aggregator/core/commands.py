"""What the core asks the trio layer to do: the commands its methods return. Sans-IO.

``Router.handle`` returns a ``list[Command]`` for each event; the hub executes them in
order, dispatching on each command's type (one dict lookup). A command is an attrs record
in the same style as the events (``core.events``): slots, no weakref slot, not frozen,
which builds in about 140 ns where a named tuple takes 230 and a frozen record 360
(measured); several are built per call on the hot path.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import attrs


@attrs.define(weakref_slot=False)
class ToClient:
    """Send ``message`` (a dict, or bytes already serialized) to client session ``session``.

    ``related`` names the client request the message belongs to, when it is not itself
    the response (progress, a server-to-client request made while serving it) or when the
    message is bytes: transports with one stream per request (Streamable HTTP) use it.
    """

    session: int
    message: Any
    related: Any = None


@attrs.define(weakref_slot=False)
class ToServer:
    """Send ``message`` to upstream ``server``."""

    server: str
    message: Any


@attrs.define(weakref_slot=False)
class UpstreamServing:
    """The connection to ``server`` serves: a shared server is listed, a per-session one
    has finished its handshake (its supervisor marks it ready)."""

    server: str


@attrs.define(weakref_slot=False)
class DropUpstream:
    """Close the connection to ``server``: it cannot be used (``reason``, for the log and
    its status, names the server's JSON-RPC error code when it answered with one). A shared
    server is started again after its backoff, as after any loss."""

    server: str
    reason: str


@attrs.define(weakref_slot=False)
class Answer:
    """The answer to a request of the trio layer's own (``Router.own_call``), for the
    ``caller`` it named: its ``result``, or ``error`` (why there is none) with the server's
    error ``code`` and ``message``. Also what ``UpstreamLifecycle.request`` answers."""

    caller: object
    result: dict[str, Any] | None
    error: str = ""
    code: int | None = None
    message: str | None = None


@attrs.define(weakref_slot=False)
class StartUpstream:
    """Start a session's own connection to a per-session server, named ``name``.

    ``capabilities`` are the client's, so the server sees exactly what its client can do.
    """

    server: str
    name: str
    session: int
    capabilities: dict[str, Any]


@attrs.define(weakref_slot=False)
class StopUpstream:
    """Stop the per-session connection ``name`` (its client went away)."""

    name: str


@attrs.define(weakref_slot=False)
class WakeUpstream:
    """Start shared server ``server``, which is stopped (lazy, or stopped when idle): a
    request is held for it. Its catalog was served from its cached listing meanwhile."""

    server: str


@attrs.define(weakref_slot=False)
class StopIdle:
    """Stop shared server ``server``: nobody used it for its ``idle_stop_after``. The router
    has already let go of its connection; its items stay in the catalog, and the next
    request for it wakes it (``WakeUpstream``)."""

    server: str


@attrs.define(weakref_slot=False)
class WaitForStartup:
    """Hold this client's `initialize` until startup is complete, then feed it again."""

    session: int


@attrs.define(weakref_slot=False)
class RequestEnded:
    """Client session ``session``'s request ``id`` ended without an answer: the client
    cancelled it. A front with a response stream per request (Streamable HTTP) ends that
    stream; the id is free again."""

    session: int
    id: Any


@attrs.define(weakref_slot=False)
class ShareKept:
    """Write the rest of a cut result to the shared store, so that any replica serves it:
    kept under ``token`` for ``owner`` (the caller's name every replica gives it,
    ``core.catalogs.result_budget.shared_owner``), read in pages of ``page_bytes``, for
    ``ttl`` seconds; then send ``answer`` (the cut result, to its caller), so that the
    caller cannot ask another replica for the rest before the store has it. A write that
    fails or takes too long does not hold the answer back: the rest is then served by
    this replica alone."""

    token: str
    owner: str
    text: str
    page_bytes: int
    ttl: float
    answer: ToClient


@attrs.define(weakref_slot=False)
class FetchKept:
    """Read the rest kept under ``token`` from the shared store, for client session
    ``session``'s ``resources/read`` (its request ``id``, the ``uri`` and ``page`` it asked
    for) as ``owner``: a rest this replica does not hold. The answer comes back as the
    event ``KeptFetched`` (what was found, or nothing), within the trio layer's deadline."""

    session: int
    id: Any
    token: str
    owner: str
    uri: str
    page: int


Command: TypeAlias = (
    ToClient
    | ToServer
    | UpstreamServing
    | DropUpstream
    | Answer
    | StartUpstream
    | StopUpstream
    | WakeUpstream
    | StopIdle
    | WaitForStartup
    | RequestEnded
    | ShareKept
    | FetchKept
)

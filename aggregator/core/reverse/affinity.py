"""To which client a server's message belongs: the rules, as pure functions.

A server-to-client request (``sampling/createMessage``, ``elicitation/create``,
``roots/list``) or a log line (``notifications/message``) from an upstream names no
client. These signals can name one, strongest first; the first that is present decides:

a. ``link``: the upstream is a per-session connection: its one session.
b. ``stream``: it arrived on the POST stream of a request the proxy sent (a Streamable
   HTTP upstream answers there): that request's client. If that request has ended
   (answered, cancelled, timed out, its client gone), the message belongs to nobody
   (``ended``): no other client is asked in its place.
c. ``task``: ``_meta["io.modelcontextprotocol/related-task"]`` names a task this server
   created: the task's owner.
d. ``progress``: ``_meta.progressToken`` is the token the proxy sent this server for a
   request in flight: that request's client.
e. ``in_flight``: exactly one session has requests in flight on this server: that one
   (and its request, when it has exactly one there).
f. ``only_client`` (requests only): nothing in flight there and exactly one client is
   initialized: that one.

Otherwise a request cannot be routed: ``ambiguous`` (several clients could be meant) or
``unavailable`` (no client could be). A log line that no signal places belongs to no
request (``no_request``: it goes to the sessions that asked for logs) unless several
sessions have calls in flight on a server that cannot say which (``ambiguous``: it goes
to nobody, since it may carry one client's data).

Roots: a shared server sees the proxy's roots (``proxy.roots``, else none), never one
client's, unless the proxy can only ever have one client; a per-session server sees its
client's. What a server sees is a *source*; what to do with a ``roots/list`` follows from
the source and the state of its client.

Nothing here does I/O or keeps state: the router gathers the facts and acts on the answer.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

# Why a message went nowhere (also the ``data.reason`` of the error a server gets).
AMBIGUOUS = "ambiguous"
UNAVAILABLE = "unavailable"
NO_REQUEST = "no_request"
ENDED = "ended"  # it came on the stream of a request that is no longer in flight


class Owner(NamedTuple):
    """Where a server's message goes: ``session`` (None: nobody), ``related`` (the
    client's request it belongs to, if known) and ``signal`` (what decided, or why
    nobody: AMBIGUOUS, UNAVAILABLE, NO_REQUEST). A session is whatever names a caller
    here: a client's key, or for a server's request, a call parked off its client."""

    session: Hashable | None
    related: Any = None
    signal: str = ""


Request = tuple[Hashable, Any]  # (session, the client's request id)


def _signalled(
    link_session: int | None,
    live: bool,
    stream: Request | None,
    task: int | None,
    progress: Request | None,
    ended: bool = False,
) -> Owner | None:
    """Signals a-d, or None when none of them is present."""
    if link_session is not None:
        if not live:
            return Owner(None, None, UNAVAILABLE)
        for named in (stream, progress):
            if named is not None and named[0] == link_session:
                return Owner(link_session, named[1], "link")
        return Owner(link_session, None, "link")
    if stream is not None:
        return Owner(stream[0], stream[1], "stream")
    if ended:
        return Owner(None, None, ENDED)
    if task is not None:
        return Owner(task, progress[1] if progress is not None and progress[0] == task else None, "task")
    if progress is not None:
        return Owner(progress[0], progress[1], "progress")
    return None


def _only_caller(in_flight: Mapping[Hashable, Sequence[Any]]) -> Owner | None:
    """Signal e: the one session with requests in flight, or None if not exactly one."""
    if len(in_flight) != 1:
        return None
    [(session, ids)] = in_flight.items()
    return Owner(session, ids[0] if len(ids) == 1 else None, "in_flight")


def request_owner(
    *,
    link_session: int | None = None,
    live: bool = True,
    stream: Request | None = None,
    task: int | None = None,
    progress: Request | None = None,
    in_flight: Mapping[Hashable, Sequence[Any]] | None = None,
    clients: Sequence[int] = (),
    ended: bool = False,
) -> Owner:
    """The client a server-to-client request is for.

    ``link_session``: the session of a per-session link (``live``: it is still connected).
    ``stream``/``progress``: the (session, request id) those signals name; ``task``: the
    session owning the named task. ``in_flight``: the live sessions with requests in
    flight on this server and their request ids (only read when a-d say nothing).
    ``clients``: the initialized sessions. ``ended``: it came on the stream of a request
    that is no longer in flight.
    """
    owner = _signalled(link_session, live, stream, task, progress, ended)
    if owner is not None:
        return owner
    if in_flight:
        return _only_caller(in_flight) or Owner(None, None, AMBIGUOUS)
    if len(clients) == 1:
        return Owner(clients[0], None, "only_client")
    return Owner(None, None, AMBIGUOUS if clients else UNAVAILABLE)


def log_owner(
    *,
    link_session: int | None = None,
    live: bool = True,
    stream: Request | None = None,
    task: int | None = None,
    progress: Request | None = None,
    in_flight: Mapping[Hashable, Sequence[Any]] | None = None,
    streams: bool = False,
    ended: bool = False,
) -> Owner:
    """The client a log line is for; session None with NO_REQUEST (it belongs to no
    request), AMBIGUOUS (it may belong to any of several) or UNAVAILABLE.

    ``streams``: the upstream delivers what belongs to a request on that request's own
    stream (Streamable HTTP), so a line that came any other way belongs to no request.
    A line on the stream of a request that has ended (``ended``) goes to nobody.
    """
    owner = _signalled(link_session, live, stream, task, progress, ended)
    if owner is not None:
        return owner
    if streams or not in_flight:
        return Owner(None, None, NO_REQUEST)
    return _only_caller(in_flight) or Owner(None, None, AMBIGUOUS)


def unroutable(method: str, server: str, reason: str, per_session: bool) -> str:
    """What a server is told when its request reaches no client: why, and what to do."""
    if reason == AMBIGUOUS:
        return (
            f"Cannot tell which client server {server!r} asks for {method}: several clients use it and"
            ' its request does not say which one it is for; set isolation = "per-session" for this server'
            " to give each client its own connection"
        )
    if reason == ENDED:
        return (
            f"No client can answer {method} for server {server!r}: the request it was made for has ended"
            " (answered, cancelled or timed out)"
        )
    if per_session:
        return f"No client can answer {method} for server {server!r}: its client has disconnected"
    return f"No client can answer {method} for server {server!r}: no client is connected (and initialized) now"


# --- roots ------------------------------------------------------------------------------

FROM_PROXY = "proxy"  # the server sees proxy.roots (or none)
FROM_ABSENT_CLIENT = "absent"  # the server sees the one client's, and it is not here yet


def roots_source(link_session: int | None, single_client: bool, clients: Sequence[int]) -> int | str:
    """Whose roots a server sees: a session, FROM_PROXY, or FROM_ABSENT_CLIENT.

    A per-session server sees its own client's. A shared server sees the proxy's, never a
    client's (another client could read under them through it), unless the proxy serves
    one client only (stdio, no network front): then that client's, once it is there.
    """
    if link_session is not None:
        return link_session
    if not single_client:
        return FROM_PROXY
    return clients[0] if clients else FROM_ABSENT_CLIENT


FORWARD = "forward"  # ask the client
ANSWER = "answer"  # answer from proxy.roots (or [])
HOLD = "hold"  # wait for the client to finish initializing, within the bound


def roots_action(source: int | str, initialized: bool, declares_roots: bool) -> str:
    """What to do with a ``roots/list`` whose roots come from ``source``, whose client
    (if any) has ``initialized`` and ``declares_roots``."""
    if source == FROM_PROXY:
        return ANSWER
    if source == FROM_ABSENT_CLIENT or not initialized:
        return HOLD
    return FORWARD if declares_roots else ANSWER


def roots_followers(session: int, links: Iterable[tuple[str, int | None]], single_client: bool) -> list[str]:
    """The links (name, its session or None when shared) whose roots come from
    ``session``: they are the ones told when its roots change."""
    return [name for name, link_session in links if link_session == session or (link_session is None and single_client)]

"""Every client request in flight through the proxy, and the one way out of every table
(invariant 2 of the router). Sans-IO.

A request is one ``Pending`` (``core.records.links``), in the tables its ``Phase`` names: the
link's ``pending`` (by upstream id) once sent, its client's ``in_flight`` (by the
client's id) while it is on a session, ``progress`` (by the proxy's progress token) if
it asked for progress, ``held`` (by server) while it waits for that server's listing, and
the ``deadlines`` heap while anything may time it out. ``start`` puts a sent request in
the link's table and the heap; ``end`` takes it out of every table at once, whatever its
phase, and counts how it ended (``core.requests.tallies``). Nothing else removes one, so the
tables hold exactly what is in flight. ``fail`` ends one with an error of the proxy's.

The table reads the links and the clients it is given (the router's own dicts); it
writes only their in-flight entries, and undoes a subscription whose request failed.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.core.commands import Command, ToClient
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Pending, UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.deadlines import Deadlines
from aggregator.core.requests.tallies import Tallies

# The progress tokens the proxy sends upstream: strings no server would pick by chance, so
# one in a server's request names the proxy's request in flight and nothing else.
PROGRESS_TOKEN_PREFIX = "aggregator-progress-"


class RequestTable:
    """The requests in flight, by every key they are found by, and their deadlines."""

    def __init__(
        self,
        clock: Callable[[], float],
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        tallies: Tallies,
        subscriptions: Subscriptions,
    ) -> None:
        self.clock = clock
        self.links = links
        self.clients = clients
        self.tallies = tallies  # what ended how
        self.subscriptions = subscriptions  # a subscribe that fails is undone
        self.progress: dict[str, Pending] = {}  # the proxy's progress token -> its request
        self.deadlines = Deadlines()  # timeouts (of parked calls and gatherings too, ``core.era.parked``)
        self.held: dict[str, list[Pending]] = {}  # server -> requests waiting for its listing
        self._next_token = 1

    def token(self) -> str:
        """A progress token of the proxy's, never used before."""
        token = f"{PROGRESS_TOKEN_PREFIX}{self._next_token}"
        self._next_token += 1
        return token

    def client_of(self, pending: Pending) -> ClientState | None:
        """The client a request is for, if it is still connected (a parked call's is none)."""
        session = pending.session
        return None if session is None else self.clients.get(session)

    def start(self, pending: Pending, link: UpstreamLink) -> None:
        """``pending`` was sent to ``link`` now: in its table, under its deadlines."""
        now = pending.sent_at = self.clock()
        pending.hard_deadline = now + link.max_request_timeout
        # tasks/result blocks until the task is done, by design: only the hard maximum applies.
        # (The config guarantees request_timeout <= max_request_timeout.)
        if pending.method == "tasks/result":
            pending.deadline = pending.hard_deadline
        else:
            pending.deadline = now + link.request_timeout
        link.pending[pending.upstream_id] = pending
        self.deadlines.push(pending.deadline, pending)

    def end(self, pending: Pending, outcome: str | None = None, reason: str = "", seconds: float | None = None) -> None:
        """Forget a request everywhere. Safe to call twice. ``outcome`` (and ``reason``,
        ``seconds``) is what it is counted as (``core.requests.tallies``); None: not counted, another
        record of the same request takes over."""
        if pending.done:
            return
        pending.done = True
        link = self.links[pending.server]
        link.pending.pop(pending.upstream_id, None)
        if outcome is not None:
            self.tallies.ended(pending.method, link.server or pending.server, outcome, reason, seconds)
        session = pending.session  # (``client_of``, inline: every request ends here)
        client = self.clients.get(session) if session is not None else None
        if client is not None:
            client.in_flight.pop(pending.client_id, None)
        if pending.token is not None:
            self.progress.pop(pending.token, None)
        self.deadlines.discard()

    def fail(self, pending: Pending, message: str, reason: str) -> list[Command]:
        """End one forwarded request with an error of the proxy's (its client told, if it is
        still there; a subscribe that failed is undone)."""
        self.end(pending, "error", reason)
        if pending.session not in self.clients:
            return []
        if pending.subscription is not None:
            self.subscriptions.remove(pending.subscription, pending.session)
        server = self.links[pending.server].server or pending.server
        return [ToClient(pending.session, proxy_error(pending.client_id, message, reason=reason, server=server))]

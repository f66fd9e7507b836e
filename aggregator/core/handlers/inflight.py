"""Requests in flight given up on and timed out (their table: ``core.requests.request_table``). Sans-IO.

``InFlight`` keeps no table of its own: it is given the links, the clients, the request
table, the shared servers' outages (what a request held for one is told), and the
objects whose deadlines share the router's one clock (the proxy's own requests upstream,
parked calls, notices, held roots/list requests) or whose calls end with the others (the
input bridge, modern callers' listens). Expiring the proxy's own requests upstream is
the upstream events' (their lifecycles may speak); ``next_deadline`` counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aggregator.core.catalogs.outages import Outage, unavailable
from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.input_bridge import InputBridge, awaits_input
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.parked import ParkedCalls
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Listens
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UNSENT, Pending, UpstreamLink
from aggregator.core.replies import cancelled, proxy_error
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.reverse.roots import Roots
from aggregator.core.upstreams.held_requests import Resend
from aggregator.core.upstreams.own_listings import OwnListings
from aggregator.core.upstreams.upstream_control import UpstreamControl
from aggregator.jsonrpc.errors import INTERNAL_ERROR, error_response

log = logging.getLogger(__name__)


class InFlight:
    """The tables of requests in flight (invariant 2) and the ways they end."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        requests: RequestTable,
        outages: dict[str, Outage],
        control: UpstreamControl,
        parked: ParkedCalls,
        announcements: Announcements,
        roots: Roots,
        input_bridge: InputBridge,
        modern: ModernCallers,
        listens: Listens,
        own_listings: OwnListings,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.clients = clients
        self.requests = requests
        self.outages = outages  # what a request held for a shared server between starts is told
        self.control = control  # the own requests upstream: theirs fail with the link's
        self.parked = parked  # parked calls and gatherings share the deadline heap
        self.announcements = announcements  # notices due
        self.roots = roots  # roots/list requests held for a client
        self.input_bridge = input_bridge  # calls waiting for a legacy caller's input
        self.modern = modern  # modern callers' listens end at shutdown
        self.listens = listens
        self.own_listings = own_listings  # a list held for a session's own connection: answered without it
        self.clock = clock

    def abandon(self, why: str) -> list[Command]:
        """Fail every client request still in flight (shutting down): the client hears it,
        the server is told to stop."""
        out: list[Command] = self.modern.end_listens() if self.listens else []
        for link in self.links.values():
            for pending in list(link.pending.values()):
                self.requests.end(pending, "error", "unavailable")
                if link.ready:
                    out.append(ToServer(link.name, cancelled(pending.upstream_id, why)))
                if pending.session in self.clients:
                    out.append(
                        ToClient(
                            pending.session,
                            proxy_error(
                                pending.client_id,
                                f"Server {link.server!r} did not answer before the aggregator stopped",
                                reason="unavailable",
                                server=link.server,
                            ),
                        )
                    )
        # Requests held for a server that is restarting, or for a session's own connection
        # that is starting, were never sent: their clients hear it too.
        for client in self.clients.values():
            for pending in [p for p in client.in_flight.values() if p.phase in UNSENT]:
                self.requests.end(pending, "error", "unavailable")
                server = self.links[pending.server].server or pending.server
                out.append(
                    ToClient(
                        client.key,
                        proxy_error(
                            pending.client_id,
                            f"The aggregator stopped before server {server!r} was ready for {pending.method}",
                            reason="unavailable",
                            server=server,
                        ),
                    )
                )
        self.requests.held.clear()
        return out + self.input_bridge.abandoned()

    def in_flight(self) -> int:
        """Client requests waiting for an upstream's answer (not the proxy's own)."""
        return sum(len(link.pending) for link in self.links.values())

    def next_deadline(self) -> float | None:
        """When ``expire`` has work next (a request times out, a notice is due)."""
        deadline = self.requests.deadlines.next()
        own_at = self.control.own_at
        if own_at is not None and (deadline is None or own_at < deadline):
            deadline = own_at
        if self.announcements.at is not None and (deadline is None or self.announcements.at < deadline):
            deadline = self.announcements.at
        held = self.roots.next_deadline() if self.roots.held else None  # rarely any
        if held is not None and (deadline is None or held < deadline):
            deadline = held
        return deadline

    def expire(self, now: float) -> list[Command | Resend]:
        """Time out what is overdue, send notices that are due (the proxy's own requests
        upstream aside). A list held for a session's own connection comes back as a
        ``Resend``, to be answered without it."""
        out: list[Command | Resend] = []
        for pending in self.requests.deadlines.pop_due(now):  # a Pending, or a Parked call (``core.era.parked``)
            out += self._time_out(pending) if type(pending) is Pending else self.parked.expire(pending)
        if self.announcements.at is not None and now >= self.announcements.at:
            out += self.announcements.send()
        if self.roots.held:
            out += self.roots.expire(now)
        return out

    def _time_out(self, pending: Pending) -> list[Command] | list[Resend]:
        if pending.phase in UNSENT:
            if self.own_listings.holds(pending):
                return self.own_listings.timed_out(pending)
            return self._held_timed_out(pending)
        if awaits_input(pending):
            return self.input_bridge.timed_out(pending)
        self.requests.end(pending, "error", "timeout")
        link = self.links[pending.server]
        out: list[Command] = []
        if link.ready:
            out.append(ToServer(pending.server, cancelled(pending.upstream_id, "timed out")))
        log.warning("server %s: %s timed out (upstream id %d)", pending.server, pending.method, pending.upstream_id)
        if pending.session in self.clients:
            hard = pending.deadline >= pending.hard_deadline
            limit = link.max_request_timeout if hard else link.request_timeout
            out.append(
                ToClient(
                    pending.session,
                    proxy_error(
                        pending.client_id,
                        f"Server {pending.server!r} did not answer {pending.method} within {limit:g}s",
                        reason="timeout",
                        server=pending.server,
                    ),
                )
            )
        return out

    def fail_pending(self, link: UpstreamLink, message: str, reason: str) -> list[Command]:
        """End every request in flight on ``link``, each client told ``message``; the
        proxy's own fail too."""
        out: list[Command] = self.control.fail_own(link)
        for pending in list(link.pending.values()):
            out += self.requests.fail(pending, message, reason)
        return out + self.input_bridge.lost(link, message, reason)

    def _held_timed_out(self, held: Pending) -> list[Command]:
        """A request held for a server that is out (invariant 7) or for its own connection
        to start waited its whole timeout: its client hears the server's state."""
        self.requests.end(held, "error", "timeout")
        if held.session not in self.clients:
            return []
        link = self.links[held.server]
        # The timeout it was held under (a reload may have given its server another since).
        waited = link.request_timeout if held.held_at is None else held.deadline - held.held_at
        outage = self.outages.get(held.server)
        if outage is None:
            text, data = (
                f"Server {held.server!r} did not become ready within {waited:g} s",
                {"source": "aggregator", "reason": "unavailable", "server": held.server},
            )
        else:
            text, data = unavailable(outage, self.clock(), waited=waited)
        log.info("server %s: %s waited %gs for the server and failed", held.server, held.method, waited)
        return [ToClient(held.session, error_response(held.client_id, INTERNAL_ERROR, text, data))]

"""Requests in flight given up on and timed out (their table: ``core.requests.request_table``). Sans-IO."""

from __future__ import annotations

import logging

from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.input_bridge import awaits_input
from aggregator.core.state import (
    Pending,
    RouterState,
    UpstreamLink,
    cancelled,
    proxy_error,
)
from aggregator.core.upstreams.links import UNSENT

log = logging.getLogger(__name__)


class InFlight(RouterState):
    """The tables of requests in flight (invariant 2) and the ways they end."""

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
        held = self.roots.next_deadline()
        if held is not None and (deadline is None or held < deadline):
            deadline = held
        return deadline

    def expire(self) -> list[Command]:
        """Time out what is overdue, send notices that are due."""
        now = self.clock()
        out: list[Command] = []
        for pending in self.requests.deadlines.pop_due(now):  # a Pending, or a Parked call (``core.era.parked``)
            out += self._time_out(pending) if type(pending) is Pending else self.parked.expire(pending)
        if self.announcements.at is not None and now >= self.announcements.at:
            out += self.announcements.send()
        if self.roots.held:
            out += self.roots.expire(now)
        if self.control.own_at is not None and now >= self.control.own_at:
            for link, commands, outcomes in self.control.expire(now):
                out += commands if outcomes is None else commands + self._lifecycle(link, outcomes)
        return out

    def _time_out(self, pending: Pending) -> list[Command]:
        if pending.phase in UNSENT:
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

    def _fail_pending(self, link: UpstreamLink, message: str, reason: str) -> list[Command]:
        """End every request in flight on ``link``, each client told ``message``; the
        proxy's own fail too."""
        out: list[Command] = self.control.fail_own(link)
        for pending in list(link.pending.values()):
            out += self.requests.fail(pending, message, reason)
        return out + self.input_bridge.lost(link, message, reason)

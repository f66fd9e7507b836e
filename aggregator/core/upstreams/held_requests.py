"""Requests held for a shared server between starts (invariant 7 of the router). Sans-IO.

A request whose name or URI belongs to a shared server that is out (``outages``) is held
for it, within its own timeout, while the server is expected back in time
(``should_hold``), or answered ``unavailable`` with the server's state. ``HeldRequests``
decides which (``hold_or_answer``) and answers those held when the server will not come
back (``fail``). A held request is a ``Pending`` in phase LISTING, in its client's
``in_flight``, the request table's ``held`` and its deadlines, never in ``link.pending``:
nothing was sent. Once the server is listed they are released (``release``): each is
ended and handed back as a ``Resend``, an outcome of the upstream event that listed the
server, which the router hands to the client events to handle the request again as its
client sent it (its name looked up anew), and the request it became keeps the held one's
deadline (``keep_deadline``). A held request that times out is the timeouts'
(``core.handlers.inflight``).

It keeps no table of its own (``held`` is the request table's); it is given the links,
the clients' requests, the outages, how long each server's last start took, forwarding
(whether the proxy still takes new requests) and the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from aggregator.core.catalogs.outages import DORMANT, STARTING, Outage, should_hold, unavailable
from aggregator.core.commands import Command, ToClient, WakeUpstream
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UNSENT, Pending, Phase, UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.request_table import RequestTable
from aggregator.jsonrpc.errors import INTERNAL_ERROR, error_response


class Resend(NamedTuple):
    """A request held for a server that is listed now, ended as held: its client's request
    (``held.held``) is to be handled again, as its client sent it (``HeldRequests.release``)."""

    held: Pending


class HeldRequests:
    """Requests for a shared server that is out: held for it, or answered with its state."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        requests: RequestTable,
        outages: dict[str, Outage],
        start_takes: dict[str, float],
        forwarding: Forwarding,
        max_in_flight: int,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.clients = clients
        self.requests = requests  # its ``held`` and deadlines
        self.tallies = requests.tallies  # what ended how
        self.outages = outages  # shared servers not listed (yet, or again)
        self.start_takes = start_takes  # server -> how long its last start took
        self.forwarding = forwarding  # draining: nothing new is held
        self.max_in_flight = max_in_flight  # held per server, and per client
        self.clock = clock

    def hold_or_answer(self, client: ClientState, message: dict[str, Any], server: str) -> list[Command]:
        """Hold a request for a server that is out, or tell its client how the server is."""
        outage = self.outages.get(server)
        link = self.links[server]
        now = self.clock()
        if outage is None:  # not out (a lookup raced nothing here: events are sequential)
            self.tallies.ended(message["method"], server, "error", "unavailable", None)
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        message["id"],
                        f"Server {server!r} is not available right now",
                        reason="unavailable",
                        server=server,
                    ),
                )
            ]
        out: list[Command] = []
        if outage.state in DORMANT and outage.retry_at is not None and now < outage.retry_at:
            # Its last start on demand failed just now (outages rule 7): said at once, no new start.
            text, data = unavailable(outage, now)
            self.tallies.ended(message["method"], server, "error", "unavailable", None)
            return [ToClient(client.key, error_response(message["id"], INTERNAL_ERROR, text, data))]
        if outage.state in DORMANT and not self.forwarding.draining:  # stopped on purpose: wake it
            out.append(self._wake(outage, now))
        held = self.requests.held.setdefault(server, [])
        if len(held) >= self.max_in_flight:
            held[:] = [p for p in held if not p.done]
        if (
            not self.forwarding.draining
            and len(held) < self.max_in_flight
            and len(client.in_flight) < self.max_in_flight
            and should_hold(outage, now, link.request_timeout, self.start_takes.get(server, 0.0))
        ):
            pending = Pending(client.key, message["id"], message["method"], server, 0)
            pending.hold(Phase.LISTING, message)
            pending.held_at = now
            pending.hard_deadline = now + link.max_request_timeout
            pending.deadline = now + link.request_timeout
            self.requests.deadlines.push(pending.deadline, pending)
            client.in_flight[pending.client_id] = pending
            held.append(pending)
            return out + starting_progress(client.key, message, server) if outage.woken else out
        text, data = unavailable(outage, now)
        self.tallies.ended(message["method"], server, "error", "unavailable", None)
        return [*out, ToClient(client.key, error_response(message["id"], INTERNAL_ERROR, text, data))]

    def wake_for_held(self, server: str) -> list[Command]:
        """``server`` is dormant again while requests are held for it (a reload replaced a
        server that was starting for them by one listed from its cache): they wake it now,
        as the first of them would have (``outages`` rule 6)."""
        outage = self.outages.get(server)
        if outage is None or outage.state not in DORMANT or self.forwarding.draining:
            return []
        if all(held.done for held in self.requests.held.get(server, ())):
            return []
        return [self._wake(outage, self.clock())]

    def _wake(self, outage: Outage, now: float) -> WakeUpstream:
        outage.woken = outage.state
        outage.state = STARTING
        outage.retry_at = None
        outage.attempt_at = now  # its start is timed from now
        return WakeUpstream(outage.server)

    def fail(self, server: str, removed: str | None = None) -> list[Command]:
        """The requests held for ``server`` are answered with its state (it will not be
        listed: shutting down), or, ``removed`` from the configuration, with why (its state
        is no more: it will not start again)."""
        outage = self.outages.get(server)
        out: list[Command] = []
        for held in self.requests.held.pop(server, ()):
            if held.done:
                continue
            self.requests.end(held, "error", "unavailable")
            if held.session not in self.clients:
                continue
            if removed is not None:
                text = f"Server {server!r} is not available: {removed}"
                out.append(
                    ToClient(held.session, proxy_error(held.client_id, text, reason="unavailable", server=server))
                )
            elif outage is not None:
                text, data = unavailable(outage, self.clock())
                out.append(ToClient(held.session, error_response(held.client_id, INTERNAL_ERROR, text, data)))
        return out

    def release(self, server: str) -> list[Resend]:
        """``server`` is listed: the requests held for it end as held, and those whose
        clients are still connected are handed back to be handled again, in order."""
        out: list[Resend] = []
        for held in self.requests.held.pop(server, ()):
            if held.done:
                continue
            self.requests.end(held)
            if held.session in self.clients:
                assert held.held is not None  # held: its request is kept
                out.append(Resend(held))
        return out

    def keep_deadline(self, held: Pending) -> None:
        """A released request was handled again: the request it became upstream keeps the
        held one's deadlines, as if it had never been held."""
        assert held.session is not None  # held for a client's request
        sent = self.clients[held.session].in_flight.get(held.client_id)
        if sent is not None and sent.phase not in UNSENT and sent.deadline > held.deadline:
            sent.deadline = held.deadline
            sent.hard_deadline = min(sent.hard_deadline, held.hard_deadline)
            self.requests.deadlines.move(sent.deadline, sent)


def starting_progress(key: int, message: dict[str, Any], server: str) -> list[Command]:
    """What tells a caller that sent a progress token that its request waits for its server
    to start: one ``notifications/progress`` (progress 0, no total: it only says why the
    wait), on the request's own stream. Nothing for a request without a token."""
    params = message.get("params")
    meta = params.get("_meta") if type(params) is dict else None
    token = meta.get("progressToken") if type(meta) is dict else None
    if type(token) not in (int, str):
        return []
    notice = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": 0, "message": f"starting server {server!r}"},
    }
    return [ToClient(key, notice, message["id"])]

"""How many calls may be parked for their modern callers' input, and when they expire. Sans-IO.

A parked call (``core.parked``) holds a call open upstream while its caller is asked for
input; each ``input_required`` answer ends an HTTP caller's request, so no in-flight limit
of the fronts counts it. So parked calls are bounded here: ``proxy.max_parked_calls`` in
all and ``proxy.max_parked_per_principal`` per caller's principal (none for a caller
without one: its front has no principal to tell callers apart). A call that would go past
either is not parked: the server's requests are refused, the call is cancelled upstream
and fails ``overloaded`` to its caller.

The parked calls of one server expire at least ``EXPIRY_SPACING`` apart: calls parked in a
burst are not all cancelled on their server in one burst when their callers never retry
(a server given hundreds of cancels and error answers at once may not survive them).
"""

from __future__ import annotations

import logging
from typing import Any

from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.state import ClientState, Pending, RouterState, UpstreamLink, cancelled, proxy_error

log = logging.getLogger(__name__)

# Parked calls of one server expire at least this far apart (at most 200 a second).
EXPIRY_SPACING = 0.005


class ParkLimits(RouterState):
    """The bounds of the parked calls table and the spacing of their deadlines."""

    def _parked_full(self, principal: Any) -> str | None:
        """Why one more call of ``principal`` cannot be parked (a limit is reached), or None."""
        if len(self.parked) >= self.parked.max_calls:
            return f"{len(self.parked)} calls already wait for their callers' input (proxy.max_parked_calls)"
        if principal is not None and self.parked.by_principal.get(principal, 0) >= self.parked.max_per_principal:
            return (
                f"{self.parked.max_per_principal} calls of this caller already wait for its input"
                " (proxy.max_parked_per_principal)"
            )
        return None

    def _park_refused(
        self, link: UpstreamLink, pending: Pending, client: ClientState, ids: list[Any], full: str
    ) -> list[Command]:
        """A call that needs input but cannot be parked: the server's requests are refused,
        the call cancelled upstream and failed ``overloaded`` to its caller."""
        log.warning("server %s: %s needs input but %s; refused", link.name, pending.method, full)
        self._end(pending, "error", "overloaded")
        why = f"Server {link.server!r} needs input for {pending.method}, but {full}; try again later"
        out: list[Command] = [
            ToServer(link.name, proxy_error(id, why, reason="overloaded", server=link.server)) for id in ids
        ]
        out.append(ToServer(link.name, cancelled(pending.upstream_id, "the aggregator holds too many parked calls")))
        out.append(ToClient(client.key, proxy_error(pending.client_id, why, reason="overloaded", server=link.server)))
        return out

    def _unpark(self, parked: Any) -> None:
        """Take ``parked`` out of the table and its principal's count."""
        self.parked.pop(parked.id, None)
        principal = parked.principal
        if principal is not None:
            left = self.parked.by_principal.get(principal, 0) - 1
            if left > 0:
                self.parked.by_principal[principal] = left
            else:
                self.parked.by_principal.pop(principal, None)

    def _parked_deadline(self, server: str) -> float:
        """When a call parked now on ``server`` expires: ``input_required_timeout`` from now,
        but at least ``EXPIRY_SPACING`` after the previous one of that server, so that calls
        parked in a burst are not all cancelled on it in one burst."""
        now = self.clock()
        expiries = self.parked.expiry
        deadline = max(now + self.request_states.ttl, expiries.get(server, 0.0) + EXPIRY_SPACING)
        if len(expiries) > 1024 and server not in expiries:  # per-session links come and go
            for name in [name for name, at in expiries.items() if at < now]:
                del expiries[name]
        expiries[server] = deadline
        return deadline

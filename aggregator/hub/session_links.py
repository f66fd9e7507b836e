"""Each session's own connections to servers: those of ``isolation = "per-session"``, and
of servers that act as each user (``auth = "oauth"`` or ``"token-exchange"``).

The router says when one starts (``StartUpstream``, carried out by the hub's table through
``start``) and stops (``StopUpstream``: ``stop``); each runs in a task of its own, its
boundary: whatever fails in it ends that connection only. When it ends, on purpose or on
its own (it crashed, or could not start), it leaves the hub's table of upstreams and the
router hears so (``ended``), so that the next request of its session starts a fresh one.
A connection to a server acting as each user sends its session's user's credential, and
nobody else's (``callers``).

Never holds the router: the hub hands it what it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from aggregator.config import ServerConfig
from aggregator.core.router import StartUpstream, StopUpstream
from aggregator.hub.callers import Callers
from aggregator.upstreams.port import UpstreamPort
from aggregator.upstreams.session import UpstreamSession

log = logging.getLogger(__name__)


class SessionLinks:
    """Starts, stops and runs the sessions' own connections, kept in ``upstreams``."""

    def __init__(
        self,
        port: UpstreamPort,
        upstreams: dict[str, UpstreamSession],
        callers: Callers,
        *,
        retire: Callable[[UpstreamSession], None],
        ended: Callable[[str], object],
    ) -> None:
        self.port = port  # what each connection reports to (the hub)
        self.upstreams = upstreams  # the hub's table of every upstream, shared ones too
        self.callers = callers
        self._retire = retire  # its counters go on under its server's name (``Metrics.retire``)
        self._ended = ended  # the router hears that connection ``name`` ended
        self.nursery: trio.Nursery | None = None  # the hub's, once it runs

    def start(self, server: ServerConfig, command: StartUpstream) -> None:
        """Start session ``command.session``'s own connection to ``server``."""
        auth = self.callers.bearer(command.session, server, command.capabilities)
        upstream = UpstreamSession(
            self.port, server, name=command.name, client_capabilities=command.capabilities, auth=auth
        )
        self.upstreams[command.name] = upstream
        assert self.nursery is not None
        self.nursery.start_soon(self._run, upstream, name=f"upstream {command.name}")

    def stop(self, command: StopUpstream) -> None:
        """Stop the connection the router no longer needs (its session ended, or idle)."""
        upstream = self.upstreams.get(command.name)
        if upstream is not None:
            upstream.cancel_scope.cancel()

    async def _run(self, upstream: UpstreamSession) -> None:
        try:
            await upstream.run()
        except Exception:  # noqa: BLE001 - one session's server, never the process
            log.exception("server %s: internal error in a per-session connection; it ends", upstream.name)
        finally:
            if self.upstreams.get(upstream.name) is upstream:
                del self.upstreams[upstream.name]
                self._retire(upstream)
            self._ended(upstream.name)

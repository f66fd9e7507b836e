"""Shutting down gently: what is in flight may finish, for a while, before anything stops."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from aggregator.core.events import Abandoned, DrainingStarted
from aggregator.core.router import Command, Router
from aggregator.transports.sink import ClientSink

log = logging.getLogger("aggregator.hub.hub")


async def drain(
    router: Router, clients: dict[int, ClientSink], dispatch_now: Callable[[list[Command]], None], seconds: float
) -> None:
    """Let the requests in flight in ``router`` finish (up to ``seconds``) while refusing
    new ones; then answer what is left, and give ``clients`` a second to read it."""
    router.handle(DrainingStarted())
    waiting = router.in_flight()
    if waiting:
        log.info("shutting down: waiting up to %.0fs for %d request(s) in flight", seconds, waiting)
    with trio.move_on_after(seconds):
        while router.in_flight():  # noqa: ASYNC110 - the router has no event to wait on
            await trio.sleep(0.05)
    left = router.in_flight()
    if left:
        log.warning("shutting down: %d request(s) still in flight after %.0fs; they fail now", left, seconds)
    # Also what was held for a server between restarts (or a session's own connection
    # still starting): never sent, it is answered now rather than left to the close.
    dispatch_now(router.handle(Abandoned("the aggregator is shutting down")))
    # Let the answers reach the clients before the connections close.
    with trio.move_on_after(1):
        for client in list(clients.values()):
            await client.wait_drained()

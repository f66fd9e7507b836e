"""The hub: the top nursery. Supervises upstreams, owns the router, serves clients.

It is also the one place that executes the router's commands: ``dispatch`` turns
``ToClient`` / ``ToServer`` / ``Refresh`` / ``ControlReply`` into queued writes and
wake-ups. ``dispatch`` never blocks; backpressure is applied by readers through
``wait_writable`` between batches.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from aggregator.config import Config
from aggregator.core.catalog import Catalog
from aggregator.core.router import ControlReply, Refresh, Router, ToClient, ToServer
from aggregator.transports.outbox import Outbox
from aggregator.upstream import UpstreamSession

log = logging.getLogger(__name__)

# async def connector(server_config, *, task_status) -> str: report a Channel through
# task_status, run until the server is gone, return why.
Connector = Callable[..., Awaitable[str]]


class Hub:
    def __init__(self, config: Config, *, connector: Connector | None = None) -> None:
        self.config = config
        # How upstreams are reached; None means by their configured transport. Tests pass
        # an in-memory connector to run fake servers without processes.
        self.connector = connector
        servers = config.enabled_servers
        self.catalog = Catalog(servers, config.proxy.separator, config.proxy.page_size)
        self.router = Router(self.catalog, servers)
        self.upstreams = {server.name: UpstreamSession(self, server) for server in servers}
        self.clients: dict[int, Outbox] = {}
        self.startup_done = trio.Event()
        self._settled: set[str] = set()
        self._all_settled = trio.Event()
        self._client_keys = itertools.count(1)
        self._congested: list[Outbox] = []
        if not self.upstreams:
            self._all_settled.set()

    # --- lifetime -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every upstream concurrently and supervise them until cancelled."""
        async with trio.open_nursery() as nursery:
            for upstream in self.upstreams.values():
                nursery.start_soon(upstream.run, name=f"upstream {upstream.name}")
            nursery.start_soon(self._startup_gate)
            task_status.started(self)

    async def _startup_gate(self) -> None:
        with trio.move_on_after(self.config.proxy.startup_timeout):
            await self._all_settled.wait()
        waiting = [name for name, up in self.upstreams.items() if up.state != "ready"]
        if waiting:
            log.warning("startup: serving without %s (not ready yet; they join when ready)",
                        ", ".join(waiting))
        self.router.startup_complete = True
        self.startup_done.set()

    def server_settled(self, name: str) -> None:
        """An upstream is ready, or its first attempt failed: startup need not wait for it."""
        self._settled.add(name)
        if len(self._settled) == len(self.upstreams):
            self._all_settled.set()

    # --- clients ------------------------------------------------------------------------

    def add_client(self, outbox: Outbox) -> int:
        key = next(self._client_keys)
        self.clients[key] = outbox
        self.router.client_connected(key)
        return key

    def remove_client(self, key: int) -> None:
        self.clients.pop(key, None)
        self.dispatch(self.router.client_disconnected(key))

    # --- commands -----------------------------------------------------------------------

    def dispatch(self, commands: list[Any]) -> None:
        for command in commands:
            kind = type(command)
            if kind is ToClient:
                target = self.clients.get(command.session)
                if target is not None:
                    target.put_message(command.message)
                    if target.over_limit:
                        self._congested.append(target)
            elif kind is ToServer:
                upstream = self.upstreams[command.server]
                upstream.send(command.message)
                if upstream.outbox is not None and upstream.outbox.over_limit:
                    self._congested.append(upstream.outbox)
            elif kind is Refresh:
                self.upstreams[command.server].request_refresh(command.kind)
            elif kind is ControlReply:
                self.upstreams[command.server].control_reply(command.message)
            else:
                raise TypeError(f"cannot dispatch {command!r}")

    async def wait_writable(self) -> None:
        """Backpressure: wait until every queue this reader overfilled has drained."""
        while self._congested:
            outbox = self._congested.pop()
            await outbox.wait_writable()

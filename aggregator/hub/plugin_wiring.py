"""The plugins in place, and how they are wired around the router: at start and by a reload.

``PluginWiring`` owns which plugins are in place (``plugins``) and their ``PluginGate``
(``gate``: their hooks between the clients and the router), what the hub checks per
message (``watched``: requests plugins want answers of; ``notification_hooks``), and the
plugins' own tasks: the after_catalog task (catalog hooks run inside the core; what they
leave to do, I/O, runs here once they ran) and the shared hooks' task (``[cluster] store``:
the plugins count or keep with the other replicas through it).

There is one wiring, at start and for the plugins a reload builds (``replace``): the new
plugins' load hooks run, they take the old gate's place (taking over what it watches and
counts), the old ones' shared task ends, and their done hooks run once what they decide on
or watch is answered (``retire_plugins``), at the latest after the longest a request lasts.

It never holds the router: the gate reaches the hub through ``plugins.gate.GateHost``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from aggregator.cluster.keys import PLUGINS, KeyRing
from aggregator.cluster.store import Store
from aggregator.config import Config
from aggregator.plugins.api import Plugins
from aggregator.plugins.gate import GateHost, PluginGate
from aggregator.plugins.shared import SharedStore

log = logging.getLogger(__name__)


class PluginWiring:
    """The plugins in place, their gate, and their tasks (after_catalog, shared)."""

    def __init__(
        self, host: GateHost, plugins: Plugins, store: Store, keys: KeyRing, renew: Callable[[], None]
    ) -> None:
        """``host``: the hub, which the gate asks; ``store``: the replicas' store, which the
        shared hooks get (as ``SharedStore``: signing with ``keys``' "plugins" subkey when
        they are shared, ``renew`` building every catalog again) with ``[cluster] store``."""
        self._host = host
        self._store = SharedStore(store, keys.keys_for(PLUGINS) if keys.shared else None, renew)
        self.nursery: trio.Nursery | None = None  # the hub's, set once running
        # Catalog hooks run inside the core; what they leave to do (I/O) runs in a task here.
        self._catalog_hooks_ran = trio.Event()
        self._after_catalog_running = False
        self._wire(plugins)

    def _wire(self, plugins: Plugins, before: PluginGate | None = None) -> None:
        """Put ``plugins`` in place: their gate around the router (taking over what
        ``before``, the gate of the plugins they replace, watches and counts), the answers
        and notifications they watch, and their after_catalog task."""
        self.plugins = plugins
        plugins.catalog_changed = lambda: self._catalog_hooks_ran.set()
        self.gate = PluginGate(self._host, plugins, before)
        self.gate.nursery = self.nursery
        self.watched = self.gate.watched  # requests plugins want answers of (checked per answer)
        self.notification_hooks = plugins.watch_notifications
        self._start_after_catalog()

    def start(self, nursery: trio.Nursery) -> None:
        """Running: start the plugins' tasks in the hub's ``nursery``."""
        self.nursery = self.gate.nursery = nursery
        self._start_shared(self.plugins)
        self._start_after_catalog()

    def _start_shared(self, plugins: Plugins) -> None:
        """Run the plugins' shared hooks with the replicas' store ([cluster] store), if any."""
        if self._host.config.cluster.store is not None and plugins.shared_hooks and self.nursery is not None:
            self.nursery.start_soon(plugins.run_shared, self._store)

    def _start_after_catalog(self) -> None:
        """Start the after_catalog task once running, if the plugins have such hooks (it
        runs on for whichever plugins are in place)."""
        if self.plugins.after_catalog_hooks and self.nursery is not None and not self._after_catalog_running:
            self._after_catalog_running = True
            self.nursery.start_soon(self._after_catalog)

    def server_request_allowed(self, server: str, method: str, params: dict[str, Any]) -> bool:
        """The per-server policy for sampling, elicitation and roots requests, then plugins."""
        return self.gate.server_request_allowed(server, method, params)

    async def replace(self, plugins: Plugins) -> None:
        """Run the new plugins' load hooks, put them in place of the old ones, run the old
        ones' done hooks. A request a hook of the old ones is deciding on finishes with them."""
        await plugins.load()
        old, before = self.plugins, self.gate
        self._wire(plugins, before)
        old.stop_shared()
        self._start_shared(plugins)
        if before.in_flight(old) and self.nursery is not None:
            self.nursery.start_soon(retire_plugins, self.gate, before, old, longest_request(self._host.config))
        else:
            await old.done()

    async def _after_catalog(self) -> None:
        """Run the plugins' after_catalog hooks, outside the core, once catalog hooks ran."""
        while True:
            await self._catalog_hooks_ran.wait()
            self._catalog_hooks_ran = trio.Event()
            await self.plugins.after_catalog()


async def retire_plugins(gate: PluginGate, before: PluginGate, old: Plugins, seconds: float) -> None:
    """Run replaced plugins' done hooks once the requests they decided on or watch are
    answered (they see them through), or after ``seconds``, the longest a request lasts, or
    when the proxy stops meanwhile (``Plugins.done`` shields itself)."""
    try:
        with trio.move_on_after(seconds) as waited:
            await before.answered_all(old)
        if waited.cancelled_caught:
            log.warning("reload: requests the replaced plugins watch were not answered within %.0fs", seconds)
    finally:
        gate.forget(old)
        await old.done()


def longest_request(config: Config) -> float:
    """The longest a request to any server may last."""
    return max((max(s.request_timeout, s.max_request_timeout) for s in config.servers.values()), default=60.0)

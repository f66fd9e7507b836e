"""Servers on demand, the hub's side: the listings kept on disk (``upstreams.listing_cache``).

At start, and when a reload adds or changes one, a lazy server whose listing is cached is
given to the router as its catalog and is not started; whenever a shared server has listed
(and when it is stopped for being idle), what it lists now is written back, in a worker
thread, as its next catalog before it starts.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from aggregator.config import Config, ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import ServerCached
from aggregator.core.router import Router
from aggregator.mcp.constants import KINDS
from aggregator.upstreams import listing_cache

log = logging.getLogger("aggregator.hub.hub")


class KeptListings:
    """The cached listings of one configuration's servers."""

    def __init__(self, config: Config, *, looking: bool = False) -> None:
        self.config = config
        self.directory = listing_cache.cache_dir(config)
        self.looking = looking  # a command's one look (check, tools): every server starts

    def dormant(self, router: Router, servers: list[ServerConfig]) -> set[str]:
        """The lazy servers whose listing is cached: the router serves each one's cached
        listing as its catalog, and they are not started now (the others are, to list)."""
        dormant: set[str] = set()
        for server in servers:
            if self.config.starts_lazily(server):
                listing = listing_cache.read(self.directory, server)
                if listing is not None:
                    router.handle(ServerCached(server.name, listing))  # (no client to tell yet)
                    dormant.add(server.name)
        if dormant:
            log.info(
                "lazy: %d server(s) not started, served from their cached listings: %s",
                len(dormant),
                ", ".join(sorted(dormant)),
            )
        return dormant

    async def cached(self, server: ServerConfig) -> dict[str, list[dict[str, Any]]] | None:
        """The cached listing of ``server`` if it starts lazily (one a reload adds or
        changes), read in a worker thread; None: none kept, or it starts with the proxy."""
        if self.looking or not self.config.starts_lazily(server):
            return None
        return await trio.to_thread.run_sync(listing_cache.read, self.directory, server)

    def keep(self, nursery: trio.Nursery | None, catalog: Catalog, server: ServerConfig) -> None:
        """Keep what a shared server lists now (in a worker thread, started in ``nursery``)."""
        listing = {kind: list(catalog.items_of(server.name, kind)) for kind in KINDS}
        if nursery is not None:
            nursery.start_soon(self._write, server, listing, name=f"cache {server.name}")

    async def _write(self, server: ServerConfig, listing: dict[str, list[dict[str, Any]]]) -> None:
        await trio.to_thread.run_sync(listing_cache.write, self.directory, server, listing)

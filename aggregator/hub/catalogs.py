"""The hub's router, with a catalog per profile over one store of every server's items."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from aggregator.cluster.keys import CURSOR, REQUEST_STATE, KeyRing
from aggregator.config import Config
from aggregator.config.core_settings import router_settings
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.cursor import CursorCodec
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.router import Router
from aggregator.plugins.api import Plugins


def make_router(
    config: Config,
    plugins: Plugins,
    single_client: bool,
    server_request_policy: Callable[[str, str, dict[str, Any]], bool],
    keys: KeyRing,
) -> tuple[Router, Catalog]:
    """The router and its default catalog; each profile's catalog, and that one, share one
    store of every server's items (``single_client``: it serves stdio alone). ``keys``:
    what signs the cursors and request states (the cluster's, or this process's own)."""
    servers = config.enabled_servers
    proxy = config.proxy
    store: dict[str, Any] = {}  # every server's items, shared by the profiles' catalogs
    cursors = CursorCodec(keys.keys_for(CURSOR))

    def catalog_for(profile: str | None) -> Catalog:
        return Catalog(
            servers,
            proxy.separator,
            proxy.page_size,
            store=store,
            policy=ProfilePolicy(config, profile),
            max_name_length=proxy.max_name_length,
            charset=proxy.name_charset,
            catalog_hook=plugins.catalog_hook,
            cursors=cursors,
        )

    catalog = catalog_for(None)
    router = Router(
        catalog,
        attrs.evolve(
            router_settings(config, servers=servers, single_client=single_client),
            request_state_keys=keys.keys_for(REQUEST_STATE),
            replica=keys.replica,
            reverse_replica=keys.replica if config.cluster.enabled else "",
            share_kept_results=config.cluster.enabled and config.cluster.store is not None,
        ),
        clock=trio.current_time,
        wall_clock=time.time,  # what request states' expiry is read on, alike on every replica
        profiles={name: catalog_for(name) for name in config.profiles},
        server_request_policy=server_request_policy,
    )
    return router, catalog

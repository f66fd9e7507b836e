"""The configuration as the core sees it: ``Config`` into the core's frozen settings.

The one place where configuration objects become ``aggregator.core.settings``; the core
itself never reads a ``Config``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from aggregator.config.model import Config, DiscoveryConfig, ServerConfig
from aggregator.config.upstream_auth import acts_as_users
from aggregator.core.settings import Discovery, LinkSettings, RouterSettings


def _given(table: DiscoveryConfig) -> dict[str, Any]:
    return {key: value for key, value in attrs.asdict(table).items() if value is not None}


def discovery_settings(config: Config) -> dict[str, Discovery]:
    """Each profile's discovery settings ("default" too): [proxy.discovery] over the
    built-in defaults, then the profile's own [profiles.NAME.discovery] over that."""
    default = Discovery(**_given(config.proxy.discovery))  # (mode: checked at load to be one of Discovery's)
    profiles = {name: attrs.evolve(default, **_given(p.discovery)) for name, p in config.profiles.items()}
    return {"default": default, **profiles}


def link_settings(server: ServerConfig, config: Config | None = None) -> LinkSettings:
    """What the router needs of one configured server (of ``config``: its proxy defaults)."""
    return LinkSettings(
        server.name,
        isolation=server.isolation,
        request_timeout=server.request_timeout,
        max_request_timeout=server.max_request_timeout,
        timeout_resets_on_progress=server.timeout_resets_on_progress,
        protocol=server.protocol,
        discover_timeout=server.discover_timeout,
        per_user=acts_as_users(server),
        grants=server.auth == "oauth",
        init_timeout=server.init_timeout,
        idle_stop_after=config.idle_stop_after(server) if config is not None else 0.0,
    )


def router_settings(
    config: Config, *, servers: Iterable[ServerConfig] | None = None, single_client: bool = False
) -> RouterSettings:
    """The router's settings: ``config``'s enabled servers (or ``servers``) and proxy rules.
    ``single_client``: the proxy serves one stdio client and nothing else."""
    proxy = config.proxy
    return RouterSettings(
        servers=tuple(link_settings(s, config) for s in (config.enabled_servers if servers is None else servers)),
        server_requests=proxy.server_requests,
        roots=proxy.roots,
        list_changed_debounce=proxy.list_changed_debounce,
        max_in_flight=proxy.max_in_flight_per_session,
        input_required_timeout=proxy.input_required_timeout,
        max_parked_calls=proxy.max_parked_calls,
        max_parked_per_principal=proxy.max_parked_per_principal,
        max_json_depth=proxy.max_json_depth,
        single_client=single_client,
        discovery=discovery_settings(config),
    )

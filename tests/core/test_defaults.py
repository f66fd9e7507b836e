"""A router built with no settings behaves like one built from the default configuration.

The core's tests build routers without a Config; the hub builds one from it. Both must
get the same defaults (they once disagreed: 1024 requests in flight against 128, and
no timeout reset on progress against a reset)."""

from __future__ import annotations

import attrs
import pytest

from aggregator.config import ProxyConfig, ServerConfig, structure_config
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import ClientConnected, ClientMessage, ServerItems, ServerReady, StartupCompleted
from aggregator.core.router import LinkSettings, Router, RouterSettings, UpstreamLink
from aggregator.jsonrpc import dumps, loads
from tests.core.helpers import new_router

LINK_SETTINGS = ["request_timeout", "max_request_timeout", "timeout_resets_on_progress"]


def bare_router(servers: list) -> Router:
    return new_router(Catalog(servers, "__", 50), servers)


@pytest.mark.parametrize("setting", ["max_in_flight", "list_changed_debounce", "server_requests", "max_json_depth"])
def test_a_router_without_settings_has_those_of_the_default_proxy_config(setting):
    servers = [ServerConfig(name="a", command="x")]
    proxy = ProxyConfig()
    configured = new_router(
        Catalog(servers, "__", 50),
        servers,
        server_requests=proxy.server_requests,
        list_changed_debounce=proxy.list_changed_debounce,
        max_in_flight=proxy.max_in_flight_per_session,
        max_json_depth=proxy.max_json_depth,
    )
    assert read(bare_router(servers), setting) == read(configured, setting)


def read(router: Router, setting: str) -> object:
    """A setting where the router keeps it (the debounce is its announcements')."""
    return router.announcements.debounce if setting == "list_changed_debounce" else getattr(router, setting)


@pytest.mark.parametrize("setting", LINK_SETTINGS)
def test_a_link_without_settings_has_those_of_the_default_server_config(setting):
    assert getattr(UpstreamLink("a", "a__", "a+"), setting) == attrs.fields_dict(ServerConfig)[setting].default


@pytest.mark.parametrize("setting", LINK_SETTINGS)
def test_a_server_that_names_no_settings_gets_those_of_the_default_server_config(setting):
    config = structure_config({"servers": {"a": {"command": "x"}}}, environ={})
    bare = RouterSettings(servers=(LinkSettings("a"),))
    router = Router(Catalog(list(config.servers.values()), "__", 50), bare)
    assert getattr(router.links["a"], setting) == getattr(config.servers["a"], setting)


def test_a_session_past_the_default_limit_of_requests_in_flight_is_refused():
    servers = [ServerConfig(name="a", command="x")]
    router = bare_router(servers)
    router.handle(ServerReady("a", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("a", "tools", [{"name": "slow"}]))
    router.handle(StartupCompleted())
    router.handle(ClientConnected(1))
    router.handle(
        ClientMessage(
            1,
            dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}},
                }
            ),
        )
    )
    router.handle(ClientMessage(1, dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})))
    limit = ProxyConfig().max_in_flight_per_session
    kinds = []
    for id in range(1, limit + 2):
        [command] = router.handle(
            ClientMessage(
                1,
                dumps(
                    {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "a__slow", "arguments": {}}}
                ),
            )
        )
        kinds.append(type(command).__name__)
    assert kinds == ["ToServer"] * limit + ["ToClient"]
    refusal = loads(command.message) if type(command.message) is bytes else command.message
    assert refusal["id"] == limit + 1 and refusal["error"]["data"]["reason"] == "overloaded"

"""The protocol's names are written once (``aggregator.mcp.constants``) and every rule that
uses them reads that table: the catalog, the policy, the router, the upstream lifecycle, the
defaults and the configuration's checks."""

from __future__ import annotations

import pytest

from aggregator.config import structure_config
from aggregator.core import defaults
from aggregator.core.catalogs import catalog, policy, targets
from aggregator.core.handlers import reverse_requests
from aggregator.core.lifecycle import upstream_lifecycle
from aggregator.core.notices import announcements
from aggregator.errors import ConfigError
from aggregator.mcp import constants
from aggregator.mcp.constants import (
    CAPABILITY_OF,
    CONFIG_KIND,
    KEY_OF,
    KINDS,
    LIST_CHANGED,
    LIST_METHOD_OF,
    LIST_METHODS,
    SERVER_REQUEST_CAPABILITIES,
    SERVER_REQUESTS,
)
from aggregator.plugins import api as plugins

# What the MCP specification names, written out here by hand so that the table can be wrong.
SPEC = [
    # kind, list method, capability, list_changed notification, item key, config key
    ("tools", "tools/list", "tools", "notifications/tools/list_changed", "name", "tools"),
    ("prompts", "prompts/list", "prompts", "notifications/prompts/list_changed", "name", "prompts"),
    ("resources", "resources/list", "resources", "notifications/resources/list_changed", "uri", "resources"),
    (
        "resourceTemplates",
        "resources/templates/list",
        "resources",
        "notifications/resources/list_changed",
        "uriTemplate",
        "templates",
    ),
]


@pytest.mark.parametrize(
    ("kind", "method", "capability", "changed", "key", "config_key"), SPEC, ids=[row[0] for row in SPEC]
)
def test_each_kind_has_its_names(kind, method, capability, changed, key, config_key):
    assert kind in KINDS
    assert LIST_METHOD_OF[kind] == method
    assert LIST_METHODS[method] == kind
    assert CAPABILITY_OF[kind] == capability
    assert LIST_CHANGED[kind] == changed
    assert KEY_OF[kind] == key
    assert CONFIG_KIND[kind] == config_key


def test_every_table_covers_exactly_the_four_kinds():
    assert KINDS == tuple(row[0] for row in SPEC)
    for table in (LIST_METHOD_OF, CAPABILITY_OF, LIST_CHANGED, KEY_OF, CONFIG_KIND):
        assert set(table) == set(KINDS)
    assert set(LIST_METHODS.values()) == set(KINDS)


@pytest.mark.parametrize(
    ("method", "capability"),
    [
        ("sampling/createMessage", "sampling"),
        ("elicitation/create", "elicitation"),
        ("roots/list", "roots"),
    ],
)
def test_each_server_request_needs_its_capability(method, capability):
    assert SERVER_REQUESTS[method] == capability
    assert capability in SERVER_REQUEST_CAPABILITIES


@pytest.mark.parametrize(
    ("module", "name", "table"),
    [
        (catalog, "KINDS", "KINDS"),
        (catalog, "LIST_METHODS", "LIST_METHODS"),
        (catalog, "CAPABILITY_OF", "CAPABILITY_OF"),
        (catalog, "KEY_OF", "KEY_OF"),
        (policy, "CONFIG_KIND", "CONFIG_KIND"),
        (announcements, "LIST_CHANGED", "LIST_CHANGED"),
        (reverse_requests, "SERVER_REQUESTS", "SERVER_REQUESTS"),
        (upstream_lifecycle, "LIST_METHOD_OF", "LIST_METHOD_OF"),
        (defaults, "SERVER_REQUESTS", "SERVER_REQUEST_CAPABILITIES"),
        (plugins, "HOOKED_METHODS", "TARGETED_METHODS"),
    ],
)
def test_the_rules_read_the_one_table(module, name, table):
    """Not a copy that could drift: the very object."""
    assert getattr(module, name) is getattr(constants, table)


def test_the_router_describes_what_request_hooks_see():
    assert targets._DESCRIBED == set(constants.TARGETED_METHODS)


@pytest.mark.parametrize("capability", SERVER_REQUEST_CAPABILITIES)
def test_the_config_accepts_every_routed_server_request(capability):
    config = structure_config(
        {
            "proxy": {"server_requests": [capability]},
            "servers": {"a": {"command": "x", "server_requests": [capability]}},
        }
    )
    assert config.proxy.server_requests == (capability,)
    assert config.servers["a"].server_requests == (capability,)


def test_the_config_refuses_a_request_the_proxy_does_not_route():
    with pytest.raises(ConfigError) as caught:
        structure_config({"servers": {"a": {"command": "x", "server_requests": ["tools/call"]}}})
    expected = "servers.a.server_requests[0]: expected sampling, elicitation or roots, got 'tools/call'"
    assert expected in str(caught.value)

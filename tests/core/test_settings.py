"""The core's frozen settings (``aggregator.core.settings``) and the one adapter that builds
them from a ``Config`` (``aggregator.config.core_settings``)."""

from __future__ import annotations

import attrs
import pytest

from aggregator.config import ProxyConfig, ServerConfig, structure_config
from aggregator.config.core_settings import link_settings, router_settings
from aggregator.core import defaults
from aggregator.core.settings import LinkSettings, RouterSettings


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        (ServerConfig(name="a", command="x"), LinkSettings("a")),
        (
            ServerConfig(name="p", command="x", isolation="per-session", request_timeout=3.0),
            LinkSettings("p", isolation="per-session", request_timeout=3.0),
        ),
        (
            ServerConfig(name="b", command="x", max_request_timeout=9.0, timeout_resets_on_progress=False),
            LinkSettings("b", max_request_timeout=9.0, timeout_resets_on_progress=False),
        ),
    ],
)
def test_a_server_config_becomes_its_link_settings(server, expected):
    assert link_settings(server) == expected


@pytest.mark.parametrize(
    ("proxy", "field", "value"),
    [
        ({"max_in_flight_per_session": 7}, "max_in_flight", 7),
        ({"list_changed_debounce": 0.5}, "list_changed_debounce", 0.5),
        ({"max_json_depth": 40}, "max_json_depth", 40),
        ({"input_required_timeout": 5.0}, "input_required_timeout", 5.0),
        ({"server_requests": ["sampling"]}, "server_requests", ("sampling",)),
        ({"roots": ["file:///srv"]}, "roots", ("file:///srv",)),
    ],
)
def test_the_adapter_reads_each_proxy_setting(proxy, field, value):
    config = structure_config({"proxy": proxy, "servers": {"a": {"command": "x"}}}, environ={})
    assert getattr(router_settings(config), field) == value


def test_the_adapter_takes_the_enabled_servers_and_the_one_client_flag():
    raw = {"servers": {"a": {"command": "x"}, "off": {"command": "x", "enabled": False}}}
    config = structure_config(raw, environ={})
    settings = router_settings(config, single_client=True)
    assert [s.name for s in settings.servers] == ["a"] and settings.single_client
    assert router_settings(config, servers=[]).servers == ()


@pytest.mark.parametrize(
    ("field", "proxy_field"),
    [
        ("max_in_flight", "max_in_flight_per_session"),
        ("list_changed_debounce", "list_changed_debounce"),
        ("server_requests", "server_requests"),
        ("max_json_depth", "max_json_depth"),
        ("roots", "roots"),
        ("input_required_timeout", "input_required_timeout"),
    ],
)
def test_default_settings_are_those_of_the_default_config(field, proxy_field):
    assert getattr(RouterSettings(), field) == getattr(ProxyConfig(), proxy_field)


def test_link_defaults_come_from_the_defaults_module():
    link = LinkSettings("a")
    assert (link.request_timeout, link.max_request_timeout, link.timeout_resets_on_progress) == (
        defaults.REQUEST_TIMEOUT,
        defaults.MAX_REQUEST_TIMEOUT,
        defaults.TIMEOUT_RESETS_ON_PROGRESS,
    )


@pytest.mark.parametrize(("settings", "field"), [(LinkSettings("a"), "name"), (RouterSettings(), "max_in_flight")])
def test_settings_are_frozen(settings, field):
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(settings, field, 1)

"""Which profile a request path names, the one rule every network front uses."""

from __future__ import annotations

import pytest

from aggregator.config import structure_config
from aggregator.fronts.access import AccessPolicy


def policy(path: str = "/mcp") -> AccessPolicy:
    config = structure_config(
        {
            "http": {"path": path},
            "servers": {"a": {"command": "fake"}},
            "profiles": {"reader": {}, "work": {"tokens": ["a-token-of-sixteen-or-more-characters"]}},
        },
        environ={},
    )
    return AccessPolicy(config.http, config.profiles)


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("/mcp", ""),
        ("/mcp?x=1", ""),
        ("/mcp/reader", "reader"),
        ("/mcp/work?session=1", "work"),
        ("/mcp/", None),  # no profile is named ""
        ("/mcp/nope", None),  # not configured
        ("/mcp/reader/", None),
        ("/mcp/reader/x", None),
        ("/mcpreader", None),
        ("/mcp/../mcp", None),
        ("/MCP", None),
        ("/", None),
        ("", None),
        ("?/mcp", None),
    ],
)
def test_the_profile_a_path_names(target, named):
    assert policy().named_profile(target) == named


def test_another_endpoint_path_moves_the_profiles_with_it():
    assert policy("/api/mcp").named_profile("/api/mcp/reader") == "reader"
    assert policy("/api/mcp").named_profile("/mcp/reader") is None
    assert policy("/api/mcp").named_profile("/api/mcp") == ""


def test_an_allowed_host_or_origin_given_with_a_port_matches_that_host_on_any_port():
    config = structure_config(
        {"http": {"allowed_hosts": ["Example.com:8443"], "allowed_origins": ["https://example.com:8443/"]}},
        environ={},
    )
    access = AccessPolicy(config.http)
    assert access.refusal({"host": "example.com:8443", "origin": "https://example.com:8443"}) is None
    assert access.refusal({"host": "example.com"}) is None
    assert access.refusal({"host": "evil.example"})[0] == 421
    assert access.refusal({"host": "example.com", "origin": "https://evil.example"})[0] == 403

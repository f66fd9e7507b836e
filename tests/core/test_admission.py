"""The admission path every network front takes (Streamable HTTP, legacy SSE, WebSocket):
Host and Origin against their allowlists, the bearer token, the principal it names, and
the profile the session gets. Pure: no sockets; each row is one request's headers and
path, and what it gets."""

from __future__ import annotations

import logging

import pytest

from aggregator.config import structure_config
from aggregator.fronts.access import AccessPolicy, Admitted, Denial, admit, check_access, choose_profile

DEFAULT_TOKEN = "a-default-token-of-sixteen-characters"
WORK_TOKEN = "a-work-token-of-sixteen-characters"
OTHER_TOKEN = "an-other-token-of-sixteen-characters"


def policy(tokens: bool) -> AccessPolicy:
    """Profiles ``reader`` (no tokens of its own) and ``work`` (its own token); with
    ``tokens``, a default token and one for each of the two token-bearing profiles."""
    profiles = {"reader": {}, "work": {"tokens": [WORK_TOKEN]}, "other": {"tokens": [OTHER_TOKEN]}}
    http = {"auth_tokens": [DEFAULT_TOKEN]} if tokens else {}
    if not tokens:
        profiles = {"reader": {}, "work": {}}
    config = structure_config({"http": http, "servers": {"a": {"command": "fake"}}, "profiles": profiles}, environ={})
    return AccessPolicy(config.http, config.profiles)


def headers(host: str = "127.0.0.1:8000", token: str | None = None, **more: str) -> dict[str, str]:
    found = {"host": host, **more}
    if token is not None:
        found["authorization"] = f"Bearer {token}"
    return found


# (what, tokens configured, request headers, path, expected: (principal, profile) or status)
CASES = [
    ("loopback, no tokens", False, headers(), "/mcp", (None, "default")),
    ("localhost with any port", False, headers("localhost:1"), "/mcp", (None, "default")),
    ("IPv6 loopback", False, headers("[::1]:9"), "/mcp", (None, "default")),
    ("a profile's path, no tokens", False, headers(), "/mcp/reader", (None, "reader")),
    ("a query is ignored", False, headers(), "/mcp/work?x=1", (None, "work")),
    ("a foreign Host (DNS rebinding)", False, headers("evil.example"), "/mcp", 421),
    ("no Host at all", False, {}, "/mcp", 421),
    ("a Host with a non-ASCII port", False, headers("127.0.0.1:\xb2"), "/mcp", 421),
    ("a foreign Origin", False, headers(origin="http://evil.example"), "/mcp", 403),
    ("a loopback Origin", False, headers(origin="http://localhost:3000"), "/mcp", (None, "default")),
    ("Host is checked before the path", False, headers("evil.example"), "/nowhere", 421),
    ("an unknown path", False, headers(), "/nowhere", 404),
    ("an unconfigured profile", False, headers(), "/mcp/nope", 404),
    ("tokens configured, none sent", True, headers(), "/mcp", 401),
    ("a wrong token", True, headers(token="not-a-token-of-ours-at-all"), "/mcp", 401),
    ("a scheme other than Bearer", True, headers(authorization=f"Basic {DEFAULT_TOKEN}"), "/mcp", 401),
    ("the token is checked before the path", True, headers(), "/nowhere", 401),
    ("the default token", True, headers(token=DEFAULT_TOKEN), "/mcp", (0, "default")),
    ("a profile's token selects it", True, headers(token=WORK_TOKEN), "/mcp", (1, "work")),
    ("a profile's token on its path", True, headers(token=WORK_TOKEN), "/mcp/work", (1, "work")),
    ("a profile's token on another's path", True, headers(token=WORK_TOKEN), "/mcp/other", 403),
    ("the default token on a profile's path", True, headers(token=DEFAULT_TOKEN), "/mcp/work", 403),
    ("a profile without tokens, by path", True, headers(token=DEFAULT_TOKEN), "/mcp/reader", 403),
    ("Origin is checked before the token", True, headers(origin="http://evil.example"), "/mcp", 403),
]


@pytest.mark.parametrize(("what", "tokens", "request_headers", "path", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_the_admission_path(what, tokens, request_headers, path, expected):
    admitted = await admit(policy(tokens), request_headers, path)
    if isinstance(expected, int):
        assert isinstance(admitted, Denial), what
        assert admitted.status == expected, admitted
        assert admitted.reason and DEFAULT_TOKEN not in admitted.reason and WORK_TOKEN not in admitted.reason
    else:
        assert admitted == Admitted(*expected)


async def test_a_missing_token_says_how_to_authenticate():
    denial = await check_access(policy(True), headers())
    assert denial == Denial(
        401, "a valid bearer token is required", [("www-authenticate", 'Bearer realm="aggregator"')], logging.WARNING
    )


async def test_a_path_outside_the_endpoint_names_it():
    denial = await admit(policy(False), headers(), "/elsewhere")
    assert denial == Denial(404, "not found; the MCP endpoint is /mcp", [], logging.DEBUG)


@pytest.mark.parametrize(
    ("token", "named", "expected"),
    [
        (None, "", (None, "default")),  # legacy SSE without tokens: no profile path
        (WORK_TOKEN, "", (1, "work")),  # the token's profile when the path names none
        (WORK_TOKEN, "work", (1, "work")),
        (OTHER_TOKEN, "work", 403),
    ],
)
def test_choosing_the_profile_after_the_access_check(token, named, expected):
    chosen = choose_profile(policy(token is not None), headers(token=token), named)
    if isinstance(expected, int):
        assert isinstance(chosen, Denial) and chosen.status == expected
        assert chosen.reason == f"this token does not give access to profile {named!r}"
        assert chosen.level == logging.DEBUG  # a client at the wrong place, not a probe
    else:
        assert chosen == Admitted(*expected)


def test_every_front_takes_this_path():
    """No front decides who gets in by itself: the access rules are reached only here."""
    from pathlib import Path

    root = Path(__file__).parents[2] / "aggregator"
    fronts = [
        "fronts/http/endpoint.py",
        "fronts/http/exchange.py",
        "fronts/http/legacy_sse.py",
        "fronts/websocket/endpoint.py",
    ]
    for name in fronts:
        source = (root / name).read_text()
        assert ".refusal(" not in source and ".profile(" not in source, name
        assert "check_access(" in source or "choose_profile(" in source or "admit(" in source, name

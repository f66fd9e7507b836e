"""[auth] and the profiles an access token chooses: every problem with its key path, and
what the proxy tells clients (the metadata and the challenges). Pure: nothing is fetched."""

from __future__ import annotations

import pytest

from aggregator.config import structure_config
from aggregator.config.changes import plan_changes
from aggregator.errors import ConfigError
from aggregator.fronts.authorization import Principal, challenge, metadata_document, metadata_paths, metadata_url
from aggregator.fronts.authorization.principal import matching_profiles, scopes_of, who

SERVERS = {"a": {"command": "fake"}}
GOOD = {"resource": "https://mcp.example.com/mcp", "issuers": [{"issuer": "https://login.example.com/realm"}]}


def load(auth=None, profiles=None):
    raw = {"servers": SERVERS, **({"auth": auth} if auth is not None else {})}
    return structure_config({**raw, **({"profiles": profiles} if profiles else {})}, environ={"SECRET": "s" * 20})


def problems(auth=None, profiles=None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(auth, profiles)
    return caught.value.problems


CASES = [
    ({**GOOD, "resource": "http://mcp.example.com/mcp"}, "auth.resource: must be https"),
    ({**GOOD, "resource": "https://mcp.example.com/mcp#x"}, "auth.resource: must not have a fragment"),
    ({**GOOD, "resource": "mcp"}, "auth.resource: expected an absolute https URL"),
    ({"resource": GOOD["resource"]}, "auth.issuers: at least one [[auth.issuers]] is needed"),
    ({"issuers": GOOD["issuers"]}, "auth.resource: required with auth.issuers"),
    ({**GOOD, "issuers": [{"issuer": "ftp://x"}]}, "auth.issuers[0].issuer: expected an absolute https URL"),
    ({**GOOD, "issuers": [{}]}, "auth.issuers[0].issuer: required"),
    ({**GOOD, "issuers": GOOD["issuers"] * 2}, "auth.issuers[1].issuer: given twice"),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "algorithms": ["HS256"]}]}, "auth.issuers[0].algorithms[0]: 'HS256'"),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "algorithms": ["none"]}]}, "never: it would accept unsigned tokens"),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "algorithms": []}]}, "auth.issuers[0].algorithms: at least one"),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "client_id": "x"}]}, "client_id and client_secret go together"),
    (
        {**GOOD, "issuers": [{**GOOD["issuers"][0], "client_id": "x", "client_secret": "${SECRET}"}]},
        "auth.issuers[0].introspection_endpoint: required with client_id and client_secret",
    ),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "jwks_uri": "http://keys.example"}]}, "auth.issuers[0].jwks_uri:"),
    ({**GOOD, "issuers": [{**GOOD["issuers"][0], "colour": 1}]}, "auth.issuers[0].colour: unknown key"),
    ({**GOOD, "leeway": -1}, "auth.leeway: must be a finite number of seconds from 0 to 3600"),
    ({**GOOD, "fetch_timeout": 0}, "auth.fetch_timeout: must be"),
    ({**GOOD, "required_scopes": ["a b"]}, "auth.required_scopes[0]: a scope is"),
    ({**GOOD, "resorce": "x"}, "auth.resorce: unknown key; did you mean `resource`?"),
]


@pytest.mark.parametrize(("auth", "expected"), CASES, ids=[case[1] for case in CASES])
def test_auth_problems_are_reported_by_key_path(auth, expected):
    found = problems(auth)
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    ("issuers", "got"),
    [("https://login.example.com/realm", "the string"), ({"issuer": "https://login.example.com/realm"}, "a table")],
)
def test_issuers_given_other_than_as_an_array_of_tables_is_one_problem(issuers, got):
    found = problems({**GOOD, "issuers": issuers})
    assert len(found) == 1, found
    assert found[0].startswith("auth.issuers: expected an array of tables ([[auth.issuers]]), got " + got), found


def test_profiles_chosen_by_a_token_need_auth():
    found = problems(None, {"admins": {"match": {"groups": ["x"]}, "scopes": ["y"]}})
    assert found == [
        "profiles.admins.match: chooses by an access token; needs [auth] (auth.resource)",
        "profiles.admins.scopes: chooses by an access token; needs [auth] (auth.resource)",
    ]
    bad = problems(GOOD, {"admins": {"match": {"groups": [3]}}})
    assert bad == ["profiles.admins.match.groups: expected a string or a non-empty list of strings, got a list"]


def test_a_good_table_loads_and_its_secret_is_not_in_its_repr():
    issuer = {
        "issuer": "https://login.example.com/realm",
        "introspection_endpoint": "https://login.example.com/realm/introspect",
        "client_id": "proxy",
        "client_secret": "${SECRET}",
    }
    config = load({**GOOD, "issuers": [issuer]}, {"admins": {"match": {"groups": "admins"}}})
    assert config.auth.enabled and config.auth.issuers[0].client_secret == "s" * 20
    assert "s" * 20 not in repr(config)
    assert config.profiles["admins"].match == {"groups": ("admins",)}
    assert load().auth.enabled is False


def test_auth_and_what_chooses_a_profile_take_a_restart():
    running = load(GOOD, {"admins": {"match": {"groups": ["a"]}}})
    loaded = load({**GOOD, "leeway": 5.0}, {"admins": {"match": {"groups": ["b"]}}})
    changes = plan_changes(running, loaded)
    assert set(changes.needs_restart) == {"auth", "profiles.admins.match"}
    assert changes.effective.auth == running.auth
    assert changes.effective.profiles["admins"].match == {"groups": ("a",)}


def test_the_metadata_and_the_challenges():
    auth = load({**GOOD, "scopes_supported": ["mcp", "admin"], "required_scopes": ["mcp"]}).auth
    assert metadata_url(auth) == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    assert metadata_paths(auth, "/mcp") == {
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    }
    assert metadata_document(auth) == {
        "resource": "https://mcp.example.com/mcp",
        "authorization_servers": ["https://login.example.com/realm"],
        "scopes_supported": ["mcp", "admin"],
        "bearer_methods_supported": ["header"],
    }
    assert challenge(auth) == (
        'Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", scope="mcp"'
    )
    assert challenge(auth, "invalid_token", 'the "token" has expired') == (
        'Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", scope="mcp",'
        ' error="invalid_token", error_description="the ?token? has expired"'
    )


def test_which_profiles_a_tokens_claims_match():
    profiles = load(
        GOOD,
        {
            "readers": {},  # no rules: never chosen by a token
            "admins": {"match": {"groups": ["admins"], "tenant": ["t1"]}, "scopes": ["admin"]},
            "staff": {"match": {"groups": ["staff", "admins"]}},
            "scoped": {"scopes": ["write"]},
        },
    ).profiles
    admin = {"groups": ["admins"], "tenant": "t1"}
    assert matching_profiles(admin, frozenset({"admin"}), profiles) == ("admins", "staff")
    assert matching_profiles(admin, frozenset(), profiles) == ("staff",)
    assert matching_profiles({"groups": "staff"}, frozenset({"write"}), profiles) == ("staff", "scoped")
    assert matching_profiles({"groups": [3, True]}, frozenset(), profiles) == ()
    assert scopes_of({"scope": "a  b"}) == {"a", "b"} and scopes_of({"scp": ["c"]}) == {"c"} and not scopes_of({})


def test_a_principal_is_its_issuer_and_subject():
    one = Principal(issuer="https://i", subject="alice", scopes=frozenset({"a"}), profiles=("x",), expires=1.0)
    two = Principal(issuer="https://i", subject="alice", scopes=frozenset({"b", "c"}), expires=9.0)
    assert one == two and hash(one) == hash(two) and repr(one) == repr(two)
    assert one.profile == "x" and two.profile == "default"
    assert who(one) == "alice (https://i)" and who(3) == "token 3" and who(None) == "anonymous"


def test_check_says_how_the_admin_paths_are_opened():
    from aggregator.ops.admin import admin_access

    assert admin_access(load()) is None  # no [auth]: the static tokens, as the MCP endpoint
    assert load(GOOD).auth.admin_scopes == ("aggregator:admin",)
    said = admin_access(load(GOOD))
    assert said is not None and "needs the scope aggregator:admin (auth.admin_scopes)" in said
    assert "any token the MCP endpoint accepts" in str(admin_access(load({**GOOD, "admin_scopes": []})))
    assert "auth.admin_scopes[0]: a scope is" in problems({**GOOD, "admin_scopes": ["a b"]})[0]

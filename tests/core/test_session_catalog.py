"""The per-session view of the catalog (``aggregator.core.catalogs.session_catalog``): what a session
sees once its own per-session connections have listed. Table-driven, pure.

The reference for every case is a catalog built from scratch over the session's store (its
own listings in place of those servers' shared ones): the view must show and route exactly
what that catalog does, composed over the shared catalog without copying it while nothing
collides, and built in full when something does.
"""

from __future__ import annotations

import tomllib
from collections import ChainMap

import pytest

from aggregator.config import structure_config
from aggregator.core.catalogs.catalog import KINDS, RESOURCES, TEMPLATES, TOOLS, Catalog
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.catalogs.session_catalog import SessionCatalog
from aggregator.core.catalogs.uris import InvalidUri
from aggregator.jsonrpc import loads
from aggregator.jsonrpc.errors import RemoteProtocolError
from aggregator.plugins.api import Plugins

PAGE = 2

P_SHARED = {
    "tools": [{"name": "echo"}, {"name": "trigger-sampling"}],
    "prompts": [{"name": "hello"}],
    "resources": [{"uri": "demo://static/1"}],
    "resourceTemplates": [{"uriTemplate": "demo://dyn/{id}"}],
}
P_OWN = {
    "tools": [{"name": "echo"}, {"name": "gzip", "description": "made by this session's server"}],
    "prompts": [{"name": "hello"}],
    "resources": [{"uri": "demo://static/1"}, {"uri": "demo://session/a.gz"}],
    "resourceTemplates": [{"uriTemplate": "demo://dyn/{id}"}],
}
A = {"tools": [{"name": "time"}], "resources": [{"uri": "clock://now"}]}
C = {
    "tools": [{"name": "status"}, {"name": "log"}],
    "prompts": [{"name": "commit"}],
    "resourceTemplates": [{"uriTemplate": "repo://{path}"}],
}


class DropSecrets:
    """A catalog hook that hides items whose name or URI mentions "secret"."""

    def catalog(self, profile, kind, items):
        return [item for item in items if "secret" not in str(item)]


def servers_toml(*names: str, **extra: str) -> str:
    return "".join(f'[servers.{name}]\ncommand = "x"\n{extra.get(name, "")}\n' for name in names)


# name: (config TOML, shared store, own listings, expected way: "composed" or "full", plugins)
CASES = {
    "prefixed servers": (servers_toml("a", "p", "c"), {"a": A, "p": P_SHARED, "c": C}, {"p": P_OWN}, "composed", None),
    "own server first": (servers_toml("p", "a", "c"), {"a": A, "p": P_SHARED, "c": C}, {"p": P_OWN}, "composed", None),
    "own server last": (servers_toml("a", "c", "p"), {"a": A, "p": P_SHARED, "c": C}, {"p": P_OWN}, "composed", None),
    "own server lists kinds its shared listing lacks, and lacks some": (
        servers_toml("a", "p", "c"),
        {"a": A, "p": {"tools": [{"name": "echo"}]}, "c": C},
        {"p": {"prompts": [{"name": "hello"}], "resources": [{"uri": "demo://session/a.gz"}]}},
        "composed",
        None,
    ),
    "no shared listing of the own server at all": (
        servers_toml("a", "p", "c"),
        {"a": A, "c": C},
        {"p": P_OWN},
        "composed",
        None,
    ),
    "two own servers": (
        servers_toml("a", "p", "q", "c"),
        {"a": A, "p": P_SHARED, "q": P_SHARED, "c": C},
        {"p": P_OWN, "q": {"tools": [{"name": "only-q"}]}},
        "composed",
        None,
    ),
    "policy hides some own items": (
        servers_toml(
            "a", "p", "c", p='[servers.p.tools]\ndeny = ["gzip"]\n[servers.p.resources]\ndeny = ["demo://session/*"]\n'
        ),
        {"a": A, "p": P_SHARED, "c": C},
        {"p": P_OWN},
        "composed",
        None,
    ),
    "names that collide within the own server": (
        servers_toml("a", "p"),
        {"a": A, "p": P_SHARED},
        {"p": {"tools": [{"name": "a/b"}, {"name": "a_b"}, {"name": "a b"}]}},
        "composed",
        None,
    ),
    "the only unprefixed server is own": (
        servers_toml("a", "p", p='uri_prefix = ""\n'),
        {"a": A, "p": P_SHARED},
        {"p": P_OWN},
        "composed",
        None,
    ),
    "an own item takes another server's name": (
        servers_toml("p", "c", p='prefix = ""\n', c='prefix = ""\n'),
        {"p": P_SHARED, "c": {"tools": [{"name": "gzip"}, {"name": "status"}]}},
        {"p": P_OWN},
        "full",
        None,
    ),
    "another server takes an own item's name first": (
        servers_toml("c", "p", p='prefix = ""\n', c='prefix = ""\n'),
        {"p": P_SHARED, "c": {"tools": [{"name": "gzip"}]}},
        {"p": P_OWN},
        "full",
        None,
    ),
    "the shared listing of the own server won a collision the own one does not have": (
        servers_toml("p", "c", p='prefix = ""\n', c='prefix = ""\n'),
        {"p": P_SHARED, "c": {"tools": [{"name": "trigger-sampling"}]}},
        {"p": P_OWN},
        "full",
        None,
    ),
    "own and another server list one URI": (
        servers_toml("p", "c", p='uri_prefix = ""\n', c='uri_prefix = ""\n'),
        {"p": P_SHARED, "c": {"resources": [{"uri": "demo://session/a.gz"}]}},
        {"p": P_OWN},
        "full",
        None,
    ),
    "own and another server list one template": (
        servers_toml("c", "p", p='uri_prefix = ""\n', c='uri_prefix = ""\n'),
        {"p": {}, "c": {"resourceTemplates": [{"uriTemplate": "demo://dyn/{id}"}]}},
        {"p": P_OWN},
        "full",
        None,
    ),
    "two own servers collide": (
        servers_toml("p", "q", p='prefix = ""\n', q='prefix = ""\n'),
        {"p": P_SHARED, "q": P_SHARED},
        {"p": P_OWN, "q": {"tools": [{"name": "gzip"}]}},
        "full",
        None,
    ),
    "catalog plugins see whole lists": (
        servers_toml("a", "p", "c"),
        {"a": A, "p": P_SHARED, "c": {"tools": [{"name": "secret-c"}]}},
        {"p": {"tools": [{"name": "secret-p"}, {"name": "open"}]}},
        "full",
        Plugins([DropSecrets()]),
    ),
}


def build(case: str):
    text, shared_store, own, way, plugins = CASES[case]
    config = structure_config(tomllib.loads(text))
    servers = config.enabled_servers
    policy = ProfilePolicy(config, None)
    store = {name: dict(kinds) for name, kinds in shared_store.items()}
    shared = Catalog(
        servers, "__", PAGE, store=store, policy=policy, catalog_hook=plugins.catalog_hook if plugins else None
    )
    for kind in KINDS:
        shared.rebuild(kind)
    return servers, policy, plugins, store, shared, own, way


def reference(servers, policy, plugins, shared_store, own):
    """A catalog built from scratch over what the session should see."""
    catalog = Catalog(
        servers,
        "__",
        PAGE,
        store=ChainMap(own, shared_store),
        policy=policy,
        catalog_hook=plugins.catalog_hook if plugins else None,
    )
    for kind in KINDS:
        catalog.rebuild(kind)
    return catalog


def pages(catalog, kind):
    items, cursor = [], None
    for _ in range(50):
        page = loads(catalog.page(kind, cursor))
        items += page[kind]
        cursor = page.get("nextCursor")
        if cursor is None:
            return items
    raise AssertionError("pagination does not end")


def route_uri(catalog, uri):
    try:
        return catalog.route_uri(uri)
    except InvalidUri as exc:
        return f"invalid: {exc}"


def assert_same(view: SessionCatalog, expected: Catalog, shared: Catalog) -> None:
    for kind in KINDS:
        assert view.visible(kind) == expected.exposed[kind], kind
        assert pages(view, kind) == expected.exposed[kind], kind
    names = {*expected.tools, *shared.tools, *expected.prompts, *shared.prompts, "nope", "p__nope"}
    for name in names:
        assert view.tools.get(name) == expected.tools.get(name), name
        assert view.prompts.get(name) == expected.prompts.get(name), name
        assert (name in view.tools) == (name in expected.tools)
    uris = {
        *expected.resources,
        *shared.resources,
        "p+demo://unlisted/9",
        "demo://unlisted/9",
        "p+demo://dyn/7",
        "demo://dyn/7",
        "c+repo://x",
        "repo://x",
        "clock://now",
        "a+clock://now",
    }
    for uri in uris:
        assert route_uri(view, uri) == route_uri(expected, uri), uri
    for template in {item["uriTemplate"] for catalog in (expected, shared) for item in catalog.exposed[TEMPLATES]}:
        assert view.route_template(template) == expected.route_template(template), template


@pytest.mark.parametrize("case", CASES)
def test_a_view_shows_and_routes_what_a_catalog_built_over_its_store_would(case):
    servers, policy, plugins, store, shared, own, way = build(case)
    view = SessionCatalog(shared)
    assert_same(view, shared, shared)  # nothing of its own yet: the profile's catalog
    for server, listing in own.items():
        view.set_listing(server, listing)
    assert_same(view, reference(servers, policy, plugins, store, own), shared)
    # Composed means no copy of the shared catalog: nothing but the own listings' tables.
    assert (view._full is None) == (way == "composed")
    # Dropping its own servers brings the shared listing back, exactly.
    for server in own:
        view.drop(server)
    assert not view.own
    assert_same(view, shared, shared)


def visible(view):
    return {kind: view.visible(kind) for kind in KINDS}


# Steps: ("listing", server, listing) | ("own", server, kind, items) | ("shared", server, kind, items)
#        | ("drop", server)
STEPS = {
    "prefixed servers": [
        ("listing", "p", P_OWN),
        ("shared", "a", TOOLS, [{"name": "time"}, {"name": "zone"}]),  # another server: seen
        ("shared", "p", TOOLS, [{"name": "echo"}, {"name": "new-in-shared"}]),  # hidden behind its own
        ("own", "p", RESOURCES, P_OWN["resources"] + [{"uri": "demo://session/b.gz"}]),
        ("own", "p", RESOURCES, P_OWN["resources"] + [{"uri": "demo://session/b.gz"}]),  # the same again
        ("shared", "c", TOOLS, C["tools"]),  # unchanged
        ("shared", "a", RESOURCES, []),
        ("drop", "p"),
    ],
    "an own item takes another server's name": [
        ("listing", "p", P_OWN),
        ("shared", "c", TOOLS, [{"name": "status"}]),  # the collision is gone: composed again
        ("own", "p", TOOLS, [{"name": "status"}]),  # and back
        ("shared", "c", TOOLS, [{"name": "status"}, {"name": "log"}]),
        ("own", "p", TOOLS, [{"name": "other"}]),
        ("drop", "p"),
    ],
    "the shared listing of the own server won a collision the own one does not have": [
        ("listing", "p", P_OWN),
        ("shared", "p", TOOLS, [{"name": "echo"}]),  # no longer contested
        ("shared", "c", TOOLS, [{"name": "trigger-sampling"}, {"name": "echo"}]),
        ("drop", "p"),
    ],
}


@pytest.mark.parametrize("case", STEPS)
def test_each_change_reports_exactly_the_kinds_the_session_sees_change(case):
    servers, policy, plugins, store, shared, _own, _way = build(case)
    view = SessionCatalog(shared)
    own: dict = {}
    for step in STEPS[case]:
        before, was_full = visible(view), view._full is not None
        if step[0] == "listing":
            own[step[1]] = dict(step[2])
            reported = view.set_listing(step[1], step[2])
        elif step[0] == "own":
            own[step[1]][step[2]] = step[3]
            reported = view.set_items(step[1], step[2], step[3])
        elif step[0] == "shared":
            reported = view.shared_changed(step[1], step[2], shared.set_items(step[1], step[2], step[3]))
        else:
            del own[step[1]]
            reported = view.drop(step[1])
        after = visible(view)
        changed = [kind for kind in KINDS if before[kind] != after[kind]]
        assert set(changed) <= set(reported), step
        if was_full == (view._full is not None) or step[0] != "shared":
            assert reported == changed, step  # exact, but when a collision comes or goes
        assert_same(view, reference(servers, policy, plugins, store, own), shared)


def test_cursors_are_the_views_own():
    *_, shared, own, _way = build("prefixed servers")
    view = SessionCatalog(shared)
    view.set_listing("p", own["p"])
    first = loads(view.page(TOOLS, None))
    assert len(first[TOOLS]) == PAGE and "nextCursor" in first
    stale = first["nextCursor"]
    assert loads(view.page(TOOLS, stale))[TOOLS]  # valid while nothing changed
    shared_cursor = loads(shared.page(TOOLS, None))["nextCursor"]
    with pytest.raises(RemoteProtocolError, match="list changed"):
        view.page(TOOLS, shared_cursor)  # the profile's list is another list
    view.set_items("p", TOOLS, [{"name": "echo"}])
    with pytest.raises(RemoteProtocolError, match="list changed"):
        view.page(TOOLS, stale)
    other = SessionCatalog(shared)
    other.set_listing("p", own["p"])
    with pytest.raises(RemoteProtocolError, match="list changed"):
        other.page(TOOLS, loads(view.page(TOOLS, None))["nextCursor"])


def test_a_view_keeps_no_copy_of_the_shared_items():
    *_, shared, own, _way = build("prefixed servers")
    view = SessionCatalog(shared)
    view.set_listing("p", own["p"])
    shared_items = {id(item) for kind in KINDS for item in shared.exposed[kind]}
    held = [item for catalog in view.own.values() for kind in KINDS for item in catalog.exposed[kind]]
    assert held and not any(id(item) in shared_items for item in held)
    # What it shows of the other servers is the shared catalog's own objects.
    assert any(id(item) in shared_items for item in view.visible(TOOLS))

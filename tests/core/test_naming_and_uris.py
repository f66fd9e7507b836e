"""Exposed names and the reversible URI rewrite, including RFC 3986 / 6570 properties."""

import re

from hypothesis import given
from hypothesis import strategies as st

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.naming import MAX_NAME, expose_name
from aggregator.core.catalogs.uris import expose_uri, split_uri, template_matches

LEGAL = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# RFC 3986: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def test_prefix_and_separator():
    assert expose_name("git", "__", "git_status") == "git__git_status"
    assert expose_name("", "__", "echo") == "echo"
    assert expose_name("a", ".", "b") == "a.b"


def test_illegal_names_become_legal():
    assert expose_name("s", "__", "demo/read") == "s__demo_read"
    assert expose_name("s", "__", "has space") == "s__has_space"
    assert LEGAL.fullmatch(expose_name("s", "__", "ü" * 300))


@given(st.text(min_size=1, max_size=300), st.sampled_from(["", "srv", "x" * 100]))
def test_exposed_names_are_always_legal(name, prefix):
    assert LEGAL.fullmatch(expose_name(prefix, "__", name))


def test_long_names_differ_by_hash():
    a = expose_name("s", "__", "x" * 200 + "a")
    b = expose_name("s", "__", "x" * 200 + "b")
    assert len(a) == len(b) == MAX_NAME and a != b


def test_uri_rewrite_round_trip():
    prefixes = {"everything": "everything", "my-db": "my_db"}
    for uri in [
        "demo://resource/static/document/a.md",
        "file:///etc/hosts",
        "svn+ssh://h/x",
        "urn:isbn:0451450523",
        "data:text/plain,hi",
    ]:
        exposed = expose_uri("everything", uri)
        assert SCHEME.fullmatch(exposed.split(":", 1)[0])
        assert split_uri(exposed, prefixes) == ("everything", uri)
        assert split_uri(exposed.replace("everything", "EveryThing", 1), prefixes) == ("everything", uri)
    assert split_uri("my-db+postgres://x", prefixes) == ("my_db", "postgres://x")
    assert split_uri("demo://x", prefixes) is None
    assert split_uri("other+demo://x", prefixes) is None
    assert split_uri("demo://a+b", prefixes) is None


schemes = st.from_regex(SCHEME, fullmatch=True).filter(lambda s: len(s) < 20)
rests = st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x00"), max_size=40)


@given(schemes, rests, st.from_regex(r"[a-z][a-z0-9.-]{0,10}", fullmatch=True))
def test_any_uri_round_trips_and_stays_a_valid_scheme(scheme, rest, prefix):
    uri = f"{scheme}:{rest}"
    exposed = expose_uri(prefix, uri)
    assert SCHEME.fullmatch(exposed.split(":", 1)[0])
    assert split_uri(exposed, {prefix: "srv"}) == ("srv", uri)


# RFC 6570: an expression is "{" [operator] varname *("," varname) "}".
EXPRESSION = st.builds(
    lambda op, names: "{" + op + ",".join(names) + "}",
    st.sampled_from(["", "+", "#", ".", "/", ";", "?", "&"]),
    st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=3),
)
LITERAL = st.text(alphabet="abc/:-._~%20", max_size=8)


@given(st.lists(st.one_of(EXPRESSION, LITERAL), min_size=1, max_size=6), schemes)
def test_templates_stay_valid_and_reverse(parts, scheme):
    template = f"{scheme}://" + "".join(parts)
    exposed = expose_uri("everything", template)
    # Still a template: the prefix only adds literal characters before the original.
    assert exposed.endswith(template) and "{" not in exposed[: -len(template)]
    assert split_uri(exposed, {"everything": "e"}) == ("e", template)


def test_template_matching():
    assert template_matches("demo://resource/dynamic/text/{id}", "demo://resource/dynamic/text/7")
    assert template_matches("fake://doc/{id}", "fake://doc/")
    assert template_matches("a/{x}/b/{y}", "a/1/b/2")
    assert not template_matches("a/{x}/b/{y}", "a/1/c/2")
    assert not template_matches("demo://x/{id}", "other://x/1")
    assert template_matches("plain", "plain") and not template_matches("plain", "plain2")


def server(name, **kw):
    return ServerConfig(name=name, command="x", **kw)


def test_catalog_resolves_collisions_deterministically():
    catalog = Catalog([server("a", prefix=""), server("b", prefix="")], "__", 10)
    catalog.set_items("b", "tools", [{"name": "search"}])
    catalog.set_items("a", "tools", [{"name": "search"}, {"name": "search"}])
    names = [t["name"] for t in catalog.exposed["tools"]]
    # a comes first in the config: it keeps the plain name whatever order they joined in.
    assert names[0] == "search" and catalog.tools["search"].server == "a"
    assert len(names) == 2 and names[1].startswith("search_")
    assert catalog.tools[names[1]] == ("b", "search")
    assert catalog.collisions["tools"]


def test_catalog_sanitised_names_do_not_collide():
    catalog = Catalog([server("s")], "__", 10)
    catalog.set_items("s", "tools", [{"name": "demo/read"}, {"name": "demo_read"}, {"name": "x" * 200}])
    names = [t["name"] for t in catalog.exposed["tools"]]
    assert len(set(names)) == 3 and all(LEGAL.fullmatch(n) for n in names)
    assert {catalog.tools[n].original for n in names} == {"demo/read", "demo_read", "x" * 200}


def test_separator_injection_routes_each_to_its_own_server():
    catalog = Catalog([server("A"), server("B")], "__", 10)
    catalog.set_items("A", "tools", [{"name": "B__x"}])
    catalog.set_items("B", "tools", [{"name": "x"}])
    assert catalog.tools["A__B__x"] == ("A", "B__x")
    assert catalog.tools["B__x"] == ("B", "x")


def test_unprefixed_resources_route_by_listing_and_template():
    catalog = Catalog([server("a", prefix=""), server("b", prefix="")], "__", 10)
    catalog.set_items("a", "resources", [{"uri": "file:///a"}])
    catalog.set_items("b", "resourceTemplates", [{"uriTemplate": "db://{table}"}])
    catalog.set_items("a", "resourceTemplates", [])
    assert catalog.route_uri("file:///a") == ("a", "file:///a")
    assert catalog.route_uri("db://users") == ("b", "db://users")
    assert catalog.route_uri("nowhere://x") is None

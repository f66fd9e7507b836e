"""URIs in normal form: one spelling per URI for policy and routing (RFC 3986 §6.2.2).

Every spelling of a hidden URI is refused on every method that takes one (read,
subscribe, unsubscribe, completion refs, template matching) and reaches no upstream;
every spelling of a visible one reaches its server under one URI. Pure: no I/O."""

import time
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.config import structure_config
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.catalogs.uris import (
    MAX_URI_LENGTH,
    InvalidUri,
    normalize_pattern,
    normalize_template,
    normalize_uri,
)
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.router import ToServer
from tests.core.helpers import decoded, msg, new_router

# --- the function ------------------------------------------------------------------------

# (spellings..., normal form): every spelling must normalise to the normal form.
SAME = [
    (
        "s+secret://x",
        "S+SECRET://x",
        "S+Secret://x",
        "s+secret://%78",
        "s+%73ecret://x",
        "s+secret://X",
        "s+secret://x",
    ),
    (
        "s+secret://x/y/../z",
        "s+secret://x/./z",
        "s+secret://x/y/%2E%2E/z",
        "s+secret://x/../../z",
        "s+secret://X/y/.%2e/z",
        "s+secret://x/z",
    ),
    ("s+secret://x/.", "s+secret://x/./", "s+secret://x/y/..", "s+secret://x/"),
    ("S+SECRET://x/%50ath/%41", "s+secret://x/Path/B/../A", "s+secret://x/Path/./A", "s+secret://x/Path/A"),
    ("demo://h/%7e", "demo://h/%7E", "demo://h/~", "DEMO://H/~", "demo://h/~"),
    ("demo://h/a%2fb", "demo://h/a%2Fb", "demo://h/a%2Fb"),  # reserved: only the hex case changes
    ("file:///home/jos\u00e9/a", "file:///home/jos%c3%a9/a", "FILE:///home/jos%C3%A9/a", "file:///home/jos%C3%A9/a"),
    ("file:///a b/c", "file:///a%20b/c", "file:///a%20b/c"),
    (
        "file:///home/me/public/../private/key",
        "file:///home/me/./private/key",
        "file:///home/me/%70rivate/key",
        "file:///home/me/public/%2e%2e/private/key",
        "file:///home/me/private/key",
    ),
    ("http://User@Host.Example:8080/P?Q=%61#F", "http://User@host.example:8080/P?Q=a#F"),  # user info keeps its case
    ("http://[::A]/x", "http://[::a]/x"),
    ("s:/..//HOST/x", "s://host/x"),  # dots gone, the path became an authority: its host is lowered too
    ("urn:ISBN:0451450523", "URN:ISBN:0451450523", "urn:ISBN:0451450523"),  # an opaque part keeps its case
    ("mailto:A.B@X", "mailto:A.B@X"),
    ("s+secret:a/./b/../c", "s+secret:a/c"),
    ("s+secret://x/a/b/..", "s+secret://x/a/"),
    ("svn+ssh://H/x", "svn+ssh://h/x"),
    # Empty user info and ports are no user info and no port (RFC 3986 §6.2.3); URL parsers agree.
    (
        "e+demo://resource:/static/a.md",
        "e+demo://@resource/static/a.md",
        "e+demo://:@resource:/static/a.md",
        "E+DEMO://@RESOURCE:/static/a.md",
        "e+demo://resource/static/a.md",
    ),
    ("http://[::1]:/x", "http://@[::1]/x", "http://[::1]/x"),
    # Default ports and the empty path of http-like schemes, also behind the proxy's prefix.
    ("p+http://h:80/x", "p+http://h:0080/x", "P+HTTP://H:80/x", "p+http://h/x"),
    ("https://h:443", "https://h", "https://h/"),
    ("ws://h:80?q=1", "ws://h?q=1", "ws://h/?q=1"),
    # A backslash is no URI character: encoded, never read as a separator.
    ("p+http://h\\secret\\x", "p+http://h%5Csecret%5Cx", "p+http://h%5Csecret%5Cx/"),
]

# Pairs that are different URIs and must stay different.
DIFFERENT = [
    ("demo://h/a%2Fb", "demo://h/a/b"),  # an encoded slash is data, not a separator
    ("demo://h/a%3Ab", "demo://h/a:b"),
    ("demo://h/a%25", "demo://h/a%2525"),  # an escaped "%" is never decoded twice
    ("demo://h/Secret.md", "demo://h/secret.md"),  # paths are case-sensitive
    ("demo://h/x?A=1", "demo://h/x?a=1"),
    ("http://User@h/", "http://user@h/"),
    ("http://u@h/x", "http://h/x"),  # a user info that is not empty is part of the URI
    ("http://h:8080/x", "http://h/x"),
    ("demo://h:80/x", "demo://h/x"),  # only http-like schemes have a default port
    ("file:///caf\u00e9", "file:///cafe\u0301"),  # NFC and NFD: no Unicode normalisation
    ("http://b\u00fccher.example/", "http://xn--bcher-kva.example/"),  # no IDNA
    ("s+secret:x", "t+secret:x"),
]

# (input, words the refusal must contain)
REFUSED = [
    ("", "empty"),
    ("s+secret://x ", "leading or trailing whitespace"),
    (" s+secret://x", "leading or trailing whitespace"),
    ("s+secret://x\t", "U+0009"),
    ("s+secret://x\n", "U+000A"),
    ("s+secret://x\r", "U+000D"),
    ("s+secret://x\x00", "U+0000"),
    ("s+secret://x\x7f", "U+007F"),
    ("s+secret://x\x85", "U+0085"),
    ("s+secret://x\u00a0", "U+00A0"),
    ("s+secret://\u200bx", "U+200B"),
    ("s+secret://x\u2028", "U+2028"),
    ("s+secret://x/\ud800", "U+D800"),
    ("s+secret://x/%zz", "'%'"),
    ("s+secret://x/%4", "'%'"),
    ("s+secret://x/%", "'%'"),
    ("secret", "no scheme"),
    ("1secret://x", "no scheme"),
    ("//x/y", "no scheme"),
    ("s+secret%3A//x", "no scheme"),
    ("file:///home/me/public/..%2F..%2Fetc%2Fpasswd", "hides a '.' or '..'"),
    ("file:///home/me/public/%2E%2E%2fprivate", "hides a '.' or '..'"),
    ("file:///home/me/public/..\\private\\key", "hides a '.' or '..'"),
    ("file:///home/me/public/..%5Cprivate", "hides a '.' or '..'"),
]


@pytest.mark.parametrize("group", SAME, ids=lambda g: g[-1])
def test_spellings_of_one_uri_have_one_normal_form(group):
    *spellings, normal = group
    for spelling in spellings:
        assert normalize_uri(spelling) == normal, spelling
    assert normalize_uri(normal) == normal


@pytest.mark.parametrize(("one", "other"), DIFFERENT)
def test_different_uris_stay_different(one, other):
    assert normalize_uri(one) != normalize_uri(other)


@pytest.mark.parametrize(("uri", "words"), REFUSED)
def test_refused_uris_say_why(uri, words):
    with pytest.raises(InvalidUri) as refused:
        normalize_uri(uri)
    assert words in str(refused.value)


def test_globs_and_templates_are_normalised_the_same_way():
    assert normalize_pattern("SECRET://*") == "secret://*"
    assert normalize_pattern("*://SECRET/*") == "*://secret/*"
    assert normalize_pattern("Demo://H/%7e*") == "demo://h/~*"
    assert normalize_pattern("file:///secret dir/*") == "file:///secret%20dir/*"
    assert normalize_pattern("*secret*") == "*secret*"  # not a URI: left as written
    # Templates: literal parts like a URI, expressions exactly as written.
    assert normalize_template("E+DEMO://Host/%7e/{Id}") == "e+demo://host/~/{Id}"
    assert normalize_template("DEMO://x{?Q}") == "demo://x{?Q}"
    assert normalize_template("{+path}/%7e") == "{+path}/~"
    assert normalize_template("vault://k/{id}") == "vault://k/{id}"


# Generated spellings of one URI: random case in the scheme and host, unreserved
# characters percent-encoded with either hex case, and "./" or "x/../" inserted.
UNRESERVED = "ABCXYZabcxyz0189-._~"
segments = st.lists(
    st.text(alphabet=UNRESERVED, min_size=1, max_size=6).filter(lambda s: s not in (".", "..")), min_size=0, max_size=4
)
names = st.from_regex(r"[a-z][a-z0-9+.-]{0,8}", fullmatch=True)
hosts = st.from_regex(r"[a-z0-9-]{1,8}(\.[a-z0-9-]{1,8}){0,2}", fullmatch=True)


@st.composite
def spelled(draw):
    scheme, host, path = draw(names), draw(hosts), draw(segments)
    normal = f"{scheme}://{host}/" + "/".join(path)

    def recase(text):
        return "".join(c.upper() if c.isalpha() and draw(st.booleans()) else c for c in text)

    def encode(text):
        out = ""
        for char in text:
            if draw(st.booleans()):
                escape = f"%{ord(char):02x}"
                out += escape.upper() if draw(st.booleans()) else escape
            else:
                out += char
        return out

    parts = []
    for segment in path:
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from([".", "%2e", "%2E"])))
        if draw(st.booleans()):
            parts += [encode("zz"), draw(st.sampled_from(["..", "%2E%2e", ".%2E"]))]
        parts.append(encode(segment))
    spelling = f"{recase(scheme)}://{recase(host)}/" + "/".join(parts)
    return spelling, normal


@given(spelled())
def test_generated_spellings_meet_one_normal_form(pair):
    spelling, normal = pair
    assert normalize_uri(spelling) == normalize_uri(normal) == normal


URI_CHARS = "aAzZ09:/?#@%2fFeE5c.~-_+ \\\u00e9{}"


@given(st.text(alphabet=URI_CHARS, max_size=40))
def test_normal_forms_are_fixed_points(text):
    for normalize in (normalize_pattern, normalize_template):
        once = normalize(text)
        assert normalize(once) == once
    try:
        once = normalize_uri(text)
    except InvalidUri:
        return
    assert normalize_uri(once) == once
    assert once.isascii() and " " not in once


@pytest.mark.parametrize(
    "path", ["/." * 200_000, "/.." * 200_000, "/a/.." * 100_000, "/%2E" * 100_000, "/a%2F..%2F" * 50_000]
)
def test_long_dot_runs_take_linear_time(path):
    started = time.perf_counter()
    try:
        normalize_uri("s://h" + path)
    except InvalidUri:
        pass
    assert time.perf_counter() - started < 2.0


# --- every method that takes a URI ---------------------------------------------------------

CONFIG = """
[servers.s]
command = "x"
[servers.s.resources]
deny = ["SECRET://*", "Demo://HOST/Secret.md"]
[servers.s.templates]
deny = ["VAULT://*", "Secret://*"]

[servers.f]
command = "x"
prefix = ""
[servers.f.resources]
deny = ["file:///home/me/private/*"]

[profiles.narrow]
tokens = ["narrow-token-0123456789"]
[profiles.narrow.resources]
allow = ["OPEN://*", "file:///home/me/public/*"]
[profiles.narrow.templates]
allow = ["open://t/{id}"]
"""
S_RESOURCES = [{"uri": "secret://x"}, {"uri": "open://a"}, {"uri": "open://b/%7e"}, {"uri": "demo://host/Secret.md"}]
S_TEMPLATES = [{"uriTemplate": "secret://t/{id}"}, {"uriTemplate": "vault://k/{id}"}, {"uriTemplate": "open://t/{id}"}]
F_RESOURCES = [{"uri": "file:///home/me/public/a.txt"}, {"uri": "file:///home/me/private/key"}]
DEFAULT, NARROW = 1, 2

# Refused for every client, on read, subscribe and unsubscribe.
DENIED = [
    "s+secret://x",
    "S+SECRET://x",
    "S+Secret://x",
    "s+sEcret://t/7",
    "s+secret://%78",
    "s+%73ecret://x",
    "s+secret://y/../x",
    "s+secret://x ",
    " s+secret://x",
    "s+secret://x\n",
    "s+secret://\u200bx",
    "s+secret%3A//x",
    "s+%2573ecret://x",
    "s+demo://host/Secret.md",
    "S+DEMO://HOST/Secret.md",
    "s+demo://host/%53ecret.md",
    "s+demo://host/x/../Secret.md",
    "s+VAULT://k/1",
    "s+vault://K/1",
    "s+vault://k/%31",
    "s+v%61ult://k/1",
    "S+Vault://k/1/../2",
    "file:///home/me/private/key",
    "FILE:///home/me/private/key",
    "file:///home/me/%70rivate/key",
    "file:///home/me/public/../private/key",
    "file:///home/me/public/%2e%2e/private/key",
    "file:///home/me/./private/key",
    "file:///home/me/private/other",
    "file:///HOME/../home/me/private/key",
    "file:///home/me/public/..%2Fprivate/key",
    "file:///home/me/public/..\\private\\key",
    "file:///home/me/private/key ",
    "s+secret://x:",
    "s+secret://@x",
    "s+secret://:@x:/",
    "s+demo://@host:/Secret.md",
    "s+demo://host:/Secret.md",
    "s+vault://k:/1",
    "s+vault://@k/1",
    # Other spellings of a denied scheme: without an authority, or with its slashes encoded
    # (a server that percent-decodes before parsing reads secret://x), once or twice.
    "s+secret:%2F%2Fx",
    "S+secret:/%2Fx",
    "s+secret:x",
    "s+secret:/x",
    "s+secret:///x",
    "S+secret:%2F%2Ft/1",
    "s+secret:%252F%252Fx",
    "s+secret%3A%2F%2Fx",
    "s+vault:%2F%2Fk/1",
    "s+vault:k/1",
    "s+demo:%2F%2Fhost/Secret.md",
    "file:/home/me/private/key",
    "file:home/me/private/key",
    "file:%2F%2F%2Fhome/me/private/key",
    "file:///home/me%2Fprivate%2Fkey",
    # A query or fragment a server that parses URLs drops, raw or encoded; file://localhost.
    "s+demo://host/Secret.md?x",
    "s+demo://host/Secret.md#x",
    "s+demo://host/Secret.md%3Fx",
    "s+demo://host/Secret.md%23x",
    "s+demo://host/Secret.md%253Fx",
    "s+demo:%2F%2Fhost/Secret.md%3F",
    "file:///home/me/private/key?",
    "file:///home/me/private/key#",
    "file://localhost/home/me/private/key",
    "FILE://LOCALHOST/home/me/private/key",
    "file://localhost/home/me/private/key?x",
    # Encoded tab, CR and LF (URL parsers drop them), more slashes, user info, ports, hosts.
    "s+demo://host/Secret.md%09",
    "s+demo://host/Sec%0Aret.md",
    "file:///home/me/pri%0Dvate/key",
    "file:%09///home/me/private/key",
    "file:////home/me/private/key",
    "s+secret:///x",
    "s+secret:////x",
    "s+secret://x/",
    "s+secret://x/.",
    "s+secret://x%2F",
    "s+secret://u@x",
    "s+secret://u%40x",
    "s+secret://x:1",
    "file://u@localhost/home/me/private/key",
    "file://localhost:1/home/me/private/key",
    "file://127.0.0.1/home/me/private/key",
    "file://./home/me/private/key",
    # What a file system or a WHATWG parser makes of it: doubled slashes, backslashes (or
    # their escapes) as slashes, controls and spaces at the ends dropped.
    "file:///home//me/private/key",
    "file:////home//me//private/key",
    "file:///home/me%5Cprivate%5Ckey",
    "file://%5Chome/me/private/key",
    "file:%5C%5C%5Chome%5Cme%5Cprivate%5Ckey",
    "s+demo://host/Secret.md%20",
    "s+demo://host/Secret.md%00",
    "s+demo://host/Secret.md%1F",
    "s+demo://host/Secret.md%2520",
]
# Visible to the default profile: (what the client sends, what the server gets).
ALLOWED = [
    ("s+open://a", ("s", "open://a")),
    ("S+OPEN://a", ("s", "open://a")),
    ("s+open://%61", ("s", "open://a")),
    ("s+open://b/~", ("s", "open://b/%7e")),  # a listed URI goes as its server spells it
    ("s+open://b/%7E", ("s", "open://b/%7e")),
    ("s+open://t/%37", ("s", "open://t/7")),  # an unlisted one goes in normal form
    ("S+OPEN://T/./7", ("s", "open://t/7")),
    ("s+open://a%2Fb", ("s", "open://a%2Fb")),  # %2F stays encoded
    ("s+demo://host/secret.md", ("s", "demo://host/secret.md")),  # another path: another URI
    ("file:///home/me/public/a.txt", ("f", "file:///home/me/public/a.txt")),
    ("file:///home/me/public/%61.txt", ("f", "file:///home/me/public/a.txt")),
    ("file:///home/me/private/../public/b.txt", ("f", "file:///home/me/public/b.txt")),
]
# Of those, the narrow profile's allow lists let through only these.
NARROW_ALLOWED = {
    "s+open://a",
    "S+OPEN://a",
    "s+open://%61",
    "s+open://b/~",
    "s+open://b/%7E",
    "s+open://t/%37",
    "S+OPEN://T/./7",
    "s+open://a%2Fb",
    "file:///home/me/public/a.txt",
    "file:///home/me/public/%61.txt",
    "file:///home/me/private/../public/b.txt",
}
NARROW_DENIED = [
    "s+demo://host/secret.md",
    "file:///home/me/public/../../../etc/passwd",
    "file:///home/me/public/%2e%2e/%2E%2E/x",
    "file:///home/me/publicity/x",
    "s+opened://a",
    "s+opened:%2F%2Fa",
    "file:///home/me/public%2F%2E%2E%2Fprivate/key",
    "file:///home/me/public/..%255C..%255Cprivate%255Ckey",
    "file:///home/me/public/..%25255Cprivate",
]
# completion/complete refs: (ref uri, the server's template) or refused.
REFS_ALLOWED = [
    ("s+open://t/{id}", "open://t/{id}"),
    ("S+OPEN://T/{id}", "open://t/{id}"),
    ("s+%6Fpen://t/{id}", "open://t/{id}"),
]
REFS_DENIED = [
    "s+vault://k/{id}",
    "S+VAULT://k/{id}",
    "s+vault://K/{id}",
    "s+vault://%6B/{id}",
    "s+secret://t/{id}",
    "S+Secret://t/{id}",
    "s+vault://k/{id} ",
    "s+vault://k/7",
    "file:///home/me/private/{x}",
    "s+secret:%2F%2Ft/{id}",
    "S+secret:%2F%2Ft/1",
    "s+vault:k/{id}",
    "s+vault:%2F%2Fk/7",
]


@pytest.fixture
def router():
    config = structure_config(tomllib.loads(CONFIG), environ={})
    servers = list(config.servers.values())
    store = {}

    def catalog(profile):
        return Catalog(servers, "__", 50, store=store, policy=ProfilePolicy(config, profile))

    r = new_router(catalog(None), servers, list_changed_debounce=0, profiles={"narrow": catalog("narrow")})
    for name in ("s", "f"):
        r.handle(ServerReady(name, {"capabilities": {"resources": {"subscribe": True}, "completions": {}}}))
    r.handle(ServerItems("s", "resources", S_RESOURCES))
    r.handle(ServerItems("s", "resourceTemplates", S_TEMPLATES))
    r.handle(ServerItems("f", "resources", F_RESOURCES))
    r.handle(ServerItems("f", "resourceTemplates", []))
    r.handle(StartupCompleted())
    for key, profile in ((DEFAULT, "default"), (NARROW, "narrow")):
        r.handle(ClientConnected(key, profile))
        r.handle(ClientMessage(key, msg(id=0, method="initialize", params={"capabilities": {}})))
    return r


def ask(router, key, method, params, id=7):
    """Send one request; return (server, params) if it went upstream, else the error."""
    out = router.handle(ClientMessage(key, msg(id=id, method=method, params=params)))
    sent = [c for c in out if isinstance(c, ToServer)]
    if sent:
        [command] = sent
        return command.server, decoded(command.message)["params"]
    [command] = out
    return decoded(command.message)["error"]


def assert_refused(router, key, answer, what):
    """A -32602 from the proxy itself, and nothing of this client's in flight anywhere."""
    assert type(answer) is dict and answer["code"] == -32602, what
    assert answer["message"].startswith(("Unknown resource", "Invalid params")), answer
    assert not router.clients[key].in_flight, what
    assert not router.subscriptions.of_server("s") and not router.subscriptions.of_server("f"), what


@pytest.mark.parametrize("uri", DENIED)
@pytest.mark.parametrize("key", [DEFAULT, NARROW])
def test_denied_spellings_reach_no_server(router, key, uri):
    for method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
        assert_refused(router, key, ask(router, key, method, {"uri": uri}), (method, uri))
    assert all(not link.pending for link in router.links.values())


@pytest.mark.parametrize(("uri", "expected"), ALLOWED)
def test_allowed_spellings_reach_their_server_under_one_uri(router, uri, expected):
    server, params = ask(router, DEFAULT, "resources/read", {"uri": uri})
    assert (server, params["uri"]) == expected
    answer = ask(router, NARROW, "resources/read", {"uri": uri}, id=8)
    if uri in NARROW_ALLOWED:
        assert (answer[0], answer[1]["uri"]) == expected
    else:
        assert_refused(router, NARROW, answer, uri)


@pytest.mark.parametrize("uri", NARROW_DENIED)
def test_allow_lists_hold_for_every_spelling(router, uri):
    for method in ("resources/read", "resources/subscribe"):
        assert_refused(router, NARROW, ask(router, NARROW, method, {"uri": uri}), (method, uri))
    assert all(not link.pending for link in router.links.values())


def test_one_subscription_whatever_the_spelling(router):
    server, params = ask(router, DEFAULT, "resources/subscribe", {"uri": "s+open://t/7"}, id=1)
    assert (server, params["uri"]) == ("s", "open://t/7")
    router.handle(ServerMessage("s", msg(id=next(iter(router.links["s"].pending)), result={})))
    # Another spelling of the same URI: already subscribed, answered without the server.
    out = router.handle(
        ClientMessage(DEFAULT, msg(id=2, method="resources/subscribe", params={"uri": "S+OPEN://T/%37"}))
    )
    assert not [c for c in out if isinstance(c, ToServer)] and "result" in decoded(out[0].message)
    server, params = ask(router, DEFAULT, "resources/unsubscribe", {"uri": "s+open://t/./%37"}, id=3)
    assert (server, params["uri"]) == ("s", "open://t/7")


@pytest.mark.parametrize(("ref", "template"), REFS_ALLOWED)
def test_completion_refs_in_any_spelling_name_the_servers_template(router, ref, template):
    for key in (DEFAULT, NARROW):
        server, params = ask(
            router,
            key,
            "completion/complete",
            {"ref": {"type": "ref/resource", "uri": ref}, "argument": {"name": "id", "value": ""}},
            id=10 + key,
        )
        assert (server, params["ref"]["uri"]) == ("s", template)


@pytest.mark.parametrize("ref", REFS_DENIED)
@pytest.mark.parametrize("key", [DEFAULT, NARROW])
def test_completion_refs_to_hidden_templates_are_refused(router, key, ref):
    answer = ask(
        router,
        key,
        "completion/complete",
        {"ref": {"type": "ref/resource", "uri": ref}, "argument": {"name": "id", "value": ""}},
    )
    assert_refused(router, key, answer, ref)
    assert all(not link.pending for link in router.links.values())


def test_a_uri_longer_than_the_limit_is_refused_at_once(router):
    for uri in ("s+secret:" + "%252525" * 600_000, "s+open://a/" + "b" * MAX_URI_LENGTH):
        answer = ask(router, DEFAULT, "resources/read", {"uri": uri})
        assert answer["code"] == -32602 and f"longer than {MAX_URI_LENGTH}" in answer["message"]
    server, params = ask(router, DEFAULT, "resources/read", {"uri": "s+open://a/" + "b" * (MAX_URI_LENGTH - 11)})
    assert server == "s" and len(params["uri"]) == MAX_URI_LENGTH - 2


def test_refusals_name_the_problem_and_keep_the_id(router):
    out = router.handle(ClientMessage(DEFAULT, msg(id="r1", method="resources/read", params={"uri": "s+open://a "})))
    error = decoded(out[0].message)
    assert error["id"] == "r1" and error["error"]["code"] == -32602
    assert error["error"]["message"] == "Invalid params: uri has leading or trailing whitespace"
    out = router.handle(ClientMessage(DEFAULT, msg(id="r2", method="resources/read", params={"uri": "s+secret://X"})))
    assert decoded(out[0].message)["error"]["message"] == "Unknown resource: s+secret://X"


def test_explain_shows_the_rule_as_written(router):
    reasons = {(s, o): r for s, o, r in router.catalogs["default"].hidden["resources"]}
    assert reasons[("s", "secret://x")] == "servers.s.resources.deny 'SECRET://*'"
    assert reasons[("s", "demo://host/Secret.md")] == "servers.s.resources.deny 'Demo://HOST/Secret.md'"
    assert router.catalogs["default"].hidden["resourceTemplates"] == [
        ("s", "secret://t/{id}", "servers.s.templates.deny 'Secret://*'"),
        ("s", "vault://k/{id}", "servers.s.templates.deny 'VAULT://*'"),
    ]


def test_listed_uris_that_no_client_could_read_are_not_listed(router):
    router.handle(ServerItems("f", "resources", [*F_RESOURCES, {"uri": "file:///x\n"}, {"uri": "no-scheme"}]))
    out = router.handle(ClientMessage(DEFAULT, msg(id=1, method="resources/list")))
    uris = [r["uri"] for r in decoded(out[0].message)["result"]["resources"]]
    assert "file:///x\n" not in uris and "no-scheme" not in uris and "file:///home/me/public/a.txt" in uris

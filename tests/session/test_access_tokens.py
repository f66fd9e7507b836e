"""Access tokens checked against a real (in-test) authorization server: JWTs with its key
set, fetched over HTTP and bounded; opaque tokens by introspection. Each row is one token
and what the verifier says of it."""

from __future__ import annotations

import base64
import json
import logging
import time

import pytest
import trio

from aggregator.config import structure_config
from aggregator.fronts.authorization import Principal, Rejection
from aggregator.fronts.authorization.tokens import TokenVerifier
from tests.loopback import free_port
from tests.oauth import RESOURCE, AuthServer, auth_table, hmac_key


@pytest.fixture
def server():
    server = AuthServer()
    yield server
    server.close()


class Clock:
    """The verifier's monotonic clock, moved by hand (the fetches themselves take real time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier(server: AuthServer, clock: Clock | None = None, profiles=None, **auth) -> TokenVerifier:
    config = structure_config(
        {
            "auth": auth_table(server, **auth),
            "servers": {"a": {"command": "fake"}},
            **({"profiles": profiles} if profiles else {}),
        },
        environ={},
    )
    return TokenVerifier(config.auth, config.profiles, clock=clock or Clock())


def unsigned(server: AuthServer) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {"iss": server.issuer, "sub": "mallory", "aud": RESOURCE, "exp": int(time.time()) + 300, "scope": "mcp"}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


# (what, how to make the token from the server, expected: subject or (status, error))
CASES = [
    ("a good token", lambda s: s.mint(), "alice"),
    ("an audience list naming this resource", lambda s: s.mint(aud=["other", RESOURCE]), "alice"),
    ("a trailing slash on the audience", lambda s: s.mint(aud=RESOURCE + "/"), "alice"),
    ("scopes as scp", lambda s: s.mint(scope=None, scp=["mcp"]), "alice"),
    ("no token audience", lambda s: s.mint(aud=None), (401, "invalid_token")),
    ("a token for another resource", lambda s: s.mint(aud="https://other.example/mcp"), (401, "invalid_token")),
    ("expired", lambda s: s.mint(exp=int(time.time()) - 120), (401, "invalid_token")),
    ("expired within the leeway", lambda s: s.mint(exp=int(time.time()) - 5), "alice"),
    ("no expiry", lambda s: s.mint(exp=None), (401, "invalid_token")),
    ("not valid yet", lambda s: s.mint(nbf=int(time.time()) + 600), (401, "invalid_token")),
    ("another issuer", lambda s: s.mint(iss="https://evil.example"), (401, "invalid_token")),
    ("no subject", lambda s: s.mint(sub=None), (401, "invalid_token")),
    ("without the required scope", lambda s: s.mint(scope="other"), (403, "insufficient_scope")),
    ("signed by a key the issuer does not publish", lambda s: s.mint(key=hmac_ec()), (401, "invalid_token")),
    ("alg none", unsigned, (401, "invalid_token")),
    ("HS256 with a made-up secret", lambda s: s.mint(key=hmac_key(), alg="HS256"), (401, "invalid_token")),
    ("garbage", lambda s: "a.b.c", (401, "invalid_token")),
    ("typ JWT", lambda s: s.mint(header={"typ": "JWT"}), "alice"),
    ("typ application/at+jwt", lambda s: s.mint(header={"typ": "application/at+JWT"}), "alice"),
    ("no typ", lambda s: untyped(s), "alice"),
    ("an ID token's typ", lambda s: s.mint(header={"typ": "id+jwt"}), (401, "invalid_token")),
    ("a DPoP proof's typ", lambda s: s.mint(header={"typ": "dpop+jwt"}), (401, "invalid_token")),
    ("a security event's typ", lambda s: s.mint(header={"typ": "secevent+jwt"}), (401, "invalid_token")),
    ("an opaque token without introspection", lambda s: "opaque-token-value", (401, "invalid_token")),
]


def untyped(server: AuthServer) -> str:
    """A good token whose header has no ``typ``."""
    from joserfc import jwt

    claims = {"iss": server.issuer, "sub": "alice", "aud": RESOURCE, "exp": int(time.time()) + 300, "scope": "mcp"}
    return jwt.encode({"alg": "ES256", "kid": "k1"}, claims, server.keys[0], algorithms=["ES256"])


def hmac_ec():
    from joserfc.jwk import ECKey

    return ECKey.generate_key("P-256", parameters={"kid": "k1"})  # the issuer's kid, another key


@pytest.mark.parametrize(("what", "make", "expected"), CASES, ids=[case[0] for case in CASES])
async def test_a_token(server, what, make, expected):
    token = make(server)
    with trio.fail_after(10):
        result = await verifier(server).verify(token)
    if isinstance(expected, str):
        assert isinstance(result, Principal), (what, result)
        assert (result.subject, result.issuer) == (expected, server.issuer)
    else:
        assert isinstance(result, Rejection), (what, result)
        assert (result.status, result.error) == expected, result
        assert token not in result.description


async def test_the_public_key_as_an_hmac_secret_is_refused(server):
    """The classic confusion: an HS256 token whose secret is the issuer's public key."""
    from joserfc.jwk import OctKey

    public = json.dumps(server.keys[0].as_dict(private=False)).encode()
    forged = server.mint(key=OctKey.import_key(public, parameters={"kid": "k1"}), alg="HS256")
    result = await verifier(server).verify(forged)
    assert isinstance(result, Rejection) and result.status == 401


async def test_every_key_of_a_duplicated_key_id_is_tried_and_the_set_logged_once(server, caplog):
    from joserfc.jwk import ECKey

    server.keys = [ECKey.generate_key("P-256", parameters={"kid": "k1"}) for _ in range(2)]
    clock = Clock()
    check = verifier(server, clock)
    with caplog.at_level(logging.WARNING), trio.fail_after(10):
        for signer in reversed(server.keys):
            result = await check.verify(server.mint(key=signer, sub=f"signed-{id(signer)}"))
            assert isinstance(result, Principal), result
        clock.now += 10_000  # stale: fetched again, the same duplicates are not said again
        assert isinstance(await check.verify(server.mint(key=server.keys[1])), Principal)
        forged = await check.verify(server.mint(key=hmac_ec()))
    assert isinstance(forged, Rejection) and forged.status == 401
    assert server.count("/jwks") == 2
    said = [record for record in caplog.records if "one key id to several keys" in record.getMessage()]
    assert len(said) == 1 and "(k1)" in said[0].getMessage()


async def test_a_rotated_signing_key_is_fetched_then_accepted(server):
    check = verifier(server, jwks_refresh_interval=0)
    assert isinstance(await check.verify(server.mint()), Principal)
    server.rotate("k2")
    fresh = server.mint(sub="bob")
    result = await check.verify(fresh)
    assert isinstance(result, Principal) and result.subject == "bob"
    assert server.count("/jwks") == 2


async def test_made_up_key_ids_cannot_make_it_fetch_in_a_loop(server):
    clock = Clock()
    check = verifier(server, clock, jwks_refresh_interval=30)
    assert isinstance(await check.verify(server.mint()), Principal)
    for index in range(50):
        result = await check.verify(server.mint(header={"kid": f"bogus-{index}"}))
        assert isinstance(result, Rejection) and result.status == 401
    assert server.count("/jwks") == 1  # fetched within the interval: none of them fetches again
    clock.now += 31
    for index in range(20):
        await check.verify(server.mint(header={"kid": f"bogus-again-{index}"}))
    assert server.count("/jwks") == 2  # one refetch for the first unknown kid past the interval


async def test_a_checked_token_is_not_checked_again(server):
    check = verifier(server)
    token = server.mint()
    first = await check.verify(token)
    assert isinstance(first, Principal)
    server.rotate("k9")  # were it checked again, its key would be unknown now
    server.mode = "error"
    assert await check.verify(token) == first
    assert check.cached(token) == first
    assert check.cached(server.mint()) is None


async def test_an_issuer_given_its_jwks_uri_is_not_asked_for_its_metadata(server):
    check = verifier(server, issuers=[{"issuer": server.issuer, "jwks_uri": f"{server.issuer}/jwks"}])
    assert isinstance(await check.verify(server.mint()), Principal)
    assert server.count("/.well-known/oauth-authorization-server") == 0


@pytest.mark.parametrize("mode", ["slow", "huge", "error", "down"])
async def test_a_key_set_that_cannot_be_had_is_a_503_and_a_logged_error(server, mode, caplog):
    if mode == "down":
        issuer = f"http://127.0.0.1:{free_port()}"
        check = verifier(server, issuers=[{"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}], fetch_timeout=0.5)
        token = server.mint(iss=issuer)
    else:
        server.mode = mode
        check = verifier(server, fetch_timeout=0.5)
        token = server.mint()
    started = trio.current_time()
    with caplog.at_level(logging.ERROR), trio.fail_after(5):
        result = await check.verify(token)
    assert isinstance(result, Rejection) and result.status == 503, result
    assert trio.current_time() - started < 2.5  # bounded by fetch_timeout (twice: metadata, keys)
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert errors and "cannot be fetched" in errors[0].getMessage()
    assert token not in caplog.text


async def test_stale_keys_keep_serving_while_a_refetch_fails(server):
    clock = Clock()
    check = verifier(server, clock, jwks_cache_seconds=60)
    assert isinstance(await check.verify(server.mint(sub="one")), Principal)
    server.mode = "error"
    clock.now += 120
    assert isinstance(await check.verify(server.mint(sub="two")), Principal)


async def test_discovered_key_set_urls_are_checked(server):
    server.metadata = lambda: {"issuer": server.issuer, "jwks_uri": "http://169.254.169.254/latest/meta-data"}
    result = await verifier(server).verify(server.mint())
    assert isinstance(result, Rejection) and result.status == 503
    server.metadata = lambda: {"issuer": "https://another.example", "jwks_uri": f"{server.issuer}/jwks"}
    result = await verifier(server).verify(server.mint())
    assert isinstance(result, Rejection) and result.status == 503
    assert server.count("/jwks") == 0


# (what, the jwks_uri the metadata names, the issuer, what its host resolves to, refused?)
ISSUER = "https://issuer.example"
KEY_SET_URLS = [
    ("https, a public address", "https://keys.example/jwks", ISSUER, ["93.184.216.34"], False),
    ("the issuer's own origin", "https://issuer.example/keys", ISSUER, ["10.0.0.5"], False),
    ("an issuer's own origin on a private address", "https://10.0.0.5/jwks", "https://10.0.0.5", [], False),
    ("plain http off loopback", "http://keys.example/jwks", ISSUER, ["93.184.216.34"], True),
    ("another scheme", "file:///etc/passwd", ISSUER, [], True),
    ("a user name in the URL", "https://user:pw@keys.example/jwks", ISSUER, ["93.184.216.34"], True),
    ("a private address", "https://10.1.2.3/jwks", ISSUER, [], True),
    ("a link-local address", "https://169.254.169.254/latest", ISSUER, [], True),
    ("a cloud metadata name", "https://metadata.google.internal/jwks", ISSUER, [], True),
    ("a name resolving to a private address", "https://keys.example/jwks", ISSUER, ["10.9.8.7"], True),
    ("a name resolving to link-local", "https://keys.example/jwks", ISSUER, ["93.184.216.34", "169.254.1.1"], True),
    ("a name resolving to loopback", "https://keys.example/jwks", ISSUER, ["127.0.0.1"], True),
    ("a name resolving to mapped loopback", "https://keys.example/jwks", ISSUER, ["::ffff:127.0.0.1"], True),
    ("loopback for an issuer off loopback", "http://127.0.0.1:9/jwks", ISSUER, [], True),
    ("localhost for an issuer off loopback", "https://localhost/jwks", ISSUER, [], True),
    ("loopback for an issuer on loopback", "http://127.0.0.1:9/jwks", "http://127.0.0.1:8", [], False),
    ("a name resolving to loopback, issuer on loopback", "https://keys.example/j", "http://[::1]:8", ["::1"], False),
]


@pytest.mark.parametrize(
    ("what", "url", "issuer", "addresses", "refused"), KEY_SET_URLS, ids=[case[0] for case in KEY_SET_URLS]
)
async def test_a_discovered_key_set_url(what, url, issuer, addresses, refused):
    from aggregator.fronts.authorization.keys import discovered_url_problem

    async def resolve(host: str) -> list[str]:
        assert host == "keys.example", host
        return addresses

    problem = await discovered_url_problem(url, issuer, resolve)
    assert (problem is not None) == refused, (what, problem)


async def test_hostile_metadata_never_makes_it_fetch_where_it_may_not(server, caplog):
    async def private(host: str) -> list[str]:
        return ["10.0.0.1"]

    for jwks_uri in ("http://keys.example/jwks", "https://keys.example/jwks", "https://[fd00::1]/jwks"):
        server.metadata = lambda uri=jwks_uri: {"issuer": server.issuer, "jwks_uri": uri}
        check = verifier(server)
        check.keys[server.issuer].resolve = private
        caplog.clear()
        with caplog.at_level(logging.ERROR), trio.fail_after(10):
            result = await check.verify(server.mint())
        assert isinstance(result, Rejection) and result.status == 503, (jwks_uri, result)
        assert "its jwks_uri is refused" in caplog.text
    assert server.count("/jwks") == 0


async def test_a_key_set_url_that_redirects_elsewhere_is_not_followed(server):
    elsewhere = AuthServer()
    try:
        server.redirects["/moved"] = f"{elsewhere.issuer}/jwks"
        server.metadata = lambda: {"issuer": server.issuer, "jwks_uri": f"{server.issuer}/moved"}
        with trio.fail_after(10):
            result = await verifier(server).verify(server.mint())
        assert isinstance(result, Rejection) and result.status == 503
        assert server.count("/moved") == 1 and elsewhere.count("/jwks") == 0
    finally:
        elsewhere.close()


async def test_profiles_are_chosen_by_claims_and_scopes(server):
    profiles = {
        "admins": {"match": {"groups": ["admins"]}, "scopes": ["admin"]},
        "staff": {"match": {"groups": ["staff", "admins"]}},
    }
    check = verifier(server, profiles=profiles)
    admin = await check.verify(server.mint(groups=["admins"], scope="mcp admin"))
    staff = await check.verify(server.mint(sub="bob", groups=["admins"]))
    other = await check.verify(server.mint(sub="carol", groups="nobody"))
    assert isinstance(admin, Principal) and admin.profiles == ("admins", "staff") and admin.profile == "admins"
    assert isinstance(staff, Principal) and staff.profile == "staff"
    assert isinstance(other, Principal) and other.profile == "default"


async def test_the_same_subject_with_a_fresh_token_is_the_same_principal(server):
    check = verifier(server)
    first = await check.verify(server.mint(scope="mcp"))
    second = await check.verify(server.mint(scope="mcp admin", lifetime=600))
    assert first == second and hash(first) == hash(second) and repr(first) == repr(second)
    third = await check.verify(server.mint(sub="bob"))
    assert third != first


async def test_an_opaque_token_is_introspected_with_the_client_credentials(server):
    server.opaque["opaque-good-token"] = {
        "active": True,
        "sub": "dave",
        "aud": RESOURCE,
        "scope": "mcp",
        "exp": int(time.time()) + 300,
        "iss": server.issuer,
    }
    server.opaque["opaque-foreign-token"] = {"active": True, "sub": "dave", "aud": "https://else", "scope": "mcp"}
    issuer = {
        "issuer": server.issuer,
        "introspection_endpoint": f"{server.issuer}/introspect",
        "client_id": "proxy",
        "client_secret": "proxy-secret",
    }
    check = verifier(server, issuers=[issuer])
    good = await check.verify("opaque-good-token")
    assert isinstance(good, Principal) and good.subject == "dave"
    assert await check.verify("opaque-good-token") == good
    assert server.count("/introspect") == 1  # the second answer came from the cache
    assert server.introspection_auth[0] == "Basic " + base64.b64encode(b"proxy:proxy-secret").decode()
    foreign = await check.verify("opaque-foreign-token")
    assert isinstance(foreign, Rejection) and foreign.status == 401
    unknown = await check.verify("opaque-unknown-token")
    assert isinstance(unknown, Rejection) and unknown.status == 401


async def test_unknown_opaque_tokens_are_introspected_once_and_a_few_at_a_time(server):
    issuer = {"issuer": server.issuer, "introspection_endpoint": f"{server.issuer}/introspect"}
    check = verifier(server, issuers=[issuer])
    with trio.fail_after(20):
        for _ in range(5):  # the same made-up token, again and again: asked once
            refused = await check.verify("made-up-opaque-token")
            assert isinstance(refused, Rejection) and refused.status == 401
        assert server.count("/introspect") == 1
        async with trio.open_nursery() as nursery:  # ... and at the same moment: once too
            for _ in range(10):
                nursery.start_soon(check.verify, "another-made-up-token")
        assert server.count("/introspect") == 2
        server.mode, server.slow_seconds = "slow", 0.2
        async with trio.open_nursery() as nursery:  # many made up: a few at a time at one issuer
            for number in range(20):
                nursery.start_soon(check.verify, f"made-up-token-{number}")
    assert server.count("/introspect") == 22
    assert server.most_busy <= 4, server.most_busy
    server.opaque["made-up-opaque-token"] = {"active": True, "sub": "erin", "aud": RESOURCE, "scope": "mcp"}
    assert isinstance(await check.verify("made-up-opaque-token"), Rejection)  # refused a while unasked

"""The proxy's own sign-in behind the connect page (``connect.FrontSignIn``): whoever holds a
link may open it without a cookie again and again, so what waits is bounded per flow and per
user, another user's sign-in is never dropped for it, and the authorization server's
metadata is fetched once in a while, not once per page view."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from aggregator.credentials import connect
from aggregator.credentials.browser import BrowserSessions
from aggregator.credentials.connect import FrontSignIn
from aggregator.credentials.fetching import Answer
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.tokens import ClientCredentials

ISSUER = "https://idp.example"
ALICE = Principal(issuer=ISSUER, subject="alice")
BOB = Principal(issuer=ISSUER, subject="bob")


class Metadata:
    """The issuer's metadata endpoint, counting how often it is asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def get_json(self, url: str, what: str) -> Answer:
        self.asked += 1
        body = {
            "issuer": ISSUER,
            "authorization_endpoint": f"{ISSUER}/authorize",
            "token_endpoint": f"{ISSUER}/token",
            "code_challenge_methods_supported": ["S256"],
        }
        return Answer(200, httpx.Headers(), body)

    async def post_form(self, url: str, form: object, what: str, **kwargs: object) -> Answer:
        raise TokenStep  # a sign-in that was found and checked reaches the token endpoint


class TokenStep(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def front_sign_in(clock: Clock) -> tuple[FrontSignIn, Metadata]:
    metadata = Metadata()

    async def client_at(*args: object) -> ClientCredentials:
        return ClientCredentials(client_id="proxy")

    flows = SimpleNamespace(
        fetcher=metadata, client_at=client_at, settings=SimpleNamespace(consent_timeout=600.0), shared=None
    )
    front = FrontSignIn(
        flows,  # type: ignore[arg-type]
        verifier=SimpleNamespace(),  # type: ignore[arg-type]
        issuers=[ISSUER],
        resource="http://127.0.0.1:1/mcp",
        scopes=[],
        redirect_uri="http://127.0.0.1:1/oauth/signed-in",
        clock=clock,
    )
    return front, metadata


def state_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["state"][0]


async def test_a_flood_of_one_link_keeps_a_few_sign_ins_and_drops_no_one_elses():
    clock = Clock()
    front, metadata = front_sign_in(clock)
    browsers = BrowserSessions(path="/oauth", secure=False)
    victim = browsers.new()
    victims = state_of(await front.begin(ALICE, victim, "alices-flow"))
    for _ in range(connect.MAX_SIGN_INS + 10):
        await front.begin(BOB, browsers.new(), "bobs-flow")
    assert front.waiting_count() == 1 + connect.MAX_SIGN_INS_PER_FLOW
    assert metadata.asked == 1  # not once per page view
    # alice's sign-in still waits: her answer reaches the token step (where this test stops)
    with pytest.raises(TokenStep):
        await front.complete({"state": victims, "code": "c"}, victim)
    # a sign-in that is gone says so
    with pytest.raises(CredentialError, match="unknown, already used or expired"):
        await front.complete({"state": victims, "code": "c"}, victim)


async def test_a_flow_keeps_its_newest_sign_ins_and_a_user_a_few_across_flows():
    clock = Clock()
    front, _ = front_sign_in(clock)
    browsers = BrowserSessions(path="/oauth", secure=False)
    first = browsers.new()
    oldest = state_of(await front.begin(BOB, first, "one"))
    for _ in range(connect.MAX_SIGN_INS_PER_FLOW):
        await front.begin(BOB, browsers.new(), "one")
    with pytest.raises(CredentialError, match="unknown"):  # replaced by the flow's newer ones
        await front.complete({"state": oldest, "code": "c"}, first)
    for n in range(connect.MAX_SIGN_INS_PER_USER * 2):
        await front.begin(BOB, browsers.new(), f"flow{n}")
    assert front.waiting_count() == connect.MAX_SIGN_INS_PER_USER


async def test_past_the_total_a_new_sign_in_is_refused_not_anothers_dropped(monkeypatch):
    monkeypatch.setattr(connect, "MAX_SIGN_INS", 4)
    clock = Clock()
    front, metadata = front_sign_in(clock)
    browsers = BrowserSessions(path="/oauth", secure=False)
    for n in range(4):
        await front.begin(Principal(issuer=ISSUER, subject=f"user{n}"), browsers.new(), f"flow{n}")
    with pytest.raises(CredentialError, match="too many sign-ins"):
        await front.begin(ALICE, browsers.new(), "alices-flow")
    assert front.waiting_count() == 4
    clock.now += 601  # they expire; the metadata is fetched again once it is old
    await front.begin(ALICE, browsers.new(), "alices-flow")
    assert front.waiting_count() == 1 and metadata.asked == 2

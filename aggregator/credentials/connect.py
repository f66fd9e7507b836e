"""The connect page: the URL a user is given when a server needs their grant
(``<public base>/oauth/connect?flow=ID``), and the proxy's own sign-in behind it.

The phishing it stops (MCP 2026-07-28, elicitation, "Phishing"): alice makes the proxy ask
for her grant, sends the link to bob, bob grants access with his account at the third
party, and alice's session would then act as bob there. So the link is never the third
party's authorization URL, and it names no user; the page finds out whose browser opened
it before anything is granted:

- With ``[auth]`` (the flow's user signed in at one of its issuers), a browser without the
  proxy's session cookie (``browser``) is signed in at that issuer first (``FrontSignIn``:
  authorization code with PKCE, the proxy as an OAuth client of its own issuer, asking for
  its own ``auth.resource``; the access token is checked by the proxy's token verifier,
  which says the subject). A subject other than the flow's: 403, "this link was made for
  another user", nothing granted. The same: the consent page.
- Without ``[auth]`` no flow has a user to compare (a server taking users' grants needs a
  signed-in caller), so the consent page is shown to whoever opens the link, and the cookie
  still binds the flow from the consent button to the callback.

The consent page names the server and the user and has one button: a POST carrying a CSRF
token bound to the browser's cookie. It binds the flow to that browser session and
redirects to the third party's authorization URL; the callback then takes the answer from
that browser only (``authorization.AuthorizationFlows.complete``).

The sign-in's ``state`` is bound to the browser session that began it (a browser cannot be
made to come back signed in as someone else: login CSRF), used once, and expires with the
flows' ``consent_timeout``. Anyone holding a link can open it without a cookie again and
again, each time beginning a sign-in, so what waits is bounded by whose link it is: at most
``MAX_SIGN_INS_PER_FLOW`` per flow and ``MAX_SIGN_INS_PER_USER`` per user the flows were made
for (a new one replaces that flow's, else that user's, oldest), and at most ``MAX_SIGN_INS``
in all (past it a new sign-in is refused, never another user's dropped). The authorization
server's metadata is fetched once per ``METADATA_SECONDS``, not per page view. A refused or
failed page is a warning, the first at once, then at most one per ``FAILURE_LOG_INTERVAL``
per kind with the count of those held back. Codes, tokens, states and cookies are never logged.
"""

from __future__ import annotations

import hashlib
import html
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import attrs

from aggregator.credentials.authorization import AuthorizationFlows, Pending, pkce_pair
from aggregator.credentials.browser import HTML_HEADERS, BrowserSession, BrowserSessions, page
from aggregator.credentials.discovery import ServerMetadata, authorization_server
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError, UnsafeUrl
from aggregator.credentials.tokens import ClientCredentials, request_tokens
from aggregator.credentials.urls import url_refusal
from aggregator.log_summary import LogSummary
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)
MAX_SIGN_INS = 1024
MAX_SIGN_INS_PER_FLOW = 3
MAX_SIGN_INS_PER_USER = 8
METADATA_SECONDS = 300.0
FAILURE_LOG_INTERVAL = 10.0  # seconds
MAX_FORM = 4096


class TokenCheck(Protocol):
    """The proxy's token verifier (``fronts.authorization.tokens.TokenVerifier``): a
    principal with ``issuer`` and ``subject`` for a good token, anything else for a bad one."""

    async def verify(self, token: str) -> object: ...


@attrs.frozen(kw_only=True)
class _SigningIn:
    browser: str = attrs.field(repr=False)
    flow: str = attrs.field(repr=False)
    user: Principal  # whom the flow was made for
    verifier: str = attrs.field(repr=False)
    issuer: str
    iss_parameter: bool
    token_endpoint: str
    client: ClientCredentials
    expires_at: float


class FrontSignIn:
    """Signs a browser in at the proxy's own authorization server (an ``[auth]`` issuer)."""

    def __init__(
        self,
        flows: AuthorizationFlows,
        verifier: TokenCheck,
        *,
        issuers: Collection[str],
        resource: str,
        scopes: Collection[str],
        redirect_uri: str,
        client_id: str | None = None,
        client_secret: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flows = flows
        self.verifier = verifier
        self.issuers = frozenset(issuers)
        self.resource = resource
        self.scope = " ".join(scopes)
        self.redirect_uri = redirect_uri
        self.client_id = client_id
        self.client_secret = client_secret
        self.clock = clock
        # sha256(state) -> its sign-in (looked up by hash: the time taken tells nothing)
        self._waiting: OrderedDict[bytes, _SigningIn] = OrderedDict()
        self._metadata: dict[str, tuple[float, ServerMetadata]] = {}  # issuer -> (fetched at, metadata)

    async def begin(self, user: Principal, browser: BrowserSession, flow: str) -> str:
        """The URL that signs ``browser`` in at ``user``'s issuer, then comes back to the
        flow (made for ``user``)."""
        issuer = user.issuer
        if issuer not in self.issuers:
            raise CredentialError("the user this link was made for signed in where this proxy no longer trusts")
        metadata = await self._server(issuer)
        if metadata.authorization_endpoint is None or "S256" not in metadata.code_challenge_methods:
            raise CredentialError("the proxy's authorization server cannot sign a browser in (code flow, PKCE)")
        client = await self.flows.client_at(
            metadata, "the proxy's sign-in", "credentials.sign_in_client_id", self.client_id, self.client_secret
        )
        verifier, challenge = pkce_pair()
        state = secrets.token_urlsafe(32)
        now = self.clock()
        timeout = self.flows.settings.consent_timeout
        signing_in = _SigningIn(
            browser=browser.id,
            flow=flow,
            user=user,
            verifier=verifier,
            issuer=metadata.issuer,
            iss_parameter=metadata.iss_parameter,
            token_endpoint=metadata.token_endpoint,
            client=client,
            expires_at=now + timeout,
        )
        if self.flows.shared is not None:  # any replica takes the browser back; it expires with the flows
            record = attrs.asdict(signing_in)
            del record["expires_at"]
            # Bounded as in memory: at most MAX_SIGN_INS begun for one flow within its lifetime.
            if await self.flows.shared.count(_SIGN_INS_BEGUN + _key(flow).hex(), ttl=timeout) > MAX_SIGN_INS:
                raise CredentialError("too many sign-ins were begun for this link; ask for a new one later")
            await self.flows.shared.put(_SIGN_IN + _key(state).hex(), record, ttl=timeout)
        else:
            self._admit(user, flow, now)
            self._waiting[_key(state)] = signing_in
        query = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": self.redirect_uri,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": state,
            "resource": self.resource,
        }
        if self.scope:
            query["scope"] = self.scope
        endpoint = metadata.authorization_endpoint
        url = endpoint + ("&" if urlsplit(endpoint).query else "?") + urlencode(query)
        if (refusal := url_refusal(url)) is not None:
            raise UnsafeUrl(f"the proxy's sign-in URL {refusal}")
        return url

    async def _server(self, issuer: str) -> ServerMetadata:
        """The issuer's metadata, fetched at most once per ``METADATA_SECONDS``."""
        now = self.clock()
        known = self._metadata.get(issuer)
        if known is not None and now - known[0] < METADATA_SECONDS:
            return known[1]
        metadata = await authorization_server(self.flows.fetcher, issuer)
        self._metadata[issuer] = (now, metadata)  # issuers are few: those of ``[auth]``
        return metadata

    def _admit(self, user: Principal, flow: str, now: float) -> None:
        """Room for one more sign-in for ``flow``, made for ``user``: the expired ones go,
        then the flow's oldest past its share, then the user's oldest past theirs; past the
        total, the new one is refused (one user's flood never drops another's)."""
        for key in [key for key, waiting in self._waiting.items() if waiting.expires_at <= now]:
            del self._waiting[key]
        self._keep_room([key for key, waiting in self._waiting.items() if waiting.flow == flow], MAX_SIGN_INS_PER_FLOW)
        self._keep_room([key for key, waiting in self._waiting.items() if waiting.user == user], MAX_SIGN_INS_PER_USER)
        if len(self._waiting) >= MAX_SIGN_INS:
            raise CredentialError("too many sign-ins are waiting; try again in a few minutes")

    def _keep_room(self, keys: list[bytes], share: int) -> None:
        """Drop the oldest of ``keys`` (oldest first) so that one more stays within ``share``."""
        for key in keys[: max(0, len(keys) - share + 1)]:
            del self._waiting[key]

    def waiting_count(self) -> int:
        return len(self._waiting)

    async def complete(self, query: Mapping[str, str], browser: BrowserSession) -> tuple[Principal, str]:
        """Who signed in, from the authorization server's answer brought by ``browser``; and
        the flow to go back to."""
        waiting = await self._take(query.get("state", ""))
        if waiting is None or waiting.expires_at <= self.clock():
            raise CredentialError("this sign-in is unknown, already used or expired; open your link again")
        if not secrets.compare_digest(waiting.browser, browser.id):
            raise CredentialError("this sign-in was started in another browser; open your link again")
        iss = query.get("iss")
        if (iss is not None and iss != waiting.issuer) or (iss is None and waiting.iss_parameter):
            raise CredentialError("the sign-in's answer does not come from the authorization server it was sent to")
        if "error" in query or not query.get("code"):
            raise CredentialError("you were not signed in")
        tokens = await request_tokens(
            self.flows.fetcher,
            waiting.token_endpoint,
            {
                "grant_type": "authorization_code",
                "code": query["code"],
                "redirect_uri": self.redirect_uri,
                "code_verifier": waiting.verifier,
                "resource": self.resource,
            },
            waiting.client,
            "the proxy's sign-in",
        )
        checked = await self.verifier.verify(tokens.access_token)
        issuer, subject = getattr(checked, "issuer", None), getattr(checked, "subject", None)
        if not isinstance(issuer, str) or not isinstance(subject, str):
            raise CredentialError("the sign-in gave a token this proxy does not accept")
        return Principal(issuer=issuer, subject=subject), waiting.flow

    async def _take(self, state: str) -> _SigningIn | None:
        """The sign-in ``state`` names, removed (used once; from the store, in one command)."""
        shared = self.flows.shared
        if shared is None:
            return self._waiting.pop(_key(state), None)
        record = await shared.take(_SIGN_IN + _key(state).hex())
        if record is None:
            return None
        try:
            return _SigningIn(
                **{
                    **record,
                    "client": ClientCredentials(**record["client"]),
                    "user": Principal(**record["user"]),
                    "expires_at": self.clock() + 1.0,  # (the store let it go when it was due)
                }
            )
        except (KeyError, TypeError):
            return None


_SIGN_IN = "oauth-sign-in:"  # sha256(state) -> the sealed sign-in (with [cluster] store)
_SIGN_INS_BEGUN = "oauth-sign-ins-begun:"  # sha256(flow) -> how many sign-ins it began


def _key(state: str) -> bytes:
    return hashlib.sha256(state.encode("utf-8", "surrogatepass")).digest()


class ConnectPages:
    """The connect page (GET shows it, POST is its button) and the sign-in's return path."""

    def __init__(
        self,
        flows: AuthorizationFlows,
        sessions: BrowserSessions,
        *,
        connect_path: str,
        sign_in_path: str,
        front: FrontSignIn | None,
    ) -> None:
        self.flows = flows
        self.sessions = sessions
        self.connect_path = connect_path
        self.sign_in_path = sign_in_path
        self.front = front
        self.failures = LogSummary(log, logging.WARNING, FAILURE_LOG_INTERVAL)

    def serves(self, path: str) -> bool:
        return path == self.connect_path or (self.front is not None and path == self.sign_in_path)

    async def handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        if path == self.sign_in_path:
            allowed, handler = "GET", self._signed_in
        elif request.method == "POST":
            allowed, handler = "GET, POST", self._consented
        else:
            allowed, handler = "GET, POST", self._connect
        if request.method not in allowed.split(", "):
            await connection.respond(405, [("allow", allowed), *HTML_HEADERS], page("Method not allowed"))
            return
        query = request.path.partition("?")[2]
        if len(query) > MAX_FORM or len(request.body) > MAX_FORM:
            status = 414 if len(query) > MAX_FORM else 413
            await connection.respond(status, HTML_HEADERS, page("Not granted", "The request is too long."))
            return
        try:
            await handler(connection, request, dict(parse_qsl(query, keep_blank_values=True)))
        except CredentialError as exc:
            self.failures.log(("failed", path), "oauth connect: %s %s: %s", request.method, path, exc)
            await connection.respond(400, HTML_HEADERS, page("Not granted", str(exc)))

    async def _connect(self, connection: HttpConnection, request: Request, query: dict[str, str]) -> None:
        pending = await self._waiting(query)
        session = self.sessions.read(request.headers)
        cookies: list[tuple[str, str]] = []
        if session is None or (self.front is not None and session.principal is None):
            session = session or self.sessions.new()
            cookies.append(self.sessions.set_cookie(session))
        if self.front is not None and session.principal is None:
            url = await self.front.begin(pending.principal, session, pending.flow)
            await connection.respond(303, [("location", url), *cookies, *HTML_HEADERS], page("Sign in first"))
            return
        if self.front is not None and session.principal != pending.principal:
            await self._another_user(connection, pending, session)
            return
        token = self.sessions.csrf_token(session, pending.flow)
        form = (
            f'<form method="post" action="{html.escape(self.connect_path)}">'
            f'<input type="hidden" name="flow" value="{html.escape(pending.flow)}">'
            f'<input type="hidden" name="csrf" value="{html.escape(token)}">'
            '<button type="submit" id="connect">Continue</button></form>'
        )
        user = str(pending.principal) if self.front is not None else "you"
        text = (
            f"The aggregator asks to use server {pending.server!r} as {user}. Continue to that server's"
            " authorization server to grant it access."
        )
        await connection.respond(200, [*cookies, *HTML_HEADERS], page("Grant access", text, form=form))

    async def _consented(self, connection: HttpConnection, request: Request, query: dict[str, str]) -> None:
        if not request.headers.get("content-type", "").lower().startswith("application/x-www-form-urlencoded"):
            raise CredentialError("the consent form was not sent as a form")
        form = dict(parse_qsl(request.body.decode("utf-8", "replace"), keep_blank_values=True))
        pending = await self._waiting(form)
        session = self.sessions.read(request.headers)
        if session is None or not self.sessions.csrf_good(session, pending.flow, form.get("csrf", "")):
            self.failures.log(
                ("no token", pending.server),
                "oauth connect: server %s: a consent without this browser's token; refused",
                pending.server,
            )
            await connection.respond(
                403, HTML_HEADERS, page("Not granted", "This form did not come from this browser's connect page.")
            )
            return
        if self.front is not None and session.principal != pending.principal:
            await self._another_user(connection, pending, session)
            return
        url = await self.flows.bind(pending.flow, session.id)
        if url is None:
            raise CredentialError("this authorization is unknown, already used or expired; start again")
        log.info("server %s: %s goes to the authorization server", pending.server, pending.principal)
        await connection.respond(303, [("location", url), *HTML_HEADERS], page("Continue"))

    async def _signed_in(self, connection: HttpConnection, request: Request, query: dict[str, str]) -> None:
        assert self.front is not None
        session = self.sessions.read(request.headers)
        if session is None:
            raise CredentialError("this browser has no session with the aggregator; open your link again")
        principal, flow = await self.front.complete(query, session)
        signed_in = self.sessions.new(principal)
        log.info("oauth connect: %s signed in", principal)
        location = self.connect_path + "?" + urlencode({"flow": flow})
        cookie = self.sessions.set_cookie(signed_in)
        await connection.respond(303, [("location", location), cookie, *HTML_HEADERS], page("Signed in"))

    async def _waiting(self, fields: Mapping[str, str]) -> Pending:
        pending = await self.flows.waiting(fields.get("flow", ""))
        if pending is None:
            raise CredentialError("this authorization is unknown, already used or expired; start again")
        return pending

    async def _another_user(self, connection: HttpConnection, pending: Pending, session: BrowserSession) -> None:
        self.failures.log(
            ("another user", pending.principal, session.principal),
            "oauth connect: server %s: a link made for %s was opened by %s; refused",
            pending.server,
            pending.principal,
            session.principal,
        )
        text = "This link was made for another user. Nothing was granted; ask for your own link."
        await connection.respond(403, HTML_HEADERS, page("Not yours", text))

"""The authorization code flow with PKCE that gets a user's own grant for a server that
requires it (MCP authorization; OAuth 2.1).

``begin`` runs when the proxy has no usable token of a user for a server (its 401, or none
in the vault): it finds the server's authorization server (``discovery``), makes sure the
proxy is a client there (a configured client id; else its client ID metadata document when
the authorization server takes them; else dynamic registration, RFC 7591), and returns the
URL the user must open: the proxy's own connect page for this flow (``connect``), never the
authorization server's URL, and nothing in it says who the user is. The connect page makes
sure the browser that opened it is the user's (MCP 2026-07-28, elicitation, "Phishing"),
then ``bind``s the flow to that browser and sends it to the authorization URL.
``complete`` runs when a browser comes back to the callback path with ``code`` and
``state``: it checks that the browser is the one the flow was bound to, the state and the
issuer (RFC 9207), trades the code and the PKCE verifier for tokens and keeps them in the
vault.

A ``state`` is 256 random bits, used once, and bound to the user and the server it was made
for, and (by ``bind``) to one browser session: the tokens it brings are kept for that user
and server only, and only when that browser brings it. A flow expires after
``consent_timeout``; at most ``MAX_PENDING`` wait at once (per user:
``MAX_PENDING_PER_USER``), so nobody can fill the table. Codes, verifiers and tokens are
never logged.

With ``[cluster] store`` the flows are kept there instead (``shared.SharedFlows``: sealed,
expiring with ``consent_timeout``, taken once with ``GETDEL``), so the link and the callback
are served by any replica; a user may begin at most ``MAX_PENDING`` within one
``consent_timeout``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import attrs

from aggregator.config import ServerConfig
from aggregator.config.upstream_auth import CredentialsConfig
from aggregator.credentials.discovery import (
    ServerMetadata,
    authorization_server,
    canonical_resource,
    parse_challenge,
    protected_resource,
)
from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import ConsentRequired, CredentialError, UnsafeUrl
from aggregator.credentials.shared import SharedFlows, Vault
from aggregator.credentials.tokens import ClientCredentials, request_tokens
from aggregator.credentials.urls import url_refusal
from aggregator.credentials.vault import Grant

log = logging.getLogger(__name__)
MAX_PENDING = 1024
MAX_PENDING_PER_USER = 8
CLIENT_NAME = "mcp-aggregator"


@attrs.frozen(kw_only=True)
class Pending:
    """One authorization on its way: what the callback needs to finish it."""

    principal: Principal
    server: str
    verifier: str = attrs.field(repr=False)
    issuer: str
    iss_parameter: bool
    token_endpoint: str
    revocation_endpoint: str | None
    client: ClientCredentials
    resource: str
    scope: str
    expires_at: float
    # How a client that was asked by URL elicitation names it (not the state).
    elicitation_id: str = ""
    # The connect page's name for it (in the URL the user is given; not the state).
    flow: str = ""
    # Where the connect page sends the user's browser: the authorization server's URL.
    authorize_url: str = attrs.field(default="", repr=False)
    # The browser session that passed the connect page (``browser``); None: none yet.
    browser: str | None = attrs.field(default=None, repr=False)


def pkce_pair() -> tuple[str, str]:
    """A PKCE code verifier (RFC 7636, 43-128 characters) and its S256 challenge."""
    verifier = secrets.token_urlsafe(64)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class AuthorizationFlows:
    def __init__(
        self,
        vault: Vault,
        fetcher: Fetcher,
        settings: CredentialsConfig,
        redirect_uri: str,
        *,
        connect_url: str = "",
        sign_in_uri: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        shared: SharedFlows | None = None,
    ) -> None:
        self.vault = vault
        # [cluster] store: the flows live there (any replica serves the link and the
        # callback), not in ``_pending``.
        self.shared = shared
        self.fetcher = fetcher
        self.settings = settings
        self.redirect_uri = redirect_uri
        # The connect page's URL as browsers reach it, and the front sign-in's return
        # (registered with the callback, so one registration serves both).
        self.connect_url = connect_url
        self.sign_in_uri = sign_in_uri
        self.clock = clock
        self.wall_clock = wall_clock
        # sha256(state) -> its flow, oldest first: a state is looked up by its hash, so how
        # long a lookup takes says nothing of how much of a guessed state was right.
        self._pending: OrderedDict[bytes, Pending] = OrderedDict()
        self._flows: dict[bytes, bytes] = {}  # sha256(flow) -> sha256(its state)
        self._registered: dict[str, ClientCredentials] = {}  # issuer -> the client registered there
        # Told of each authorization completed, its tokens in the vault (the hub tells the
        # client that was asked: ``notifications/elicitation/complete``).
        self.listeners: list[Callable[[Pending], None]] = []

    # --- the URL a user opens --------------------------------------------------------------

    async def begin(self, principal: Principal, server: ServerConfig, challenge: str | None = None) -> ConsentRequired:
        """Start an authorization of ``principal`` for ``server``; what to tell the user
        (the URL to open). ``challenge``: the server's ``WWW-Authenticate``, if it sent one."""
        assert server.url is not None
        params = parse_challenge(challenge)
        resource = await protected_resource(self.fetcher, server.url, params)
        issuer = resource.authorization_servers[0]
        metadata = await authorization_server(self.fetcher, issuer)
        if metadata.authorization_endpoint is None:
            raise CredentialError(f"server {server.name!r}: its authorization server has no authorization_endpoint")
        if "S256" not in metadata.code_challenge_methods:
            raise CredentialError(
                f"server {server.name!r}: its authorization server does not say it supports PKCE with S256"
                " (code_challenge_methods_supported), so it is not used"
            )
        client = await self.client_at(
            metadata,
            f"server {server.name!r}",
            f"servers.{server.name}.oauth.client_id",
            server.oauth.client_id,
            server.oauth.client_secret,
        )
        scope = " ".join(server.oauth.scopes) or params.get("scope") or " ".join(resource.scopes_supported)
        verifier, code_challenge = pkce_pair()
        state = secrets.token_urlsafe(32)
        elicitation_id = secrets.token_urlsafe(16)
        flow = secrets.token_urlsafe(24)
        if self.shared is None:
            self._admit(principal)
        else:
            await self._admit_shared(principal)
        pending = Pending(
            principal=principal,
            server=server.name,
            verifier=verifier,
            issuer=metadata.issuer,
            iss_parameter=metadata.iss_parameter,
            token_endpoint=metadata.token_endpoint,
            revocation_endpoint=metadata.revocation_endpoint,
            client=client,
            resource=canonical_resource(server.url),
            scope=scope,
            expires_at=self.clock() + self.settings.consent_timeout,
            elicitation_id=elicitation_id,
            flow=flow,
        )
        query = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": self.redirect_uri,
            "code_challenge": code_challenge,
            "code_challenge_method": "S256",
            "state": state,
            "resource": canonical_resource(server.url),
        }
        if scope:
            query["scope"] = scope
        endpoint = metadata.authorization_endpoint
        url = endpoint + ("&" if urlsplit(endpoint).query else "?") + urlencode(query)
        if (refusal := url_refusal(url)) is not None:
            raise UnsafeUrl(f"server {server.name!r}: the authorization URL {refusal}")
        pending = attrs.evolve(pending, authorize_url=url)
        if self.shared is None:
            self._pending[_state_key(state)] = pending
            self._flows[_state_key(flow)] = _state_key(state)
        else:
            ttl = self.settings.consent_timeout
            await self.shared.put(_FLOW + _state_key(state).hex(), self._record(pending), ttl=ttl)
            await self.shared.put_text(_FLOW_NAME + _state_key(flow).hex(), _state_key(state).hex(), ttl=ttl)
        log.info("server %s: %s is asked to grant access", server.name, principal)
        connect = self.connect_url + ("&" if urlsplit(self.connect_url).query else "?") + urlencode({"flow": flow})
        return ConsentRequired(server.name, connect, elicitation_id)

    # --- the connect page ---------------------------------------------------------------------

    async def waiting(self, flow: str) -> Pending | None:
        """The flow the connect page names, if it still waits (not used, not expired)."""
        if self.shared is not None:
            state_hex = await self.shared.get_text(_FLOW_NAME + _state_key(flow).hex())
            record = None if state_hex is None else await self.shared.get(_FLOW + state_hex)
            pending = None if record is None else self._pending_of(record)
        else:
            state = self._flows.get(_state_key(flow))
            pending = self._pending.get(state) if state is not None else None
        if pending is None or pending.expires_at <= self.clock():
            return None
        return pending

    async def bind(self, flow: str, browser: str) -> str | None:
        """Bind a waiting flow to the browser session that passed the connect page (the
        callback takes it from that browser only; the latest to pass wins); the URL to send
        that browser to, or None if the flow no longer waits."""
        pending = await self.waiting(flow)
        if pending is None:
            return None
        if self.shared is not None:  # beside the flow, which is never written again (a used one stays used)
            left = max(pending.expires_at - self.clock(), 0.001)
            state_hex = await self.shared.get_text(_FLOW_NAME + _state_key(flow).hex())
            if state_hex is None:
                return None
            await self.shared.put_text(_BROWSER + state_hex, _state_key(browser).hex(), ttl=left)
            return pending.authorize_url
        self._pending[self._flows[_state_key(flow)]] = attrs.evolve(pending, browser=browser)
        return pending.authorize_url

    def _record(self, pending: Pending) -> dict[str, object]:
        """A flow as the store keeps it (sealed by ``shared``): its expiry by the wall clock."""
        record = attrs.asdict(pending)
        record["expires_at"] = self.wall_clock() + (pending.expires_at - self.clock())
        return record

    def _pending_of(self, record: dict[str, Any]) -> Pending | None:
        try:
            return Pending(
                **{
                    **record,
                    "principal": Principal(**record["principal"]),
                    "client": ClientCredentials(**record["client"]),
                    "expires_at": self.clock() + (float(record["expires_at"]) - self.wall_clock()),
                }
            )
        except (KeyError, TypeError, ValueError):
            return None

    async def _admit_shared(self, principal: Principal) -> None:
        """Bound what one user begins in the store: at most ``MAX_PENDING`` within one
        ``consent_timeout`` (each expires with it)."""
        ttl = self.settings.consent_timeout
        user = hashlib.sha256(f"{principal.issuer}\n{principal.subject}".encode()).hexdigest()
        assert self.shared is not None
        if await self.shared.count(_BEGUN + user, ttl=ttl) > MAX_PENDING:
            raise CredentialError("too many authorizations were begun for this user; try again later")

    def _drop(self, state: bytes) -> Pending | None:
        pending = self._pending.pop(state, None)
        if pending is not None:
            self._flows.pop(_state_key(pending.flow), None)
        return pending

    def _admit(self, principal: Principal) -> None:
        """Room for one more pending authorization: the expired ones go, then the user's
        oldest past their share, then the oldest of all past the total."""
        now = self.clock()
        for state in [s for s, pending in self._pending.items() if pending.expires_at <= now]:
            self._drop(state)
        mine = [s for s, pending in self._pending.items() if pending.principal == principal]
        for state in mine[: max(0, len(mine) - MAX_PENDING_PER_USER + 1)]:
            self._drop(state)
        while len(self._pending) >= MAX_PENDING:
            self._drop(next(iter(self._pending)))

    async def client_at(
        self, metadata: ServerMetadata, who: str, setting: str, client_id: str | None, client_secret: str | None
    ) -> ClientCredentials:
        """The proxy's client at this authorization server, in the spec's order of preference
        (``client_id``: one configured; ``who`` needs it and ``setting`` configures one, for
        the errors)."""
        if client_id is not None:
            return ClientCredentials(client_id=client_id, client_secret=client_secret)
        if self.settings.client_metadata_url is not None and metadata.client_id_metadata_documents:
            return ClientCredentials(client_id=self.settings.client_metadata_url)
        known = self._registered.get(metadata.issuer)
        if known is not None:
            return known
        if metadata.registration_endpoint is None:
            raise CredentialError(
                f"{who}: its authorization server offers no way to register the proxy"
                " (no client ID metadata documents, no registration_endpoint);"
                f" set {setting}"
            )
        answer = await self.fetcher.post_json(
            metadata.registration_endpoint,
            {
                "client_name": CLIENT_NAME,
                "redirect_uris": [self.redirect_uri, *([self.sign_in_uri] if self.sign_in_uri else [])],
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
            },
            "dynamic client registration",
        )
        client_id = answer.body.get("client_id")
        if answer.status not in (200, 201) or not isinstance(client_id, str) or not client_id:
            raise CredentialError(f"{who}: dynamic client registration failed (HTTP {answer.status})")
        secret = answer.body.get("client_secret")
        client = ClientCredentials(client_id=client_id, client_secret=secret if isinstance(secret, str) else None)
        self._registered[metadata.issuer] = client
        return client

    # --- the user comes back -----------------------------------------------------------------

    async def complete(self, query: Mapping[str, str], browser: str | None) -> Pending:
        """Finish the authorization the callback's ``query`` answers, brought by the browser
        session ``browser`` (None: a browser without one): tokens in the vault; the
        authorization it was. A state not pending (made up, used, expired), or brought by
        another browser than the one that passed the connect page, is refused (and used)."""
        state = query.get("state", "")
        if self.shared is not None:
            state_hex = _state_key(state).hex()
            record = await self.shared.take(_FLOW + state_hex)  # once: of two replicas, one gets it
            pending = None if record is None else self._pending_of(record)
            bound = await self.shared.take_text(_BROWSER + state_hex)
            if pending is not None:
                await self.shared.delete(_FLOW_NAME + _state_key(pending.flow).hex())
                pending = attrs.evolve(pending, browser=bound)
                browser = None if browser is None else _state_key(browser).hex()
        else:
            pending = self._drop(_state_key(state))
        if pending is None:
            raise CredentialError("this authorization is unknown, already used or expired; start again")
        if pending.expires_at <= self.clock():
            raise CredentialError("this authorization has expired; start again")
        if pending.browser is None or browser is None or not secrets.compare_digest(pending.browser, browser):
            log.warning(
                "server %s: an answer for %s came to a browser that did not pass the connect page for it; refused",
                pending.server,
                pending.principal,
            )
            raise CredentialError(
                "this browser did not open the link this authorization was started with; nothing was granted"
                " (open the link you were given, in this browser, and start again)"
            )
        iss = query.get("iss")
        if iss is not None and iss != pending.issuer:  # RFC 9207 2.4, compared as strings
            raise CredentialError("the answer does not come from the authorization server it was sent to")
        if iss is None and pending.iss_parameter:
            raise CredentialError("the authorization server's answer lacks its iss parameter")
        if "error" in query:
            code = query["error"] if query["error"].isascii() and len(query["error"]) < 64 else "error"
            raise CredentialError(f"server {pending.server!r}: access was not granted ({code})")
        code = query.get("code", "")
        if not code:
            raise CredentialError("the authorization server's answer has no code")
        tokens = await request_tokens(
            self.fetcher,
            pending.token_endpoint,
            {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": self.redirect_uri,
                "code_verifier": pending.verifier,
                "resource": pending.resource,
            },
            pending.client,
            f"server {pending.server!r}: exchanging the authorization code",
            now=self.wall_clock(),
        )
        if not _same_user(tokens.access_token, pending.principal):
            log.warning(
                "server %s: a grant for %s was given by another user; refused", pending.server, pending.principal
            )
            raise CredentialError(
                "this authorization was started by another user; the tokens are not kept (open your own link)"
            )
        await self.vault.put(
            Grant(
                principal=pending.principal,
                server=pending.server,
                tokens=tokens if tokens.scope or not pending.scope else attrs.evolve(tokens, scope=pending.scope),
                token_endpoint=pending.token_endpoint,
                revocation_endpoint=pending.revocation_endpoint,
                client=pending.client,
                resource=pending.resource,
            )
        )
        log.info("server %s: %s granted access", pending.server, pending.principal)
        for listener in self.listeners:
            listener(pending)
        return pending

    @property
    def pending_count(self) -> int:
        return len(self._pending)


_FLOW = "oauth-flow:"  # sha256(state) -> the sealed flow
_FLOW_NAME = "oauth-flow-name:"  # sha256(flow) -> sha256(state), as hex
_BROWSER = "oauth-flow-browser:"  # sha256(state) -> sha256(the bound browser's session id)
_BEGUN = "oauth-flows-begun:"  # sha256(user) -> how many flows were begun within consent_timeout


def _state_key(state: str) -> bytes:
    return hashlib.sha256(state.encode("utf-8", "surrogatepass")).digest()


def _same_user(access_token: str, principal: Principal) -> bool:
    """False when the granted token names, at the principal's own issuer, another subject:
    a user who opened someone else's authorization URL would otherwise have their grant
    kept as that other user's (a confused deputy). A token that is not a JWT, or from
    another issuer (a third party's own accounts), cannot be compared and is taken: its
    ``state`` was bound to the principal that started it."""
    parts = access_token.split(".")
    if len(parts) != 3:
        return True
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return True
    if type(claims) is not dict or claims.get("iss") != principal.issuer:
        return True
    return claims.get("sub") == principal.subject

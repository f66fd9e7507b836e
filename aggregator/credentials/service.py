"""``UserCredentials``: what the rest of the proxy asks of this package, one object built
from the config at start (``open``).

- ``authorization(principal, server, subject_token)``: the ``Authorization`` header value
  to send ``server`` for that user, or ``ConsentRequired`` (the URL the user must open)
  when there is no token yet;
- ``unauthorized(...)``: the server answered 401 anyway: what it held is dropped and a new
  grant is begun;
- ``bearer(...)``: both, as an ``httpx.Auth`` for an upstream's HTTP client;
- ``callback``: the OAuth paths the HTTP endpoint serves (the callback, the connect page
  and the sign-in's return, ``callback.OAuthCallback``);
- ``tokens.revoke`` and ``vault.entries``: ``aggregator auth revoke`` and ``auth list``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from urllib.parse import urlsplit, urlunsplit

import httpx

from aggregator.config import Config, ServerConfig
from aggregator.config.upstream_auth import CredentialsConfig, vault_key_bytes
from aggregator.config.validation import parse_listen
from aggregator.core.settings import SigningKeys
from aggregator.credentials.authorization import AuthorizationFlows
from aggregator.credentials.browser import BrowserSessions
from aggregator.credentials.callback import OAuthCallback
from aggregator.credentials.connect import ConnectPages, FrontSignIn, TokenCheck
from aggregator.credentials.exchange import TokenExchange
from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.keeper import UserTokens
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import ConsentRequired, CredentialError
from aggregator.credentials.shared import SharedFlows, SharedStore, StoreVault, Vault
from aggregator.credentials.vault import TokenVault
from aggregator.errors import ConfigError


def redirect_uri(config: Config, listen: str | None) -> str:
    """Where the authorization server sends users back: ``credentials.redirect_uri``, or
    the callback path on the HTTP listener."""
    settings = config.credentials
    if settings.redirect_uri is not None:
        return settings.redirect_uri
    listen = listen or config.http.listen
    if listen is None:
        raise ConfigError(
            "credentials.redirect_uri: required when the proxy has no HTTP listener (http.listen or --http):"
            f" the authorization server sends users back to its {settings.callback_path}"
        )
    host, port = parse_listen(listen)
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{port}{settings.callback_path}"


def oauth_paths(callback_path: str) -> tuple[str, str, str]:
    """The connect page's path, the sign-in's return path (both beside the callback), and
    the directory they share (the session cookie's Path)."""
    directory = callback_path.rsplit("/", 1)[0]
    return f"{directory}/connect", f"{directory}/signed-in", directory or "/"


def beside(url: str, path: str) -> str:
    """``url`` (the redirect URI) with its last path segment replaced by ``path``'s."""
    parts = urlsplit(url)
    directory = parts.path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, f"{directory}/{path.rsplit('/', 1)[1]}", "", ""))


def refresh_lock_seconds(settings: CredentialsConfig) -> float:
    """How long a replica may hold a grant while it refreshes it (``shared``): the token
    request's bound, and some."""
    return 2 * settings.fetch_timeout + 5.0


def check_vault(config: Config, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ConfigError naming ``credentials.vault`` unless the vault can be opened, when a
    server keeps users' tokens in it (blocks: before the proxy runs, as the config is read).
    With ``[cluster] store`` the grants are kept there, and the file is not used."""
    if not any(server.auth == "oauth" for server in config.enabled_servers) or config.cluster.store is not None:
        return
    try:
        TokenVault.check(config.credentials.vault, vault_key_bytes(config.credentials, environ))
    except CredentialError as exc:
        raise ConfigError(f"credentials.vault: {exc}") from None


class UserCredentials:
    def __init__(
        self,
        fetcher: Fetcher,
        exchange: TokenExchange,
        vault: Vault | None = None,
        tokens: UserTokens | None = None,
        flows: AuthorizationFlows | None = None,
        callback: OAuthCallback | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.exchange = exchange
        self.vault = vault
        self.tokens = tokens
        self.flows = flows
        self.callback = callback

    @classmethod
    async def open(
        cls,
        config: Config,
        client: httpx.AsyncClient,
        *,
        listen: str | None = None,
        environ: Mapping[str, str],
        resolve: bool = True,
        verifier: TokenCheck | None = None,
        store: SharedStore | None = None,
        browser_key: bytes | None = None,
        flow_keys: SigningKeys | None = None,
    ) -> UserCredentials:
        """Built from the config; the vault opened when a server keeps tokens in it.
        ``verifier``: the proxy's token verifier, required with ``[auth]`` (the connect page
        signs browsers in at its issuers and checks the token it gets with it).
        ``store`` (``[cluster] store``): users' grants, flows and sign-ins are kept there,
        the flows sealed with ``flow_keys``, for every replica; ``browser_key`` (from
        ``[cluster] keys``): what signs the browser cookie, so that every replica reads it."""
        settings = config.credentials
        fetcher = Fetcher(
            client, timeout=settings.fetch_timeout, max_bytes=settings.max_response_bytes, resolve=resolve
        )
        exchange = TokenExchange(fetcher, margin=settings.refresh_margin)
        if not any(server.auth == "oauth" for server in config.enabled_servers):
            return cls(fetcher, exchange)
        key = vault_key_bytes(settings, environ)
        if key is None:  # (refused at load; the environment may have changed since)
            raise ConfigError("credentials.vault_key: required (or AGGREGATOR_VAULT_KEY): 32 bytes in base64")
        vault: Vault
        if store is not None:
            vault = StoreVault(store, key, lock_seconds=refresh_lock_seconds(settings))
        else:
            try:
                vault = await TokenVault.open(settings.vault, key)
            except CredentialError as exc:  # (checked at start; the file may have changed since)
                raise ConfigError(f"credentials.vault: {exc}") from None
        tokens = UserTokens(vault, fetcher, margin=settings.refresh_margin)
        back = redirect_uri(config, listen)
        connect_path, sign_in_path, directory = oauth_paths(settings.callback_path)
        auth = config.auth
        sign_in_uri = beside(back, sign_in_path) if auth.enabled else None
        shared = None
        if store is not None:
            shared = SharedFlows(store, flow_keys or SigningKeys.fresh())
        flows = AuthorizationFlows(
            vault,
            fetcher,
            settings,
            back,
            connect_url=beside(back, connect_path),
            sign_in_uri=sign_in_uri,
            shared=shared,
        )
        front = None
        if auth.enabled:
            if verifier is None:
                raise TypeError("UserCredentials.open: a proxy with [auth] needs its token verifier")
            assert sign_in_uri is not None
            front = FrontSignIn(
                flows,
                verifier,
                issuers=[issuer.issuer for issuer in auth.issuers],
                resource=auth.resource,
                scopes=auth.required_scopes,
                redirect_uri=sign_in_uri,
                client_id=settings.sign_in_client_id,
                client_secret=settings.sign_in_client_secret,
            )
        # The cookie's key: the cluster's, or one drawn now for this process (``browser``).
        sessions = BrowserSessions(path=directory, secure=back.lower().startswith("https://"), key=browser_key)
        pages = ConnectPages(flows, sessions, connect_path=connect_path, sign_in_path=sign_in_path, front=front)
        callback = OAuthCallback(flows, settings.callback_path, sessions, pages)
        return cls(fetcher, exchange, vault, tokens, flows, callback)

    async def aclose(self) -> None:
        if self.vault is not None:
            await self.vault.aclose()

    async def authorization(
        self, principal: Principal | None, server: ServerConfig, subject_token: str | None = None
    ) -> str:
        """The ``Authorization`` value for ``server`` on behalf of ``principal`` (None: a
        caller with no access token, who cannot be acted for)."""
        if principal is None:
            raise CredentialError(
                f"server {server.name!r} acts as each user, and this session has no user: connect with an OAuth"
                " access token (the proxy's [auth]) to use it"
            )
        if server.auth == "token-exchange":
            if subject_token is None:
                raise CredentialError(f"server {server.name!r} needs the caller's own access token to exchange")
            return "Bearer " + await self.exchange.token_for(principal, subject_token, server)
        if server.auth != "oauth" or self.tokens is None or self.flows is None:
            raise CredentialError(f"server {server.name!r} does not take users' own credentials")
        token = await self.tokens.access_token(principal, server.name)
        if token is None:
            raise await self.flows.begin(principal, server)
        return "Bearer " + token

    async def unauthorized(
        self, principal: Principal | None, server: ServerConfig, challenge: str | None
    ) -> CredentialError:
        """The server refused what was sent (401): forget it; what to tell the user."""
        if principal is None:
            return CredentialError(f"server {server.name!r} refused the credential")
        if server.auth == "token-exchange":
            self.exchange.forget(principal, server.name)
            return CredentialError(f"server {server.name!r} refused the exchanged token")
        if self.vault is None or self.flows is None:
            return CredentialError(f"server {server.name!r} refused the credential")
        if self.tokens is not None:
            await self.tokens.forget(principal, server.name)  # (a refreshed grant not stored yet too)
        else:
            await self.vault.forget(principal, server.name)
        try:
            return await self.flows.begin(principal, server, challenge)
        except CredentialError as exc:
            return exc

    def bearer(self, principal: Principal | None, server: ServerConfig, subject_token: str | None = None) -> UserBearer:
        return UserBearer(self, principal, server, subject_token)


class UserBearer(httpx.Auth):
    """An upstream HTTP client's ``auth``: each request carries the user's token; a 401
    raises what to tell the user (``ConsentRequired`` with the URL to open, most often).

    An exchanged token the server refuses (401) is exchanged again once, at once: it may
    have been revoked or its keys rotated, and the caller's own token may still be good.
    ``subject_token`` is the caller's latest access token (its session updates it);
    ``url_elicitation``: its client takes a URL-mode elicitation (how a grant is asked for)."""

    def __init__(
        self,
        credentials: UserCredentials,
        principal: Principal | None,
        server: ServerConfig,
        subject_token: str | None,
    ) -> None:
        self.credentials = credentials
        self.principal = principal
        self.server = server
        self.subject_token = subject_token
        self.url_elicitation = False
        # Told when the user is asked for a grant (the hub remembers which client to tell
        # when it is given).
        self.on_consent: Callable[[ConsentRequired], None] | None = None

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        raise RuntimeError("UserBearer works with httpx.AsyncClient only")

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        request.headers["authorization"] = await self._authorization()
        response = yield request
        if response.status_code == 401 and self.server.auth == "token-exchange" and self.principal is not None:
            await response.aread()
            self.credentials.exchange.forget(self.principal, self.server.name)
            request.headers["authorization"] = await self._authorization()
            response = yield request
        if response.status_code == 401:
            raise self._asked(
                await self.credentials.unauthorized(
                    self.principal, self.server, response.headers.get("www-authenticate")
                )
            )

    async def _authorization(self) -> str:
        try:
            return await self.credentials.authorization(self.principal, self.server, self.subject_token)
        except ConsentRequired as asked:
            raise self._asked(asked) from None

    def _asked(self, problem: CredentialError) -> CredentialError:
        if isinstance(problem, ConsentRequired) and self.on_consent is not None:
            self.on_consent(problem)
        return problem


__all__ = ["ConsentRequired", "CredentialError", "UserBearer", "UserCredentials", "redirect_uri"]

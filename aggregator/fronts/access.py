"""Who may use the network endpoints, and the admission path every network front takes.

Shared by the Streamable HTTP, legacy SSE and WebSocket endpoints, so every way in is
checked the same way, before anything else happens: Host and Origin against their
allowlists, then the bearer token (``check_access``, awaited: an access token may need its
issuer's keys fetched); the token names a principal (a static token's index, or an access
token's ``Principal``), and the principal and the profile the path names give the
session's profile (``choose_profile``); ``admit`` is both steps for a request that also
names a path. A front only turns a ``Denial`` into its own kind of answer (an HTTP
response, a rejected WebSocket handshake); the rules themselves are the ``AccessPolicy``'s.
The caps every front counts against are the hub's (``aggregator.hub.caps.Admission``).

DNS rebinding makes a hostile page's
Origin and Host name the attacker's domain, so "Origin equals Host" proves nothing: both
are checked against allowlists (by default loopback names, any port). Tokens are compared
in constant time, never taken from a URL, never logged.

Two kinds of bearer token, side by side: the static ones of the config (``http.auth_tokens``,
a profile's ``tokens``), whose principal is the token's index, and, with ``[auth]``, OAuth
access tokens checked by the ``TokenVerifier`` (``fronts.authorization``), whose principal
is a ``Principal``. Checking an access token may fetch its issuer's keys, so the check on
every front is ``await check(...)``; it leaves the token's principal cached, where the
later, synchronous steps of the same request (``principal``, the profile) read it (known to
them a few seconds after the check however briefly its check is trusted: with
``introspection_cache_seconds = 0`` the token is asked about on every request, and each
request goes on with the answer it got). With
``[auth]``, a token in the URL's query (``access_token=``) is refused outright, and every
401 or 403 carries the challenge that points clients at the metadata (RFC 9728).

Refusals the access check makes (``Denial.level`` WARNING) are logged through
``note_refusal``: the first of each kind (its status and reason) on each front at once,
then at most one per ``REFUSAL_LOG_INTERVAL`` with the count of those held back, so junk
tokens sent in a loop (a token's refusal reasons are a few fixed texts) cannot flood the log.

A connection that outlives its request holds the token it was opened with (a WebSocket
session, a Streamable HTTP GET stream, a legacy SSE stream): ``TokenHold`` ends it when
that token's ``exp`` (and the leeway) passes, and, for an introspected token, when asking
again (every ``recheck_interval``) says it is no longer good; the client comes back with
its new token.

Also owns the rule applied before any listener opens (``check_exposure``): no listening
beyond loopback without tokens, unless the config says the network is trusted.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from aggregator.config import AuthConfig, HttpConfig, parse_listen
from aggregator.errors import ConfigError
from aggregator.fronts.authorization import Principal, Rejection, challenge
from aggregator.log_summary import LogSummary
from aggregator.telemetry.recent_errors import REFUSAL

if TYPE_CHECKING:
    from aggregator.fronts.authorization.tokens import TokenVerifier

log = logging.getLogger(__name__)

# A refusal: HTTP status, the reason told the client, extra headers.
Refused = tuple[int, str, list[tuple[str, str]]]
REFUSAL_LOG_INTERVAL = 10.0  # seconds: at most one refusal line of a kind per front this often


def check_exposure(
    config: HttpConfig,
    listen: str,
    option: str = "--http",
    token_keys: str = "http.auth_tokens",
    *,
    oauth: bool = False,
) -> None:
    """Refuse to serve beyond loopback without authentication, unless told to.

    ``option`` names where ``listen`` came from (``--http``, ``http.listen``) for the
    message, ``token_keys`` the keys that would set tokens for it; raises ConfigError for
    an address that cannot be parsed or may not be used.
    """
    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not config.auth_tokens and not oauth and not config.allow_unauthenticated_remote:
        raise ConfigError(
            f"refusing to serve on {host} without authentication: set {token_keys}, or"
            " http.allow_unauthenticated_remote = true if the network is trusted"
        )


class Admitted(NamedTuple):
    """Who a request admitted by the access rules is, and the profile its session gets."""

    principal: int | Principal | None  # which configured token it carries, whose access token (None without)
    profile: str


class Denial(NamedTuple):
    """Why a request may not get in: an HTTP status, a reason for the client, extra headers,
    and the level every front logs it at (``level``): WARNING for what the access check
    refuses (a foreign Host or Origin, a missing or wrong token: someone may be probing),
    DEBUG for a client at the wrong place (a path that is no endpoint, a profile its token
    does not give), which says nothing about security and would only fill the log."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    level: int = logging.WARNING


async def check_access(access: AccessPolicy, headers: Mapping[str, str], target: str = "") -> Denial | None:
    """The first step on every front, before anything else: Host (421), Origin (403), then
    the bearer token when tokens are configured (401; 403 for an access token without a
    required scope; 503 when its issuer's keys cannot be had). ``target``: the request's
    path and query (a token there is refused)."""
    refused = await access.check(headers, target)
    return None if refused is None else Denial(*refused)


def choose_profile(access: AccessPolicy, headers: Mapping[str, str], named: str) -> Admitted | Denial:
    """The principal a request's token names and the profile its session gets: the one the
    path names (``named``, "" for none), if the token (when tokens are used) gives it (else
    403), or the token's own. An access token gives every profile whose rules its claims
    match. Runs after ``check_access``; a token not known good by then (its check neither
    trusted still nor recent: ``tokens.REQUEST_SECONDS``) is a 401, never the default profile."""
    principal = access.principal(headers)
    if principal is None and access.requires_token:
        return Denial(*access.unauthenticated())
    profile = access.profile(principal)
    if named:
        if principal is not None and profile != named:
            if not (isinstance(principal, Principal) and named in principal.profiles):
                return Denial(*access.profile_refusal(principal, named), logging.DEBUG)
        profile = named
    return Admitted(principal, profile)


async def admit(access: AccessPolicy, headers: Mapping[str, str], target: str) -> Admitted | Denial:
    """The whole path for a request that opens a session on the MCP endpoint's path
    (``target``, ``/mcp`` or ``/mcp/<profile>``): the access check, then 404 for a path
    that names no endpoint or profile, then the profile."""
    denial = await check_access(access, headers, target)
    if denial is not None:
        return denial
    named = access.named_profile(target)
    if named is None:
        return Denial(404, f"not found; the MCP endpoint is {access.endpoint}", [], logging.DEBUG)
    return choose_profile(access, headers, named)


class AccessPolicy:
    def __init__(
        self, config: HttpConfig, profiles: Mapping[str, Any] | None = None, auth: AuthConfig | None = None
    ) -> None:
        # Every accepted token, and the profile it selects ("default" for http.auth_tokens).
        pairs = [(token, "default") for token in config.auth_tokens]
        pairs += [(token, name) for name, profile in (profiles or {}).items() for token in profile.tokens]
        self._tokens = [token.encode() for token, _ in pairs]
        self._profiles = [profile for _, profile in pairs]
        # Entries may name a port; the match is on the host name, any port.
        self._hosts = {_hostname(host) for host in config.allowed_hosts}
        self._origins = {_origin(origin) for origin in config.allowed_origins}
        self.endpoint = config.path  # the MCP endpoint's path, under which profiles have theirs
        self._profile_names = frozenset(profiles or ())
        self._profile_scopes = {name: tuple(profile.scopes) for name, profile in (profiles or {}).items()}
        self._seen: dict[tuple[str, Callable[[str], str]], bool] = {}  # (value, its check) -> allowed
        self._refusal_logs: dict[str, LogSummary] = {}  # a front's logger name -> its summary
        # OAuth access tokens ([auth]), checked by the one verifier of the process.
        self.auth = auth if auth is not None and auth.enabled else None
        self.verifier: TokenVerifier | None = None
        if self.auth is not None:
            from aggregator.fronts.authorization.tokens import TokenVerifier  # only with [auth]: joserfc is heavy

            self.verifier = TokenVerifier.shared(self.auth, profiles or {})

    def note_refusal(self, logger: logging.Logger, denial: Denial, message: str, *args: object) -> None:
        """Log a refused request (``message % args``, marked as a refusal): below WARNING as
        it is; at WARNING the first of its kind (status and reason) on this front, then one
        per ``REFUSAL_LOG_INTERVAL`` saying how many more there were."""
        if denial.level < logging.WARNING:
            logger.log(denial.level, message, *args, extra=REFUSAL)
            return
        summary = self._refusal_logs.get(logger.name)
        if summary is None:
            summary = self._refusal_logs[logger.name] = LogSummary(logger, denial.level, REFUSAL_LOG_INTERVAL)
        summary.log((denial.status, denial.reason), message, *args, extra=REFUSAL)

    @property
    def requires_token(self) -> bool:
        """Whether every request must carry a bearer token (static tokens or [auth] are set)."""
        return bool(self._tokens) or self.verifier is not None

    async def check(self, headers: Mapping[str, str], target: str = "") -> Refused | None:
        """Why a request (its ``target``, path and query) may not proceed, or None: Host,
        Origin, then its bearer token, checked with its issuer when it is an access token."""
        if self.verifier is None:
            return self.refusal(headers)
        refused = self._host_and_origin(headers)
        if refused is not None:
            return refused
        if _token_in_query(target):
            return self._challenged(
                401, "invalid_request", "a token in the URL is refused; send it in the Authorization header"
            )
        token = _bearer(headers)
        if token is None:
            return 401, "a valid bearer token is required", [("www-authenticate", self._challenge())]
        if self._static(token) is not None:
            return None
        checked = await self.verifier.verify(token)
        if isinstance(checked, Rejection):
            status, error, description = checked
            if status == 503:
                return 503, description, [("retry-after", "5")]
            return self._challenged(status, error, description)
        return None

    def scope_refusal(self, headers: Mapping[str, str], scopes: tuple[str, ...], what: str) -> Refused | None:
        """A 403 ``insufficient_scope`` naming ``scopes`` when the request's access token
        (``check`` accepted it) lacks one of them, else None (a static token: None).
        ``what`` names what needs them, for the client."""
        principal = self.principal(headers)
        if self.auth is None or not isinstance(principal, Principal) or set(scopes) <= principal.scopes:
            return None
        description = f"the scope {' '.join(scopes)} is required for {what}"
        return (
            403,
            description,
            [("www-authenticate", challenge(self.auth, "insufficient_scope", description, scopes=scopes))],
        )

    def profile_refusal(self, principal: int | Principal | None, name: str) -> Refused:
        """The 403 of a token that does not give profile ``name`` (its path); an access token's
        carries the challenge naming the profile's scopes, so the client can ask for them."""
        description = f"this token does not give access to profile {name!r}"
        if self.auth is None or not isinstance(principal, Principal):
            return 403, description, []
        scopes = self._profile_scopes.get(name) or None
        return (
            403,
            description,
            [("www-authenticate", challenge(self.auth, "insufficient_scope", description, scopes=scopes))],
        )

    def _challenge(self, error: str | None = None, description: str | None = None) -> str:
        assert self.auth is not None
        return challenge(self.auth, error, description)

    def _challenged(self, status: int, error: str, description: str) -> Refused:
        return status, description, [("www-authenticate", self._challenge(error, description))]

    def refusal(self, headers: Mapping[str, str]) -> Refused | None:
        """Why a request may not proceed (status, reason, extra headers), or None, as far as
        a synchronous check can tell: Host, Origin and a static token (an access token is
        checked by ``check``)."""
        refused = self._host_and_origin(headers)
        if refused is not None:
            return refused
        if self._tokens and self.verifier is None and self.principal(headers) is None:
            return 401, "a valid bearer token is required", [("www-authenticate", 'Bearer realm="aggregator"')]
        return None

    def _host_and_origin(self, headers: Mapping[str, str]) -> Refused | None:
        host = headers.get("host", "")
        if not self._allowed(host, self._hosts, _hostname):
            return 421, f"this Host is not served here: {host[:100]!r}", []
        origin = headers.get("origin")
        if origin is not None:
            if not self._allowed(origin, self._origins, _origin):
                return 403, f"this Origin may not use this server: {origin[:100]!r}", []
        return None

    def _allowed(self, value: str, allowed: Any, normal: Callable[[str], str]) -> bool:
        """Whether ``value`` (a Host or Origin) is allowed; the answers for the last few
        values seen are kept (a client sends the same ones with every request)."""
        seen = self._seen
        key = (value, normal)  # (a Host and an Origin of the same spelling are not the same)
        known = seen.get(key)
        if known is None:
            known = normal(value) in allowed
            if len(seen) >= 64:
                seen.clear()
            seen[key] = known
        return known

    def principal(self, headers: Mapping[str, str]) -> int | Principal | None:
        """Who the request's bearer token names: the index of the configured token it is, the
        principal of an access token ``check`` accepted (trusted still, or checked for this
        request), or None
        (also when no tokens are used)."""
        if not self.requires_token:
            return None
        token = _bearer(headers)
        if token is None:
            return None
        found = self._static(token)
        if found is None and self.verifier is not None:
            return self.verifier.cached(token)
        return found

    def access_token(self, headers: Mapping[str, str]) -> str | None:
        """The request's OAuth access token when ``check`` accepted it (its principal is a
        ``Principal``), else None: what a server with ``auth = "token-exchange"`` trades for
        its own token. Kept with the client session, in memory only; never logged or sent on."""
        if self.verifier is None:
            return None
        token = _bearer(headers)
        if token is None or self._static(token) is not None or self.verifier.cached(token) is None:
            return None
        return token

    def _static(self, token: str) -> int | None:
        """Which configured token this is, compared in constant time with every one."""
        found = None
        candidate = token.encode()
        for index, expected in enumerate(self._tokens):
            if hmac.compare_digest(candidate, expected):
                found = index
        return found

    def named_profile(self, target: str) -> str | None:
        """The profile a request's path names: "" for the MCP endpoint itself (``/mcp``), the
        name for ``/mcp/<profile>`` when that profile is configured, None for any other path.
        A query (``?...``) is ignored."""
        path = target.partition("?")[0]
        endpoint = self.endpoint
        if path == endpoint:
            return ""
        if path.startswith(endpoint) and path[len(endpoint) : len(endpoint) + 1] == "/":
            name = path[len(endpoint) + 1 :]
            if name in self._profile_names:
                return name
        return None

    def profile(self, principal: int | Principal | None) -> str:
        """The profile a request's token selects ("default" without tokens)."""
        if principal is None:
            return "default"
        if isinstance(principal, Principal):
            return principal.profile
        return self._profiles[principal]

    def unauthenticated(self) -> Refused:
        """The refusal of a request whose token is not (or no longer) known to be good."""
        header = self._challenge() if self.auth is not None else 'Bearer realm="aggregator"'
        return 401, "a valid bearer token is required", [("www-authenticate", header)]


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, or None (never to be logged)."""
    return _bearer(headers)


async def until_refused(verifier: TokenVerifier, token: str, principal: Principal, what: str) -> str:
    """Ask, every ``recheck_interval``, whether an introspected token a connection holds is
    still good; return why not once it is not (not active, another principal, a required
    scope gone). An issuer that cannot be asked now leaves it as it is until the next time
    (a warning naming ``what``). Never returns for a token nothing rechecks (a JWT)."""
    interval = verifier.recheck_interval(token)
    if interval is None:
        await trio.sleep_forever()
        raise AssertionError("unreachable")
    while True:
        await trio.sleep(interval)
        checked = await verifier.recheck(token)
        if isinstance(checked, Principal):
            if checked == principal:
                continue
            return "it now names another principal"
        if checked.status == 503:
            log.warning("%s: its access token cannot be checked now: %s", what, checked.description)
            continue
        return checked.description


class TokenHold:
    """How long a stream opened by a request may last with that request's access token:
    until its ``exp`` (and the leeway), and, for an introspected token, until asking again
    says it is no longer good. ``watching(wake)`` runs beside the stream and calls
    ``wake`` when the token ends; ``ended`` then says why (None while it holds). Nothing
    ends for a static token or none. The stream ends itself between two writes, so a
    message is never cut in half."""

    def __init__(self, access: AccessPolicy, headers: Mapping[str, str], what: str) -> None:
        self.what = what  # who holds it, for the log ("http session 3")
        token = access.access_token(headers)
        principal = access.principal(headers)
        self._verifier = access.verifier
        self._token = token
        self._principal = principal if token is not None and isinstance(principal, Principal) else None
        self._deadline = math.inf
        if self._principal is not None and self._principal.expires < math.inf:
            self._deadline = trio.current_time() + max(0.0, self._principal.expires - time.time())
        self.ended: str | None = None  # why the token ended the stream

    @asynccontextmanager
    async def watching(self, wake: Callable[[], None]) -> AsyncIterator[None]:
        """Watch the token while the body runs; ``wake`` the stream once it ends."""
        if self._principal is None or self._verifier is None or self._token is None:
            yield
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, self._verifier, self._token, self._principal, wake)
            yield
            nursery.cancel_scope.cancel()

    async def _watch(self, verifier: TokenVerifier, token: str, principal: Principal, wake: Callable[[], None]) -> None:
        with trio.move_on_at(self._deadline):
            refused = await until_refused(verifier, token, principal, self.what)
            self.ended = f"its access token is no longer accepted ({refused})"
        if self.ended is None:
            self.ended = "its access token expired"
        wake()


def _bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, or None."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _token_in_query(target: str) -> bool:
    """Whether a request's URL carries a token in its query (``access_token=``, RFC 6750 2.3)."""
    query = target.partition("?")[2]
    return bool(query) and any(part.partition("=")[0].lower() == "access_token" for part in query.split("&"))


def _origin(origin: str) -> str:
    """ "HTTP://Example.com:8000/" -> "http://example.com"."""
    scheme, _, rest = origin.lower().partition("://")
    return f"{scheme}://{_hostname(rest)}"


def _hostname(host_and_port: str) -> str:
    """ "[::1]:8000" -> "[::1]", "Example.com:80" -> "example.com"."""
    value = host_and_port.strip().lower().split("/", 1)[0]
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return value
        host, rest = value[: end + 1], value[end + 1 :]
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    # A port is one to five ASCII digits; anything else ("127.0.0.1:²") is no host of ours:
    # the value as it is matches no allowlist entry.
    if rest and not (rest[0] == ":" and 1 < len(rest) <= 6 and rest[1:].isascii() and rest[1:].isdigit()):
        return value
    return host

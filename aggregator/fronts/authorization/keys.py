"""An issuer's signing keys (JWKS): found, fetched within bounds, cached, refreshed.

The keys come from ``jwks_uri``, or from the issuer's metadata when it is not given (RFC
8414 ``/.well-known/oauth-authorization-server``, then OpenID Connect discovery); the
metadata must name the same issuer, and the key set's URL it names passes the checks the
proxy's OAuth client makes of every URL a stranger's metadata names (``credentials.urls``,
``discovered_url_problem``): https (http only to loopback), and no private, link-local or
cloud metadata address, named or resolved to; loopback only for an issuer configured there.
No redirect is followed, to any origin.

Bounds, so that an issuer that is slow, huge or down costs a clear refusal and a logged
error, never a hang nor unbounded memory: one fetch is bounded in time (``auth.fetch_timeout``,
in all, however the bytes drip) and size (``MAX_DOCUMENT``), a key set in keys
(``MAX_KEYS``); one fetch at a time per issuer (the others wait for its result); and
fetches are spaced: the keys are fetched again when they are older than
``auth.jwks_cache_seconds``, and for a token whose key id is not known (a rotated key) at
most once per ``auth.jwks_refresh_interval``, so a flood of made-up key ids cannot make
the proxy fetch in a loop. Stale keys keep serving while a refetch fails.

Only asymmetric keys are kept (RSA, EC, OKP; an ``oct`` key would let a public key's bytes
be an HMAC secret), and none marked for encryption. A set may give one key id to several
keys (during a rotation, say): a token with that id is tried with each, up to
``MAX_SAME_KID``, and the set's duplicate ids are logged once.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import trio
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet

from aggregator.config.model import AuthConfig, IssuerConfig
from aggregator.config.validation import oauth_url_problem
from aggregator.credentials.urls import address_refusal, is_loopback, url_refusal

log = logging.getLogger(__name__)

MAX_DOCUMENT = 256 * 1024  # bytes of a key set, metadata or introspection answer
MAX_KEYS = 64
MAX_SAME_KID = 4  # keys of one id a token is tried with
ASYMMETRIC_KEY_TYPES = frozenset({"RSA", "EC", "OKP"})


class FetchError(Exception):
    """A document could not be fetched or read; the message says why (never a token)."""


class KeysUnavailable(Exception):
    """No signing keys of this issuer can be had now (the reason, for the log and the 503)."""


async def fetch_json(
    url: str,
    within: float,
    *,
    form: dict[str, str] | None = None,
    credentials: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """GET (or, with ``form``, POST) ``url`` and read its JSON object, within ``within`` seconds in
    all and ``MAX_DOCUMENT`` bytes; no redirect is followed. Raises FetchError."""
    body = bytearray()
    status = 0
    with trio.move_on_after(within) as scope:
        try:
            async with (
                httpx.AsyncClient(timeout=within, follow_redirects=False) as client,
                client.stream(
                    "POST" if form is not None else "GET",
                    url,
                    data=form,
                    auth=credentials,
                    headers={"accept": "application/json"},
                ) as response,
            ):
                status = response.status_code
                if status == 200:
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > MAX_DOCUMENT:
                            raise FetchError(f"{url}: answer larger than {MAX_DOCUMENT} bytes")
        except httpx.HTTPError as exc:
            raise FetchError(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if scope.cancelled_caught:
        raise FetchError(f"{url}: no complete answer within {within:g}s")
    if status != 200:
        raise FetchError(f"{url}: HTTP status {status}")
    try:
        document = orjson.loads(bytes(body))
    except orjson.JSONDecodeError:
        raise FetchError(f"{url}: the answer is not JSON") from None
    if not isinstance(document, dict):
        raise FetchError(f"{url}: the answer is not a JSON object")
    return document


Resolve = Callable[[str], Awaitable[list[str]]]


async def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to; raises FetchError."""
    try:
        found = await trio.socket.getaddrinfo(host, None, type=trio.socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchError(f"cannot resolve {host[:100]}: {exc.strerror or exc}") from None
    return [str(sockaddr[0]).split("%", 1)[0] for *_, sockaddr in found]


async def discovered_url_problem(url: Any, issuer: str, resolve: Resolve = resolve_host) -> str | None:
    """Why a URL found in ``issuer``'s metadata may not be fetched; None if it may.

    The rules of the proxy's OAuth client (``credentials.urls``): http(s) only, https off
    loopback, no user name or password, no private, link-local, reserved or cloud metadata
    address, whether the URL names it or its host name resolves to it (each address is
    looked up). Loopback only for an issuer that is itself configured on loopback, and a
    URL on the configured issuer's own origin is as trusted as the issuer (an issuer the
    config names on a private address serves its keys there). Raises FetchError when the
    host name cannot be resolved."""
    if not isinstance(url, str):
        return "not a string"
    problem = oauth_url_problem(url)
    if problem is not None:
        return problem
    if _origin(url) == _origin(issuer):
        return None
    problem = url_refusal(url)
    if problem is not None:
        return f"it {problem}"
    host = urlsplit(url).hostname or ""
    loopback_allowed = is_loopback(urlsplit(issuer).hostname or "")
    if is_loopback(host):
        return None if loopback_allowed else "it names a loopback address, and the issuer is not on loopback"
    try:
        ipaddress.ip_address(host)
        return None  # a literal address, checked above
    except ValueError:
        pass
    for found in await resolve(host):
        address = ipaddress.ip_address(found)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback:
            if not loopback_allowed:
                return "its host name resolves to a loopback address, and the issuer is not on loopback"
            continue
        refused = address_refusal(address)
        if refused is not None:
            return f"its host name resolves to {refused}"
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be: RFC 8414 (the well-known path before the issuer's
    path), then OpenID Connect Discovery (after it)."""
    parts = urlsplit(issuer)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


def key_set_of(document: dict[str, Any]) -> tuple[KeySet, frozenset[str | None]]:
    """The usable keys of a JWKS document and their ids; raises FetchError."""
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise FetchError("the key set has no list of keys")
    if len(keys) > MAX_KEYS:
        raise FetchError(f"the key set has {len(keys)} keys, more than {MAX_KEYS}")
    usable = [
        key
        for key in keys
        if isinstance(key, dict) and key.get("kty") in ASYMMETRIC_KEY_TYPES and key.get("use", "sig") == "sig"
    ]
    try:
        key_set = KeySet.import_key_set({"keys": usable})
    except (JoseError, ValueError, TypeError) as exc:
        raise FetchError(f"the key set cannot be read: {type(exc).__name__}") from None
    return key_set, frozenset(key.kid for key in key_set.keys)


class IssuerKeys:
    """One issuer's signing keys, as fetched last, and when to fetch them again."""

    def __init__(self, issuer: IssuerConfig, auth: AuthConfig, clock: Callable[[], float]) -> None:
        self.issuer = issuer
        self.auth = auth
        self.clock = clock
        self.jwks_uri = issuer.jwks_uri  # found in the metadata when not configured
        self.keys: KeySet | None = None
        self.kids: frozenset[str | None] = frozenset()
        self.duplicates: dict[str, tuple[Key, ...]] = {}  # a key id several keys have -> those keys
        self.fetched_at = -math.inf  # when the keys were fetched last
        self.tried_at = -math.inf  # when a fetch was tried last (whatever came of it)
        self.failure = "not fetched yet"
        self.fetches = 0  # fetches of the key set tried (for the tests and the status)
        self.resolve: Resolve = resolve_host  # a host name's addresses (tests give their own)
        self._lock = trio.Lock()

    def knows(self, kid: str | None) -> bool:
        return kid in self.kids or (kid is None and bool(self.kids))

    def same_kid(self, kid: str | None) -> tuple[Key, ...]:
        """The keys to try, one by one, for a token with key id ``kid`` when the set gives
        that id to several keys (at most ``MAX_SAME_KID``); empty otherwise."""
        return self.duplicates.get(kid, ()) if kid is not None else ()

    async def key_set(self, kid: str | None) -> KeySet:
        """The keys to check a token signed with key ``kid``: fetched when there are none yet,
        when they are stale, or when ``kid`` is not among them, each as often as the rules
        of this module allow. Raises KeysUnavailable when there are no keys at all."""
        if self._wants_fetch(kid):
            async with self._lock:
                if self._wants_fetch(kid):  # not fetched while this one waited
                    await self._refresh()
        if self.keys is None:
            raise KeysUnavailable(self.failure)
        return self.keys

    def _wants_fetch(self, kid: str | None) -> bool:
        now = self.clock()
        spaced = now - self.tried_at >= self.auth.jwks_refresh_interval
        if self.keys is None or now - self.fetched_at >= self.auth.jwks_cache_seconds:
            return spaced  # none yet, or stale: fetched, but no more often after a failure
        return not self.knows(kid) and spaced

    async def _refresh(self) -> None:
        self.tried_at = self.clock()
        self.fetches += 1
        within = self.auth.fetch_timeout
        try:
            if self.jwks_uri is None:
                self.jwks_uri = await self._discover(within)
            keys, kids = key_set_of(await fetch_json(self.jwks_uri, within))
        except FetchError as exc:
            self.failure = f"the signing keys of {self.issuer.issuer} cannot be fetched: {exc}"
            log.error("auth: %s%s", self.failure, "; the keys fetched before are used" if self.keys else "")
            return
        self.keys, self.kids, self.fetched_at = keys, kids, self.clock()
        log.info("auth: fetched %d signing keys of %s", len(keys.keys), self.issuer.issuer)
        duplicates: dict[str, list[Key]] = {}
        for key in keys.keys:
            if key.kid is not None and sum(other.kid == key.kid for other in keys.keys) > 1:
                duplicates.setdefault(key.kid, []).append(key)
        if duplicates.keys() != self.duplicates.keys() and duplicates:  # said once, not on each refetch
            log.warning(
                "auth: the key set of %s gives one key id to several keys (%s); a token with such an id"
                " is tried with each (at most %d)",
                self.issuer.issuer,
                ", ".join(sorted(duplicates))[:200],
                MAX_SAME_KID,
            )
        self.duplicates = {kid: tuple(same[:MAX_SAME_KID]) for kid, same in duplicates.items()}

    async def _discover(self, within: float) -> str:
        """The issuer's ``jwks_uri``, from its metadata; raises FetchError."""
        reasons = []
        for url in metadata_urls(self.issuer.issuer):
            try:
                document = await fetch_json(url, within)
            except FetchError as exc:
                reasons.append(str(exc))
                continue
            if document.get("issuer") != self.issuer.issuer:
                raise FetchError(f"{url}: the metadata names another issuer")
            jwks_uri = document.get("jwks_uri")
            problem = await discovered_url_problem(jwks_uri, self.issuer.issuer, self.resolve)
            if problem is not None:
                raise FetchError(f"{url}: its jwks_uri is refused: {problem}")
            assert isinstance(jwks_uri, str)
            return jwks_uri
        raise FetchError("no metadata found (" + "; ".join(reasons) + ")")

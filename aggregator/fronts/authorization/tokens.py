"""Whether an access token is good for this resource, and whose it is: ``TokenVerifier``.

A token of three dot-separated parts is a JWT (RFC 9068): its ``iss`` picks the configured
issuer, its header's ``alg`` must be one that issuer allows (asymmetric only: never
``none``, never an HMAC with a public key), its ``typ``, when present, must say an access
token or a plain JWT (``ACCEPTED_TYPES``: an ID token or a DPoP proof signed by the same
issuer is not an access token), its signature is checked with joserfc against the
issuer's keys (``keys.IssuerKeys``; each key of a set that gives several the token's key
id, up to ``MAX_SAME_KID``), then its claims: ``iss`` exactly, ``aud`` naming
``auth.resource`` (RFC 8707: a token for another resource is refused), ``exp`` required and
``nbf`` honoured, both with ``auth.leeway``, and a ``sub``. Any other token is introspected
(RFC 7662) at each issuer that has an introspection endpoint: it must be ``active``, for
this resource, and not expired.

A signature check costs CPU on the one trio thread and introspection a round trip, so a
good token's principal is cached by the token's SHA-256 until the token expires (an
introspection answer at most ``auth.introspection_cache_seconds``), up to ``MAX_CACHED``
tokens. However short that is (``introspection_cache_seconds = 0``: asked every time), a
token checked for a request stays known for that request's later, synchronous steps (its
principal, its profile, the token a server trades) for ``REQUEST_SECONDS`` after its
check: ``cached`` reads that floor, while ``verify`` asks again once the trust is gone, so
the next request is checked anew. A refused JWT is not cached: its refusal is cheap unless its key id is unknown,
and fetching for those is rate-limited by the keys themselves. An opaque token every
issuer says is not active is remembered as such, by its hash, for ``REFUSED_SECONDS`` (at
most ``auth.introspection_cache_seconds``), up to ``MAX_CACHED``; the same token asked
again meanwhile, or while its introspection runs, costs no other. Introspections are at
most ``MAX_INTROSPECTIONS`` at a time, and ``MAX_INTROSPECTIONS_PER_ISSUER`` at one issuer,
so a flood of made-up tokens waits its turn rather than flooding an authorization server.

``auth.required_scopes`` are checked on every request, after the cache: a good token
without them is a 403 ``insufficient_scope``, not a 401. What each refusal says never
quotes the token.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import trio
from joserfc import jws, jwt
from joserfc.errors import JoseError

from aggregator.config.model import AuthConfig, IssuerConfig, ProfileConfig
from aggregator.fronts.authorization.keys import FetchError, IssuerKeys, KeysUnavailable, fetch_json
from aggregator.fronts.authorization.principal import Principal, Rejection, matching_profiles, scopes_of

log = logging.getLogger(__name__)

MAX_CACHED = 10_000  # good tokens remembered
MAX_TOKEN = 8 * 1024  # characters; a longer token is refused unread
MAX_INTROSPECTIONS = 16  # introspection requests in flight at once (more wait their turn)
MAX_INTROSPECTIONS_PER_ISSUER = 4  # ... and at one issuer
REFUSED_SECONDS = 10.0  # how long an opaque token found not active is refused unasked
# A token checked for a request is known this long to that request's later steps (``cached``),
# however briefly its check may be trusted: the steps follow the check with no I/O between.
REQUEST_SECONDS = 5.0
MIN_RECHECK_SECONDS = 1.0  # a held introspected token is asked about no more often than this
# A JWT's ``typ`` (RFC 9068 section 2.1, RFC 8725 section 3.11), the "application/" prefix
# and case set aside: absent, or one of these; any other explicit type is another token's.
ACCEPTED_TYPES = frozenset({"jwt", "at+jwt"})


def _invalid(description: str) -> Rejection:
    return Rejection(401, "invalid_token", description)


def token_key(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenVerifier:
    """Checks access tokens for one ``[auth]`` table; shared by every front of a process
    (``shared``), so the keys are fetched once and a token checked on one front is known on
    the others."""

    # id(the [auth] table) -> (the table, its verifier): by identity, as an equal table of
    # another config may come with other profiles.
    _shared: dict[int, tuple[weakref.ref[AuthConfig], TokenVerifier]] = {}

    def __init__(
        self,
        auth: AuthConfig,
        profiles: Mapping[str, ProfileConfig] | None = None,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.auth = auth
        self.profiles = profiles or {}
        self.wall = wall  # Unix time, for exp and nbf
        self.issuers = {issuer.issuer: issuer for issuer in auth.issuers}
        self.keys = {issuer.issuer: IssuerKeys(issuer, auth, clock) for issuer in auth.issuers}
        self.introspecting = [issuer for issuer in auth.issuers if issuer.introspection_endpoint]
        self.required = frozenset(auth.required_scopes)
        # sha256(token) -> (principal, trusted until, known to the request that checked it until)
        self._cache: dict[bytes, tuple[Principal, float, float]] = {}
        # A flood of made-up opaque tokens costs each its introspection: never many at once.
        self._introspections = trio.Semaphore(MAX_INTROSPECTIONS)
        self._per_issuer = {issuer.issuer: trio.Semaphore(MAX_INTROSPECTIONS_PER_ISSUER) for issuer in auth.issuers}
        self._refused: dict[bytes, float] = {}  # sha256(opaque token) -> refused unasked until (wall)
        self._asking: dict[bytes, _Asked] = {}  # sha256(opaque token) -> its introspection under way

    @classmethod
    def shared(cls, auth: AuthConfig, profiles: Mapping[str, ProfileConfig]) -> TokenVerifier:
        """The verifier of this ``[auth]`` table (this very object: the fronts of one hub share
        its config), made once."""
        found = cls._shared.get(id(auth))
        if found is not None and found[0]() is auth:
            return found[1]
        for key, (table, _) in list(cls._shared.items()):  # forget those of configs gone
            if table() is None:
                del cls._shared[key]
        verifier = cls(auth, profiles)
        cls._shared[id(auth)] = (weakref.ref(auth), verifier)
        return verifier

    # --- the fronts' questions ------------------------------------------------------------

    def cached(self, token: str) -> Principal | None:
        """The principal of a token checked before and trusted still, or checked for the
        request at hand (``REQUEST_SECONDS`` ago at most), or None."""
        found = self._cache.get(token_key(token))
        if found is None or self.wall() >= max(found[1], found[2]):
            return None
        return found[0]

    def _trusted(self, key: bytes) -> Principal | None:
        """The principal of a token whose check is trusted still (not merely known to the
        request that checked it): what spares ``verify`` asking again."""
        found = self._cache.get(key)
        if found is None or self.wall() >= found[1]:
            return None
        return found[0]

    async def verify(self, token: str) -> Principal | Rejection:
        """Whose this token is, or why it is refused; checks the required scopes."""
        principal = self._trusted(token_key(token))
        if principal is None:
            if len(token) > MAX_TOKEN:
                return _invalid("the token is too long")
            checked = await (self._jwt(token) if token.count(".") == 2 else self._opaque(token))
            if isinstance(checked, Rejection):
                self._cache.pop(token_key(token), None)  # known no more, not even to a request
                return checked
            principal, until = checked
            self._remember(token_key(token), principal, until)
        missing = self.required - principal.scopes
        if missing:
            return Rejection(403, "insufficient_scope", "the token lacks a required scope")
        return principal

    def recheck_interval(self, token: str) -> float | None:
        """How often a connection that keeps ``token`` (a WebSocket's: its messages carry
        none) asks whether it is still good: an introspected token every
        ``auth.introspection_cache_seconds`` (at least ``MIN_RECHECK_SECONDS``), as often as
        an HTTP request would have it introspected anew; None for a JWT, checked here alone,
        which nothing can revoke before its ``exp``."""
        if token.count(".") == 2 or not self.introspecting:
            return None
        return max(MIN_RECHECK_SECONDS, self.auth.introspection_cache_seconds)

    async def recheck(self, token: str) -> Principal | Rejection:
        """``verify`` anew, past the cache: whether a token held since it was checked is
        still good (an introspected one may have been revoked)."""
        self._cache.pop(token_key(token), None)
        return await self.verify(token)

    # --- JWT ------------------------------------------------------------------------------

    async def _jwt(self, token: str) -> tuple[Principal, float] | Rejection:
        try:
            compact = jws.extract_compact(token.encode())
            header = compact.headers()
            unverified = orjson.loads(compact.payload)
        except (JoseError, ValueError, TypeError):
            return _invalid("the token cannot be read")
        if not isinstance(unverified, dict):
            return _invalid("the token's claims are not a JSON object")
        issuer = self.issuers.get(unverified.get("iss"))  # type: ignore[arg-type]
        if issuer is None:
            return _invalid("the token's issuer is not accepted here")
        algorithm = header.get("alg")
        if algorithm not in issuer.algorithms:
            return _invalid("the token's signing algorithm is not accepted here")
        if not _access_token_type(header.get("typ")):
            return _invalid("the token's type (typ) is not an access token's")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            return _invalid("the token's key id is not a string")
        keys = self.keys[issuer.issuer]
        try:
            key_set = await keys.key_set(kid)
        except KeysUnavailable as exc:
            return Rejection(503, "temporarily_unavailable", str(exc))
        if not keys.knows(kid):
            return _invalid("the token is signed with a key its issuer does not publish")
        claims = None
        for key in keys.same_kid(kid) or (key_set,):  # several keys of that id: each is tried
            try:
                claims = jwt.decode(token, key, algorithms=[algorithm]).claims
                break
            except (JoseError, ValueError, TypeError):
                continue
        if claims is None:
            return _invalid("the token's signature is not valid")
        return self._claims_checked(claims, issuer)

    def _claims_checked(self, claims: dict[str, Any], issuer: IssuerConfig) -> tuple[Principal, float] | Rejection:
        now, leeway = self.wall(), self.auth.leeway
        if claims.get("iss") != issuer.issuer:
            return _invalid("the token's issuer is not accepted here")
        if not _for_resource(claims.get("aud"), self.auth.resource):
            return _invalid("the token is not meant for this resource (its audience)")
        expires = claims.get("exp")
        if isinstance(expires, bool) or not isinstance(expires, int | float):
            return _invalid("the token has no expiry")
        if now >= expires + leeway:
            return _invalid("the token has expired")
        starts = claims.get("nbf")
        if starts is not None and (isinstance(starts, bool) or not isinstance(starts, int | float)):
            return _invalid("the token's nbf is not a number")
        if starts is not None and now + leeway < starts:
            return _invalid("the token is not valid yet")
        ends = float(expires) + leeway
        return self._principal(claims, issuer, ends, ends)

    def _principal(
        self, claims: Mapping[str, Any], issuer: IssuerConfig, expires: float, until: float
    ) -> tuple[Principal, float] | Rejection:
        """The principal of a checked token that ``expires`` (Unix time), trusted ``until``."""
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return _invalid("the token names no subject")
        scopes = scopes_of(claims)
        principal = Principal(
            issuer=issuer.issuer,
            subject=subject,
            scopes=scopes,
            profiles=matching_profiles(claims, scopes, self.profiles),
            expires=expires,
        )
        return principal, until

    # --- introspection (RFC 7662) ---------------------------------------------------------

    async def _opaque(self, token: str) -> tuple[Principal, float] | Rejection:
        """An opaque token introspected, once however many requests bring it at the same
        moment; one found not active is refused unasked for a while."""
        key = token_key(token)
        refused_until = self._refused.get(key)
        if refused_until is not None:
            if self.wall() < refused_until:
                return _NOT_ACTIVE
            del self._refused[key]
        asked = self._asking.get(key)
        if asked is not None:  # its introspection is under way: its answer serves this one too
            await asked.done.wait()
            return asked.result
        asked = self._asking[key] = _Asked()
        try:
            asked.result = checked = await self._introspect(token)
        finally:
            del self._asking[key]
            asked.done.set()
        if checked is _NOT_ACTIVE:
            seconds = min(REFUSED_SECONDS, self.auth.introspection_cache_seconds)
            if seconds > 0:
                self._remember_refused(key, self.wall() + seconds)
        return checked

    async def _introspect(self, token: str) -> tuple[Principal, float] | Rejection:
        if not self.introspecting:
            return _invalid("the token is not a JWT, and no issuer introspects tokens")
        failures = []
        for issuer in self.introspecting:
            assert issuer.introspection_endpoint is not None
            credentials = (
                (issuer.client_id, issuer.client_secret)
                if issuer.client_id is not None and issuer.client_secret is not None
                else None
            )
            try:
                # (The issuer's turn first: tokens waiting for one issuer hold no global slot.)
                async with self._per_issuer[issuer.issuer], self._introspections:
                    answer = await fetch_json(
                        issuer.introspection_endpoint,
                        self.auth.fetch_timeout,
                        form={"token": token, "token_type_hint": "access_token"},
                        credentials=credentials,
                    )
            except FetchError as exc:
                log.error("auth: introspection at %s failed: %s", issuer.issuer, exc)
                failures.append(issuer.issuer)
                continue
            if answer.get("active") is not True:
                continue
            if answer.get("iss", issuer.issuer) != issuer.issuer:
                return _invalid("the token's issuer is not accepted here")
            if not _for_resource(answer.get("aud"), self.auth.resource):
                return _invalid("the token is not meant for this resource (its audience)")
            now = self.wall()
            until = now + self.auth.introspection_cache_seconds
            ends = math.inf  # an answer without exp: the token's life is not known
            expires = answer.get("exp")
            if isinstance(expires, int | float) and not isinstance(expires, bool):
                if now >= expires + self.auth.leeway:
                    return _invalid("the token has expired")
                ends = float(expires) + self.auth.leeway
                until = min(until, ends)
            return self._principal(answer, issuer, ends, until)
        if failures and len(failures) == len(self.introspecting):
            return Rejection(503, "temporarily_unavailable", "the token cannot be introspected now")
        return _NOT_ACTIVE

    # --- the cache ------------------------------------------------------------------------

    def _remember_refused(self, key: bytes, until: float) -> None:
        refused = self._refused
        if len(refused) >= MAX_CACHED:
            now = self.wall()
            for old in [old for old, ends in refused.items() if ends <= now]:
                del refused[old]
            if len(refused) >= MAX_CACHED:  # still full: the oldest half goes
                for old in list(refused)[: MAX_CACHED // 2]:
                    del refused[old]
        refused[key] = until

    def _remember(self, key: bytes, principal: Principal, until: float) -> None:
        cache = self._cache
        if len(cache) >= MAX_CACHED:
            now = self.wall()
            for old in [old for old, (_, trusted, known) in cache.items() if max(trusted, known) <= now]:
                del cache[old]
            if len(cache) >= MAX_CACHED:  # still full: the oldest half goes
                for old in list(cache)[: MAX_CACHED // 2]:
                    del cache[old]
        cache[key] = (principal, until, self.wall() + REQUEST_SECONDS)


_NOT_ACTIVE = _invalid("the token is not active")  # (the one object: remembered when this is the answer)


class _Asked:
    """An opaque token's introspection under way, for the requests that bring it meanwhile."""

    def __init__(self) -> None:
        self.done = trio.Event()
        # What they get if the introspection never answers (its request was cancelled).
        self.result: tuple[Principal, float] | Rejection = Rejection(
            503, "temporarily_unavailable", "the token cannot be introspected now"
        )


def _access_token_type(typ: Any) -> bool:
    """Whether a JWT header's ``typ`` allows an access token: absent, ``JWT`` or ``at+jwt``
    (with or without ``application/``, any case)."""
    if typ is None:
        return True
    if not isinstance(typ, str):
        return False
    typ = typ.lower()
    return typ.removeprefix("application/") in ACCEPTED_TYPES


def _for_resource(audience: Any, resource: str) -> bool:
    """Whether a token's ``aud`` (a string or a list of them) names this resource; a
    trailing slash is not a difference."""
    wanted = resource.rstrip("/")
    if isinstance(audience, str):
        return audience.rstrip("/") == wanted
    if isinstance(audience, list):
        return any(isinstance(item, str) and item.rstrip("/") == wanted for item in audience)
    return False

"""rate-limit: a token bucket per client and tool; the error says when to retry.

    [[plugins]]
    use = "rate-limit"
    options = { rate = 2.0, burst = 5, per = "session+tool" }

``rate`` requests a second on average, up to ``burst`` at once. ``per`` says what is
counted separately: "session+tool" (default), "session", "profile+tool" or "profile"
(all clients of a profile together: what a token holder cannot escape by opening new
sessions), "principal+tool" or "principal" (all sessions of one token holder: a static
token, or an access token's subject; a caller without a token is counted per session).
A refused request gets reason ``rate_limited`` and ``retry_after`` seconds.

Replicas (``[cluster] store``): each replica decides on its own buckets, with no store
round trip per request, and every ``sync_every`` seconds (0.25 by default) its ``shared``
hook adds what it admitted to one counter per bucket in the store and reads every
replica's (one round trip for all its buckets: ``Store.count_into``); what the others
admitted since the last reading is taken from its own bucket, which may go below zero (the
debt is paid by waiting). So N replicas together admit about ``rate`` a second: each can
admit what its bucket holds and one interval's refill before it hears of the others, so
over any stretch they admit at most ``burst + rate × seconds`` plus, for each replica but
one, ``burst + rate × sync_every``. That holds for every bucket every replica names alike:
"profile", "profile+tool", a caller with a token's "principal", "principal+tool", and a
session's own bucket when its id is sealed (``[cluster] keys``: a session a balancer
spreads over N replicas is counted once, by its name on every replica, a digest of its id,
never the id). A session only one replica knows is counted there alone. The counters live in
one hash per hour (``COUNTER_HOURS``), which expires after two; a bucket a replica first
hears of in a reading is charged whatever was counted in it, except at its very first
reading (a replica that just started takes the counters as they are). While the store is
down each replica counts alone, and says so once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Hashable
from typing import Any

import orjson
import trio

from aggregator.errors import StoreError
from aggregator.plugins import Deny, InvalidOptions, Request

log = logging.getLogger(__name__)

COUNTER_HOURS = 3600.0  # each hash of counters holds this many seconds' requests
MAX_SHARED = 10_000  # buckets counted together, at most (past it: counted by each replica alone)
MAX_BUCKETS = 100_000  # buckets kept; past it, full ones are forgotten


def _now() -> float:
    """The proxy's clock (trio's, so tests can run it virtually), or the system's outside it."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


def _session(request: Request) -> Hashable:
    """A request's session: by its name on every replica (a sealed id's digest), or by
    this replica's number for it when it has none."""
    return ("shared", request.session) if request.session is not None else request.client


def _caller(request: Request) -> Hashable:
    """Who a request is from: its principal, or its session when it has none."""
    return ("session", _session(request)) if request.principal is None else ("principal", request.principal)


KEYS: dict[str, Callable[[Request], Hashable]] = {
    "session+tool": lambda r: (_session(r), r.exposed),
    "session": _session,
    "profile+tool": lambda r: (r.profile, r.exposed),
    "profile": lambda r: r.profile,
    "principal+tool": lambda r: (_caller(r), r.exposed),
    "principal": _caller,
}
# Whether a request's bucket is named alike by every replica (a session only this replica
# knows is not: it has no name on every replica).
SHARED: dict[str, Callable[[Request], bool]] = {
    "session+tool": lambda r: r.session is not None,
    "session": lambda r: r.session is not None,
    "profile+tool": lambda r: True,
    "profile": lambda r: True,
    "principal+tool": lambda r: r.principal is not None or r.session is not None,
    "principal": lambda r: r.principal is not None or r.session is not None,
}


def _text(value: Any) -> str:
    return str(value)  # a principal as every replica shows it: a token's index, "subject (issuer)"


class RateLimit:
    name = "rate-limit"

    def __init__(
        self,
        rate: float,
        burst: int = 1,
        per: str = "session+tool",
        sync_every: float = 0.25,
        clock: Callable[[], float] = _now,
    ) -> None:
        problems = {}
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            problems["rate"] = f"must be a finite number of requests a second > 0, got {rate!r}"
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
            problems["burst"] = f"must be an integer from 1 to 1000000, got {burst!r}"
        if per not in KEYS:
            problems["per"] = f"must be one of {', '.join(KEYS)}, got {per!r}"
        if isinstance(sync_every, bool) or not isinstance(sync_every, int | float) or not 0.01 <= sync_every <= 60:
            problems["sync_every"] = f"must be a number of seconds from 0.01 to 60, got {sync_every!r}"
        if problems:
            raise InvalidOptions(problems)
        self.rate = float(rate)
        self.burst = float(burst)
        self.key = KEYS[per]
        self.clock = clock
        self.buckets: dict[Any, tuple[float, float]] = {}  # key -> (tokens, when)
        # Counted with the other replicas (``shared``): what a bucket is called in the store,
        # by its key here, and back; what this replica admitted since it last told the store;
        # each counter as last read.
        self.sync_every = float(sync_every)
        self.per = per
        self.shares = SHARED[per]
        self.sharing = False
        self.names: dict[Hashable, str] = {}
        self.keys: dict[str, Hashable] = {}
        self.unsynced: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.hash: str | None = None  # the counters' hash last read
        self.down = False

    def request(self, request: Request) -> None:
        now = self.clock()
        key = self.key(request)
        name = None
        if self.sharing and self.shares(request):
            name = self.names.get(key) or self._name(key)
            if name is not None:
                key = name  # the bucket is the one every replica counts
        tokens, when = self.buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens < 1:
            wait = (1 - tokens) / self.rate
            self.buckets[key] = (tokens, now)
            raise Deny(
                f"Rate limit reached for {request.exposed}: at most {self.rate:g} a second"
                f" (bursts of {self.burst:g}); retry in {wait:.2f}s",
                retry_after=wait,
                reason="rate_limited",
            )
        self.buckets[key] = (tokens - 1, now)
        if name is not None:
            self.unsynced[name] = self.unsynced.get(name, 0) + 1
        if len(self.buckets) > MAX_BUCKETS:  # forget full buckets: they say nothing
            self.buckets = {k: v for k, v in self.buckets.items() if v[0] + (now - v[1]) * self.rate < self.burst}

    def _name(self, key: Hashable) -> str | None:
        """The bucket's name in the store (a digest of the plugin's settings and the key),
        remembered; None past ``MAX_SHARED`` (counted here alone)."""
        if len(self.names) >= MAX_SHARED:
            return None
        text = orjson.dumps([self.rate, self.burst, self.per, key], default=_text)
        name = hashlib.sha256(text).hexdigest()[:24]
        self.names[key] = name
        self.keys[name] = key
        return name

    async def shared(self, store: Any) -> None:
        """Count together with the other replicas through ``store``, every ``sync_every``
        seconds, until cancelled (the proxy runs this with ``[cluster] store``)."""
        self.sharing = True
        try:
            while True:
                await trio.sleep(self.sync_every)
                await self.sync(store, time.time())
        finally:
            self.sharing = False

    async def sync(self, store: Any, wall: float) -> None:
        """Tell the store what was admitted here since the last time, and take from each
        bucket what the other replicas admitted meanwhile."""
        hour = int(wall // COUNTER_HOURS)
        counters = f"ratelimit:{hour}"
        batch, self.unsynced = self.unsynced, {}
        try:
            totals = await store.count_into(counters, batch, ttl=2 * COUNTER_HOURS)
        except StoreError as exc:
            for name, count in batch.items():  # told the next time
                self.unsynced[name] = self.unsynced.get(name, 0) + count
            if not self.down:
                self.down = True
                log.warning("rate-limit: the shared store cannot be used now (%s); each replica counts alone", exc)
            return
        if self.down:
            self.down = False
            log.info("rate-limit: counting with the other replicas again")
        first = self.hash is None
        if counters != self.hash:  # a new hour: every counter starts again
            self.seen = {}
            self.hash = counters
        now = self.clock()
        for name, total in totals.items():
            before = self.seen.get(name)
            self.seen[name] = total
            if before is None and first:
                continue  # just started: the counters are taken as they are
            others = total - (before or 0) - batch.get(name, 0)
            if before is not None and total < before:  # the counter expired and started again
                others = total - batch.get(name, 0)
            if others <= 0:
                continue
            if name not in self.buckets and len(self.buckets) >= MAX_BUCKETS:
                continue  # one only the others use, past the bound: theirs to count
            tokens, when = self.buckets.get(name, (self.burst, now))
            tokens = min(self.burst, tokens + (now - when) * self.rate)
            self.buckets[name] = (tokens - others, now)
        if len(self.seen) > 2 * MAX_SHARED:
            self.seen = {name: self.seen[name] for name in self.keys if name in self.seen}

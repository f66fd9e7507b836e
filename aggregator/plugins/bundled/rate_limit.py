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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Any

import trio

from aggregator.plugins import Deny, InvalidOptions, Request


def _now() -> float:
    """The proxy's clock (trio's, so tests can run it virtually), or the system's outside it."""
    try:
        return trio.current_time()
    except RuntimeError:
        return time.monotonic()


def _caller(request: Request) -> Hashable:
    """Who a request is from: its principal, or its session when it has none."""
    return ("session", request.client) if request.principal is None else ("principal", request.principal)


KEYS: dict[str, Callable[[Request], Hashable]] = {
    "session+tool": lambda r: (r.client, r.exposed),
    "session": lambda r: r.client,
    "profile+tool": lambda r: (r.profile, r.exposed),
    "profile": lambda r: r.profile,
    "principal+tool": lambda r: (_caller(r), r.exposed),
    "principal": _caller,
}


class RateLimit:
    name = "rate-limit"

    def __init__(
        self, rate: float, burst: int = 1, per: str = "session+tool", clock: Callable[[], float] = _now
    ) -> None:
        problems = {}
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            problems["rate"] = f"must be a finite number of requests a second > 0, got {rate!r}"
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
            problems["burst"] = f"must be an integer from 1 to 1000000, got {burst!r}"
        if per not in KEYS:
            problems["per"] = f"must be one of {', '.join(KEYS)}, got {per!r}"
        if problems:
            raise InvalidOptions(problems)
        self.rate = float(rate)
        self.burst = float(burst)
        self.key = KEYS[per]
        self.clock = clock
        self.buckets: dict[Any, tuple[float, float]] = {}  # key -> (tokens, when)

    def request(self, request: Request) -> None:
        now = self.clock()
        key = self.key(request)
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
        if len(self.buckets) > 100_000:  # forget full buckets: they say nothing
            self.buckets = {k: v for k, v in self.buckets.items() if v[0] + (now - v[1]) * self.rate < self.burst}

"""Benchmark: sealing a legacy session's state into its id, and opening it again.

    python -m tests.bench.seal_bench

What a session costs with ``[cluster] keys``: ``seal`` once at initialize, ``unseal`` once
when a replica that does not know the session adopts it (a known id is a dict lookup, as
without keys). The state is what the official SDKs send (sampling, elicitation and roots
declared, a short clientInfo) bound to an access token's issuer and subject; also the key
derivation, done once at start. Median of 7 runs of 5,000 cycles each, in microseconds.
"""

from __future__ import annotations

import statistics
import time

from aggregator.cluster.keys import SESSION, KeyRing
from aggregator.cluster.sealing import SessionSealer, SessionState

CYCLES = 5_000
STATE = SessionState(
    protocol_version="2025-11-25",
    capabilities={"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}},
    client_info={"name": "claude-code", "version": "2.1.0"},
    profile="default",
    principal=["https://login.example.com/realms/main", "3f2c9a1e-7b44-4d1b-9a51-0c6f3e2b8d17"],
    issued_at=time.time(),
)


def per_cycle(action, cycles: int = CYCLES) -> float:
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(cycles):
            action()
        runs.append((time.perf_counter() - start) / cycles * 1e6)
    return statistics.median(runs)


def main() -> None:
    sealer = SessionSealer(KeyRing(["k" * 32, "o" * 32]).keys_for(SESSION))
    sealed = sealer.seal(STATE)
    assert sealed is not None and sealer.unseal(sealed) is not None
    print(f"sealed id: {len(sealed)} characters")
    print(f"seal:   {per_cycle(lambda: sealer.seal(STATE)):6.1f} us")
    print(f"unseal: {per_cycle(lambda: sealer.unseal(sealed)):6.1f} us")
    print(f"refuse a tampered id: {per_cycle(lambda: sealer.unseal(sealed[:-4] + 'AAAA')):6.1f} us")
    print(f"key ring (once at start, two keys): {per_cycle(lambda: KeyRing(['k' * 32, 'o' * 32]), 200):6.1f} us")


if __name__ == "__main__":
    main()

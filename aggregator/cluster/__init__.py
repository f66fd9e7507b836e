"""Several replicas of the proxy behind one balancer: what they share ([cluster]).

``keys``: the key ring. ``[cluster] keys`` (shared secrets, the same on every replica) are
turned once, at start, into one subkey per purpose with HKDF-SHA256: sealing session ids
(``sealing``), signing the requestState of parked calls (``core.era.request_state``),
signing list cursors (``core.catalogs.cursor``), signing the OAuth pages' browser cookie
and sealing authorization flows in the store (``credentials``), sealing the rests of cut
results in the store (``kept``). The first key seals and
signs, every key verifies, and each value names the key that made it by a short id.

``store``: the shared store (the ``Store`` protocol, the in-memory default for one
process and the Redis one), and the small trio Redis client under it (``redis``: RESP2 over
TCP or a unix socket, replies parsed by ``hiredis``, pipelined, with deadlines, bounded
replies, reconnection with backoff and a pub/sub connection). The hub opens the store; the
admin paths show its status.

``sealing``: a legacy Streamable HTTP session's immutable state (its handshake, profile,
principal) sealed into its ``Mcp-Session-Id`` with AES-GCM, so that any replica with the
keys, or this one after a restart, takes the session over (``fronts.http.sessions``).

``kept``: the rests of cut tool results in the store (sealed under the key ring's
``kept`` subkey, bound to their caller), written when a result is cut and read back by a
replica that does not hold one, for the hub (``core.catalogs.result_budget``).

``session_record``: what such a session changes (its log level, subscriptions, the events
of its GET stream, the lease of the replica keeping its subscriptions upstream), in the
store, for every replica serving it (``fronts.http.shared_sessions``).

Floor 4 (tests/core/test_layering.py): may import ``errors``, ``jsonrpc``, ``mcp``,
``core`` records, ``config`` and ``transports``; never ``hub`` or ``fronts``.

Importing the package costs nothing: ``sealing`` and ``kept`` load cryptography only when
``[cluster] keys`` are given.
"""

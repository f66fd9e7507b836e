"""The shared store: what the replicas of one deployment keep in common.

Owns the ``Store`` protocol (the operations the cluster needs, each key under the
configured ``prefix`` and each with an expiry), its two implementations and the counts
behind the store's metrics:

- ``MemoryStore``: the embedded default, one process's dicts (no ``[cluster] store``). It
  behaves as the Redis one does (expiry, stream ids, MAXLEN, pub/sub), so the same tests
  run against both, and a single replica needs nothing else.
- ``RedisStore``: ``[cluster] store = "redis://..."``, over ``cluster.redis``'s command
  connection and its pub/sub connection.

Rules: every key expires (``ttl`` is required, in seconds), but for the records a deployment
keeps as it would keep a file (``hset`` and ``hset_new`` with ``ttl=None``: pinned tool
definitions, which must not be forgotten, or a changed tool would be pinned anew as if first
seen; bounded by the tools the config's servers have); a call on a store that is down
fails at once with ``StoreUnavailable`` (callers that can go on without the store catch it);
``status()`` is a snapshot for readiness and the status page (the address with its password
masked). Must not import the hub or anything above it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import trio

from aggregator.cluster.redis import DEFAULT_TIMEOUT, RedisClient, RedisSubscriber
from aggregator.config.store_url import RedisAddress
from aggregator.core.requests.request_table import Histogram
from aggregator.errors import StoreError

T = TypeVar("T")
Entry = tuple[str, dict[str, bytes]]  # a stream entry: its id and its fields
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SUBSCRIBER_BUFFER = 256  # messages a subscriber may be behind before it loses some


@attrs.frozen(kw_only=True)
class StoreStatus:
    """A snapshot of the store for readiness and the status page."""

    kind: str  # "memory" or "redis"
    address: str  # the URL with its password masked; "memory" for the embedded one
    up: bool
    last_error: str | None = None
    round_trip_ms: float | None = None

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class StoreStats:
    """Calls and errors by operation, and every call's duration (for ``/metrics``)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.latency = Histogram(STORE_BUCKETS)

    def record(self, operation: str, seconds: float, failed: bool) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        if failed:
            self.errors[operation] = self.errors.get(operation, 0) + 1
        else:
            self.latency.observe(seconds)


class Store(Protocol):
    """What the cluster keeps in common. Keys and channels are the caller's names; the
    store puts them under its prefix."""

    prefix: str
    stats: StoreStats

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the store's connections (reports started at once, even while it is down)."""

    def status(self) -> StoreStatus: ...

    async def get(self, key: str) -> bytes | None: ...
    async def set(self, key: str, value: bytes, *, ttl: float) -> None: ...
    async def set_new(self, key: str, value: bytes, *, ttl: float) -> bool:
        """Set ``key`` only if it does not exist (``SET NX PX``): whether it was set (a lock)."""

    async def take(self, key: str) -> bytes | None:
        """Get and delete ``key`` at once (``GETDEL``): of two takers, one gets the value."""

    async def delete(self, key: str) -> None: ...
    async def incrby(self, key: str, amount: int, *, ttl: float) -> int:
        """Add ``amount``; the expiry is set when the key is created, not renewed."""

    async def hget(self, key: str, field: str) -> bytes | None: ...
    async def hset(self, key: str, fields: Mapping[str, bytes], *, ttl: float | None) -> None:
        """Set fields; the whole hash's expiry is renewed (``ttl=None``: a lasting record,
        which never expires; see the module's rules)."""

    async def hset_new(self, key: str, field: str, value: bytes, *, ttl: float | None) -> bool:
        """Set one field only if the hash does not have it (``HSETNX``): whether it was set
        (of two replicas, the first wins). The expiry as for ``hset``."""

    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def hdel(self, key: str, fields: Sequence[str]) -> int:
        """Remove fields; how many there were (the hash's expiry is left as it is)."""

    async def count_into(self, key: str, counts: Mapping[str, int], *, ttl: float) -> dict[str, int]:
        """Add ``counts`` to the hash's fields (``HINCRBY``, the zeros left out), renew its
        expiry and return every field's total (``HGETALL``): one round trip."""

    async def append(self, key: str, fields: Mapping[str, bytes], *, maxlen: int, ttl: float) -> str:
        """Add an entry to a stream (kept to about its last ``maxlen``), its id back; the
        stream's expiry is renewed."""

    async def append_many(
        self, entries: Sequence[tuple[str, Mapping[str, bytes]]], *, maxlen: int, ttl: float
    ) -> list[str]:
        """Add entries to streams (``(key, fields)`` each, in order), their ids back: one
        round trip for all."""

    async def read(self, key: str, after: str = "0", *, count: int = 100) -> list[Entry]:
        """At most ``count`` entries after the id ``after`` ("0": from the first)."""

    async def publish(self, channel: str, message: bytes) -> int:
        """Send to the channel's subscribers (in any replica); how many heard it."""

    async def publish_many(self, notes: Sequence[tuple[str, bytes]]) -> None:
        """Send each ``(channel, message)``, in order: one round trip for all."""

    async def subscribe(self, channel: str) -> trio.MemoryReceiveChannel[bytes]:
        """What is published on ``channel`` once this returns (at most once: a reader that
        falls behind, or a store that is down, loses messages). A store that is up has
        confirmed the subscription by then, so that an answer asked for right after is not
        missed; one that is down is not waited for."""

    def unsubscribe(self, channel: str) -> None: ...


def open_store(url: str | None, *, prefix: str, timeout: float = DEFAULT_TIMEOUT) -> Store:
    """The store a config names: Redis for a URL, the embedded one for none."""
    if url is None:
        return MemoryStore(prefix=prefix)
    return RedisStore(RedisAddress.parse(url), prefix=prefix, timeout=timeout)


def _ms(ttl: float) -> int:
    if not ttl > 0:
        raise ValueError(f"every key expires: ttl must be positive, got {ttl!r}")
    return max(1, int(ttl * 1000))


def _stream_id(text: str) -> tuple[int, int]:
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


# --- the embedded store ----------------------------------------------------------------------


class MemoryStore:
    """One process's store: what Redis would hold, in dicts, expiring by trio's clock."""

    SWEEP_SECONDS = 10.0

    def __init__(self, *, prefix: str = "aggregator") -> None:
        self.prefix = prefix
        self.stats = StoreStats()
        self._values: dict[str, tuple[Any, float]] = {}  # key -> (value, expires at)
        self._channels: dict[str, trio.MemorySendChannel[bytes]] = {}
        self._last_id = (0, 0)

    def status(self) -> StoreStatus:
        return StoreStatus(kind="memory", address="memory", up=True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:  # what nobody read again is let go
            await trio.sleep(self.SWEEP_SECONDS)
            now = trio.current_time()
            for key in [key for key, (_, at) in self._values.items() if at <= now]:
                del self._values[key]

    def _key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def _live(self, key: str) -> Any:
        found = self._values.get(key)
        if found is None:
            return None
        if found[1] <= trio.current_time():
            del self._values[key]
            return None
        return found[0]

    def _put(self, key: str, value: Any, ttl: float | None) -> None:
        expires = math.inf if ttl is None else trio.current_time() + _ms(ttl) / 1000
        self._values[key] = (value, expires)

    async def _timed(self, operation: str, work: Callable[[], T]) -> T:
        await trio.lowlevel.checkpoint()
        started = time.perf_counter()
        try:
            result = work()
        except Exception:
            self.stats.record(operation, time.perf_counter() - started, True)
            raise
        self.stats.record(operation, time.perf_counter() - started, False)
        return result

    def _typed(self, key: str, kind: type[T]) -> T | None:
        value = self._live(key)
        if value is not None and not isinstance(value, kind):
            raise StoreError(f"{key} holds another type of value")
        return value

    async def get(self, key: str) -> bytes | None:
        return await self._timed("get", lambda: self._typed(self._key(key), bytes))

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        await self._timed("set", lambda: self._put(self._key(key), bytes(value), ttl))

    async def set_new(self, key: str, value: bytes, *, ttl: float) -> bool:
        def put() -> bool:
            name = self._key(key)
            if self._live(name) is not None:
                return False
            self._put(name, bytes(value), ttl)
            return True

        return await self._timed("set_new", put)

    async def take(self, key: str) -> bytes | None:
        def pop() -> bytes | None:
            name = self._key(key)
            value = self._typed(name, bytes)
            self._values.pop(name, None)
            return value

        return await self._timed("take", pop)

    async def delete(self, key: str) -> None:
        await self._timed("delete", lambda: self._values.pop(self._key(key), None))

    async def incrby(self, key: str, amount: int, *, ttl: float) -> int:
        def add() -> int:
            name = self._key(key)
            current = self._typed(name, bytes)
            if current is None:
                self._put(name, b"%d" % amount, ttl)
                return amount
            total = int(current) + amount
            self._values[name] = (b"%d" % total, self._values[name][1])
            return total

        return await self._timed("incrby", add)

    async def hget(self, key: str, field: str) -> bytes | None:
        def look() -> bytes | None:
            found = self._typed(self._key(key), dict)
            return None if found is None else found.get(field)

        return await self._timed("hget", look)

    async def hset(self, key: str, fields: Mapping[str, bytes], *, ttl: float | None) -> None:
        def put() -> None:
            name = self._key(key)
            found = self._typed(name, dict) or {}
            self._put(name, {**found, **{field: bytes(value) for field, value in fields.items()}}, ttl)

        await self._timed("hset", put)

    async def hset_new(self, key: str, field: str, value: bytes, *, ttl: float | None) -> bool:
        def put() -> bool:
            name = self._key(key)
            found = self._typed(name, dict) or {}
            if field in found:
                return False
            self._put(name, {**found, field: bytes(value)}, ttl)
            return True

        return await self._timed("hset_new", put)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return await self._timed("hgetall", lambda: dict(self._typed(self._key(key), dict) or {}))

    async def hdel(self, key: str, fields: Sequence[str]) -> int:
        def remove() -> int:
            name = self._key(key)
            found = self._typed(name, dict)
            if found is None:
                return 0
            removed = sum(found.pop(field, None) is not None for field in fields)
            if not found:
                del self._values[name]
            return removed

        return await self._timed("hdel", remove)

    async def count_into(self, key: str, counts: Mapping[str, int], *, ttl: float) -> dict[str, int]:
        def add() -> dict[str, int]:
            name = self._key(key)
            found = dict(self._typed(name, dict) or {})
            for field, amount in counts.items():
                if amount:
                    found[field] = b"%d" % (int(found.get(field, b"0")) + amount)
            if found:
                self._put(name, found, ttl)
            return {field: int(value) for field, value in found.items()}

        return await self._timed("count_into", add)

    async def append(self, key: str, fields: Mapping[str, bytes], *, maxlen: int, ttl: float) -> str:
        def add() -> str:
            name = self._key(key)
            entries = self._typed(name, deque)
            if entries is None:
                entries = deque()
            now = int(time.time() * 1000)
            self._last_id = (now, 0) if now > self._last_id[0] else (self._last_id[0], self._last_id[1] + 1)
            entry_id = f"{self._last_id[0]}-{self._last_id[1]}"
            entries.append((entry_id, {field: bytes(value) for field, value in fields.items()}))
            while len(entries) > maxlen:
                entries.popleft()
            self._put(name, entries, ttl)
            return entry_id

        return await self._timed("append", add)

    async def append_many(
        self, entries: Sequence[tuple[str, Mapping[str, bytes]]], *, maxlen: int, ttl: float
    ) -> list[str]:
        return [await self.append(key, fields, maxlen=maxlen, ttl=ttl) for key, fields in entries]

    async def read(self, key: str, after: str = "0", *, count: int = 100) -> list[Entry]:
        def look() -> list[Entry]:
            entries = self._typed(self._key(key), deque) or deque()
            start = _stream_id(after)
            return [(entry_id, dict(fields)) for entry_id, fields in entries if _stream_id(entry_id) > start][:count]

        return await self._timed("read", look)

    async def publish(self, channel: str, message: bytes) -> int:
        def send() -> int:
            subscriber = self._channels.get(self._key(channel))
            if subscriber is None:
                return 0
            try:
                subscriber.send_nowait(bytes(message))
            except trio.WouldBlock:
                return 1  # heard, and lost: as a Redis subscriber that is behind
            except trio.BrokenResourceError:
                del self._channels[self._key(channel)]
                return 0
            return 1

        return await self._timed("publish", send)

    async def publish_many(self, notes: Sequence[tuple[str, bytes]]) -> None:
        for name, message in notes:
            await self.publish(name, message)

    async def subscribe(self, channel: str) -> trio.MemoryReceiveChannel[bytes]:
        await trio.lowlevel.checkpoint()
        name = self._key(channel)
        if name in self._channels:
            raise ValueError(f"already subscribed to {channel!r}")
        send, receive = trio.open_memory_channel[bytes](SUBSCRIBER_BUFFER)
        self._channels[name] = send
        return receive

    def unsubscribe(self, channel: str) -> None:
        send = self._channels.pop(self._key(channel), None)
        if send is not None:
            send.close()


# --- the Redis store -------------------------------------------------------------------------


class RedisStore:
    """The store on a Redis server (``cluster.redis``): one pipelined command connection,
    one pub/sub connection."""

    def __init__(self, address: RedisAddress, *, prefix: str = "aggregator", timeout: float = DEFAULT_TIMEOUT) -> None:
        self.prefix = prefix
        self.address = address
        self.stats = StoreStats()
        self.client = RedisClient(address, timeout=timeout)
        self.subscriber = RedisSubscriber(address, timeout=timeout)

    def status(self) -> StoreStatus:
        trip = self.client.round_trip
        return StoreStatus(
            kind="redis",
            address=self.address.display(),
            up=self.client.up,
            last_error=self.client.last_error,
            round_trip_ms=None if trip is None else round(trip * 1000, 3),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.client.run)
            await nursery.start(self.subscriber.run)
            task_status.started()

    def _key(self, key: str) -> bytes:
        return f"{self.prefix}:{key}".encode()

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            result = await call
        except StoreError:
            self.stats.record(operation, time.perf_counter() - started, True)
            raise
        self.stats.record(operation, time.perf_counter() - started, False)
        return result

    async def get(self, key: str) -> bytes | None:
        reply = await self._timed("get", self.client.execute("GET", self._key(key)))
        return None if reply is None else bytes(reply)

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        await self._timed("set", self.client.execute("SET", self._key(key), value, "PX", _ms(ttl)))

    async def set_new(self, key: str, value: bytes, *, ttl: float) -> bool:
        reply = await self._timed("set_new", self.client.execute("SET", self._key(key), value, "NX", "PX", _ms(ttl)))
        return reply is not None

    async def take(self, key: str) -> bytes | None:
        reply = await self._timed("take", self.client.execute("GETDEL", self._key(key)))  # Redis 6.2
        return None if reply is None else bytes(reply)

    async def delete(self, key: str) -> None:
        await self._timed("delete", self.client.execute("DEL", self._key(key)))

    async def incrby(self, key: str, amount: int, *, ttl: float) -> int:
        name = self._key(key)
        # One round trip: the expiry is set only on a key that has none (PEXPIRE NX, Redis 7).
        commands: list[list[Any]] = [["INCRBY", name, amount], ["PEXPIRE", name, _ms(ttl), "NX"]]
        replies = await self._timed("incrby", self.client.pipeline(commands))
        return int(replies[0])

    async def hget(self, key: str, field: str) -> bytes | None:
        reply = await self._timed("hget", self.client.execute("HGET", self._key(key), field))
        return None if reply is None else bytes(reply)

    async def hset(self, key: str, fields: Mapping[str, bytes], *, ttl: float | None) -> None:
        name = self._key(key)
        flat = [item for field, value in fields.items() for item in (field, value)]
        commands: list[list[Any]] = [["HSET", name, *flat]]
        if ttl is not None:
            commands.append(["PEXPIRE", name, _ms(ttl)])
        await self._timed("hset", self.client.pipeline(commands))

    async def hset_new(self, key: str, field: str, value: bytes, *, ttl: float | None) -> bool:
        name = self._key(key)
        commands: list[list[Any]] = [["HSETNX", name, field, value]]
        if ttl is not None:
            commands.append(["PEXPIRE", name, _ms(ttl)])
        replies = await self._timed("hset_new", self.client.pipeline(commands))
        return int(replies[0]) == 1

    async def hgetall(self, key: str) -> dict[str, bytes]:
        flat = await self._timed("hgetall", self.client.execute("HGETALL", self._key(key)))
        return {bytes(field).decode(): bytes(value) for field, value in zip(flat[::2], flat[1::2], strict=True)}

    async def hdel(self, key: str, fields: Sequence[str]) -> int:
        if not fields:
            return 0
        return int(await self._timed("hdel", self.client.execute("HDEL", self._key(key), *fields)))

    async def count_into(self, key: str, counts: Mapping[str, int], *, ttl: float) -> dict[str, int]:
        name = self._key(key)
        commands: list[list[Any]] = [["HINCRBY", name, field, amount] for field, amount in counts.items() if amount]
        commands += [["PEXPIRE", name, _ms(ttl)], ["HGETALL", name]]
        flat = (await self._timed("count_into", self.client.pipeline(commands)))[-1]
        return {bytes(field).decode(): int(value) for field, value in zip(flat[::2], flat[1::2], strict=True)}

    async def append(self, key: str, fields: Mapping[str, bytes], *, maxlen: int, ttl: float) -> str:
        raw = {field.encode(): value for field, value in fields.items()}
        return await self._timed("append", self.client.xadd(self._key(key), raw, maxlen=maxlen, expire_ms=_ms(ttl)))

    async def append_many(
        self, entries: Sequence[tuple[str, Mapping[str, bytes]]], *, maxlen: int, ttl: float
    ) -> list[str]:
        if not entries:
            return []
        commands: list[list[Any]] = []
        names: dict[bytes, None] = {}
        for key, fields in entries:
            name = self._key(key)
            names[name] = None
            flat = [item for field, value in fields.items() for item in (field.encode(), value)]
            commands.append(["XADD", name, "MAXLEN", "~", maxlen, "*", *flat])
        commands += [["PEXPIRE", name, _ms(ttl)] for name in names]  # (each stream's expiry, once)
        replies = await self._timed("append_many", self.client.pipeline(commands))
        return [bytes(reply).decode() for reply in replies[: len(entries)]]

    async def read(self, key: str, after: str = "0", *, count: int = 100) -> list[Entry]:
        entries = await self._timed("read", self.client.xread(self._key(key), after, count=count))
        return [(entry_id, {field.decode(): value for field, value in fields.items()}) for entry_id, fields in entries]

    async def publish(self, channel: str, message: bytes) -> int:
        return int(await self._timed("publish", self.client.execute("PUBLISH", self._key(channel), message)))

    async def publish_many(self, notes: Sequence[tuple[str, bytes]]) -> None:
        if notes:
            commands: list[list[Any]] = [["PUBLISH", self._key(channel), message] for channel, message in notes]
            await self._timed("publish_many", self.client.pipeline(commands))

    async def subscribe(self, channel: str) -> trio.MemoryReceiveChannel[bytes]:
        name = self._key(channel)
        messages = self.subscriber.subscribe(name, SUBSCRIBER_BUFFER)
        if self.subscriber.up:  # one round trip; bounded (a server that stops answering)
            with trio.move_on_after(self.subscriber.timeout):
                await self.subscriber.wait_subscribed(name)
        else:
            await trio.lowlevel.checkpoint()  # subscribed when it is up again
        return messages

    def unsubscribe(self, channel: str) -> None:
        self.subscriber.unsubscribe(self._key(channel))


async def unreachable(url: str, *, seconds: float = DEFAULT_TIMEOUT) -> str | None:
    """Why the store at ``url`` cannot be reached (its password masked), or None when it
    answers a PING within ``seconds`` (``aggregator check``). Its outage is logged at DEBUG
    only: the caller says why, and the proxy's own client has logged it once already."""
    client = RedisClient(RedisAddress.parse(url), timeout=seconds, outage_level=logging.DEBUG)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        try:
            with trio.move_on_after(seconds):
                await client.wait_connected()
                await client.execute("PING")
                return None
            return client.last_error or f"no connection within {seconds:g}s"
        except StoreError as exc:
            return str(exc)
        finally:
            nursery.cancel_scope.cancel()

"""The trio Redis client against a real redis-server: pipelining, deadlines, reconnection,
pub/sub after a restart, the reply bound, logging in, and no password in any line."""

from __future__ import annotations

import functools
import logging

import pytest
import trio
import trio.testing

from aggregator.cluster.redis import RedisClient, RedisSubscriber, encode_command
from aggregator.cluster.store import RedisStore, unreachable
from aggregator.config.store_url import RedisAddress, mask_url
from aggregator.errors import StoreError, StoreUnavailable
from tests.cluster.redis_server import RedisServer, redis_server, until
from tests.loopback import free_port


async def _connected(nursery: trio.Nursery, url: str, **options) -> RedisClient:
    client = RedisClient(RedisAddress.parse(url), **options)
    await nursery.start(client.run)
    with trio.fail_after(10):
        await client.wait_connected()
    return client


async def test_pipelined_calls_are_answered_in_order(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url)
    results: dict[int, object] = {}

    async def one(n: int) -> None:
        results[n] = await client.execute("INCRBY", "counter", 1)
        assert await client.execute("ECHO", b"call %d" % n) == b"call %d" % n

    with trio.fail_after(20):
        async with trio.open_nursery() as calls:
            for n in range(200):  # all in flight on the one connection at once
                calls.start_soon(one, n)
        assert sorted(results.values()) == list(range(1, 201))
        replies = await client.pipeline([["SET", "a", "1"], ["GET", "a"], ["INCR", "a"], ["GET", "missing"]])
        assert replies == [b"OK", b"1", 2, None]


async def test_stream_commands(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url)
    with trio.fail_after(10):
        first = await client.xadd("s", {b"a": b"1"}, maxlen=100, expire_ms=60_000)
        second = await client.xadd("s", {b"a": b"2", b"b": b"3"}, maxlen=100)
        assert await client.xrange("s") == [(first, {b"a": b"1"}), (second, {b"a": b"2", b"b": b"3"})]
        assert await client.xrange("s", count=1) == [(first, {b"a": b"1"})]
        assert await client.xread("s", first, count=10) == [(second, {b"a": b"2", b"b": b"3"})]
        assert await client.xread("s", second, count=10) == []
        assert 0 < await client.execute("PTTL", "s") <= 60_000


async def test_an_error_reply_is_a_store_error(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url)
    with trio.fail_after(10):
        await client.execute("SET", "text", "abc")
        with pytest.raises(StoreError, match="INCR") as caught:
            await client.execute("INCR", "text")
        assert not isinstance(caught.value, StoreUnavailable)
        assert await client.execute("GET", "text") == b"abc"  # the connection goes on


async def test_a_server_that_does_not_answer_fails_the_call_by_its_deadline(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url, timeout=0.3)
    redis.pause()
    try:
        with trio.fail_after(5):
            started = trio.current_time()
            with pytest.raises(StoreUnavailable, match="no answer within 0.3s"):
                await client.execute("PING")
            assert trio.current_time() - started < 2
            with pytest.raises(StoreUnavailable):  # down now: at once
                await client.execute("PING")
            await trio.sleep(1.0)  # it connects (the kernel accepts), but nothing answers its PING
            assert not client.up
    finally:
        redis.resume()
    with trio.fail_after(10):
        await client.wait_connected()
        assert await client.execute("PING") == b"PONG"


async def test_reconnects_after_the_server_restarts(redis: RedisServer, nursery: trio.Nursery, caplog):
    caplog.set_level(logging.INFO, logger="aggregator.cluster.redis")
    client = await _connected(nursery, redis.url)
    await client.execute("SET", "k", "v")
    redis.stop()
    with trio.fail_after(10):
        await until(lambda: not client.up)
        for _ in range(3):
            with pytest.raises(StoreUnavailable, match="down"):
                await client.execute("GET", "k")
        await trio.sleep(0.5)  # several reconnect attempts fail meanwhile
    down = [r for r in caplog.records if "is down" in r.getMessage()]
    assert len(down) == 1  # once per outage, not per call nor per attempt
    redis.start()
    with trio.fail_after(15):
        await client.wait_connected()
        assert await client.execute("GET", "k") is None  # a new server: nothing was saved
    again = [r for r in caplog.records if "is up again" in r.getMessage()]
    assert [r.levelno for r in down] == [logging.WARNING] and [r.levelno for r in again] == [logging.INFO]


async def test_the_reachability_probe_leaves_the_outage_line_to_its_caller(caplog):
    caplog.set_level(logging.INFO, logger="aggregator.cluster.redis")
    reason = await unreachable(f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0", seconds=0.5)
    assert reason is not None and "s3cret-pw" not in reason
    assert not [r for r in caplog.records if "is down" in r.getMessage()]  # check prints the reason itself


async def test_subscriptions_come_back_after_a_restart(redis: RedisServer, nursery: trio.Nursery):
    address = RedisAddress.parse(redis.url)
    subscriber = RedisSubscriber(address)
    await nursery.start(subscriber.run)
    client = await _connected(nursery, redis.url)
    messages = subscriber.subscribe(b"replica-1")
    with trio.fail_after(10):
        await subscriber.subscribed.wait()
        assert await client.execute("PUBLISH", "replica-1", "before") == 1
        assert await messages.receive() == b"before"
    redis.stop()
    await until(lambda: not client.up and not subscriber.up)
    redis.start()
    with trio.fail_after(20):
        await client.wait_connected()
        await until(lambda: subscriber.up)
        await subscriber.subscribed.wait()  # subscribed again on the new connection
        assert await client.execute("PUBLISH", "replica-1", "after") == 1
        assert await messages.receive() == b"after"


async def test_leaving_channels_while_the_subscriber_stops_neither_raises_nor_holds_it_up(redis: RedisServer):
    """Leaving a channel while the subscriber stops (its connection winding down) or after
    it stopped is a no-op for the caller (a relay that leaves as the process stops): no
    error, and no write started on a connection that winds down, which would keep it from
    ending (or, once its nursery closed, raise)."""
    subscriber = RedisSubscriber(RedisAddress.parse(redis.url))
    channels = [b"c%d" % n for n in range(200)]
    stopping = trio.CancelScope()
    stopped = trio.Event()

    async def run() -> None:
        with stopping:
            await subscriber.run()
        stopped.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            for channel in channels:
                subscriber.subscribe(channel)
            await subscriber.subscribed.wait()
            subscriber.subscribe(b"one more")  # a write in flight on the connection as it stops
            stopping.cancel()
            left = iter(channels)
            for channel in left:  # one channel left at every turn of the scheduler
                if stopped.is_set():
                    break
                subscriber.unsubscribe(channel)
                await trio.lowlevel.checkpoint()
            assert stopped.is_set(), "the subscriber did not stop while channels were left"
        for channel in left:
            subscriber.unsubscribe(channel)


async def test_an_oversized_reply_is_refused(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url, max_reply_bytes=64 * 1024)
    with trio.fail_after(10):
        await client.execute("SET", "big", b"x" * 200_000)
        with pytest.raises(StoreError, match="over 65536 bytes"):
            await client.execute("GET", "big")
        await client.wait_connected()  # dropped and connected again at once
        assert await client.execute("STRLEN", "big") == 200_000
        await client.execute("SET", "small", "s")
        got: dict[str, object] = {}

        async def small() -> None:
            got["small"] = await client.execute("GET", "small")

        async def big() -> None:
            with pytest.raises(StoreError, match="over 65536 bytes"):
                await client.execute("GET", "big")

        async with trio.open_nursery() as both:  # the small answer, read before the big one, arrives
            both.start_soon(small)
            await trio.testing.wait_all_tasks_blocked()  # small is queued first (tasks start in any order)
            both.start_soon(big)
        assert got == {"small": b"s"}


async def test_logs_in_and_selects_from_the_url_and_never_shows_the_password(tmp_path, nursery, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "s3cret-Passw0rd-xyz"
    with redis_server(tmp_path, password=secret) as server:
        url = f"redis://:{secret}@127.0.0.1:{server.port}/3"
        store = RedisStore(RedisAddress.parse(url), prefix="p")
        await nursery.start(store.run)
        with trio.fail_after(10):
            await store.client.wait_connected()
            await store.set("k", b"v", ttl=60)
            assert await store.client.execute("CLIENT", "INFO") is not None
            info = (await store.client.execute("CLIENT", "INFO")).decode()
            assert " db=3 " in info
        shown = store.status()
        server.stop()
        await until(lambda: not store.client.up)
        await trio.sleep(0.2)  # a few attempts to connect again
        status = store.status()
        nursery.cancel_scope.cancel()
    wrong = RedisAddress.parse(f"redis://:not-{secret}@127.0.0.1:{free_port()}/0")
    assert shown.address == f"redis://:***@127.0.0.1:{server.port}/3"
    text = "\n".join(r.getMessage() for r in caplog.records) + repr(status) + repr(shown) + repr(wrong)
    assert secret not in text and status.up is False and status.last_error
    assert mask_url(url) == f"redis://:***@127.0.0.1:{server.port}/3"


async def test_a_wrong_password_is_a_login_failure(tmp_path, nursery):
    with redis_server(tmp_path, password="right-one") as server:
        client = RedisClient(RedisAddress.parse(f"redis://:wrong@127.0.0.1:{server.port}/0"))
        await nursery.start(client.run)
        await until(lambda: client.last_error is not None)
        assert "AUTH refused" in client.last_error and "wrong" not in client.last_error
        assert not client.up
        nursery.cancel_scope.cancel()


async def test_a_store_that_is_down_at_start_does_not_hold_the_start(nursery: trio.Nursery):
    store = RedisStore(RedisAddress.parse(f"redis://127.0.0.1:{free_port()}/0"), prefix="p")
    with trio.fail_after(5):
        await nursery.start(store.run)  # at once
        await until(lambda: store.status().last_error is not None)
        with pytest.raises(StoreUnavailable):
            await store.get("k")
    assert store.status().up is False and "connect" in store.status().last_error
    assert store.stats.errors["get"] == 1


async def test_a_unix_socket(redis_unix: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, f"unix://{redis_unix.socket}?db=1")
    with trio.fail_after(10):
        assert await client.execute("PING") == b"PONG"
    nursery.cancel_scope.cancel()


def test_commands_are_resp_arrays_of_bulk_strings():
    assert encode_command(["SET", b"k", 12, "é"]) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$2\r\n\xc3\xa9\r\n"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://localhost", "redis://localhost:6379/0"),
        ("redis://:pw@h:1/2", "redis://:***@h:1/2"),
        ("redis://user:pw@h:1/2", "redis://user:***@h:1/2"),
        ("unix://:pw@/run/redis.sock?db=4", "unix://:***@/run/redis.sock?db=4"),
    ],
)
def test_addresses(url: str, shown: str):
    assert RedisAddress.parse(url).display() == shown


@pytest.mark.parametrize(
    "url",
    [
        "http://h:1/0",
        "redis://:pw@h:port/0",
        "redis://:pw@h:1/zero",
        "redis://:pw@/0",
        "unix://:pw@",
        "unix://:pw@relative/sock",  # not /sock: a socket's path is absolute
        "unix://:pw@host:1/sock",
    ],
)
def test_bad_addresses_are_refused_without_their_password(url: str):
    with pytest.raises(ValueError) as caught:
        RedisAddress.parse(url)
    assert "pw" not in str(caught.value)


async def _hostile_server(nursery: trio.Nursery, answers: list[list[bytes]]) -> str:
    """A fake Redis on 127.0.0.1: the n-th connection answers its first command other than
    PING with the n-th list of chunks (sent one by one), then +OK to anything else."""
    connections = iter(answers)

    async def handle(stream: trio.SocketStream) -> None:
        chunks = next(connections, [])
        async with stream:
            while data := await stream.receive_some(65536):
                if data.startswith(b"*1\r\n$4\r\nPING"):
                    await stream.send_all(b"+PONG\r\n")
                elif chunks:
                    for chunk in chunks:
                        await stream.send_all(chunk)
                        await trio.sleep(0.01)  # separate reads
                    chunks = []
                else:
                    await stream.send_all(b"+OK\r\n")

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"redis://127.0.0.1:{listeners[0].socket.getsockname()[1]}/0"


async def test_an_aggregate_header_no_reply_within_the_bound_can_have_is_refused(nursery: trio.Nursery, caplog):
    # The count is refused before the reader sees it (it would allocate the whole list first),
    # even split across reads; the connection is dropped, one line logged, the next one serves.
    caplog.set_level(logging.INFO)
    url = await _hostile_server(
        nursery, [[b"*21474", b"83647\r\n"], [b"%100", b"1\r\n"], [b"+OK\r\n*1\r\n*5000\r\n"], [b"~1001\r\n"]]
    )
    client = await _connected(nursery, url, max_reply_bytes=3000)
    for _ in range(3):
        with trio.fail_after(1), pytest.raises(StoreUnavailable, match="elements, more than a reply within 3000 bytes"):
            await client.execute("GET", "k")
        await client.wait_connected()
    with trio.fail_after(1), pytest.raises(StoreUnavailable, match="elements"):
        await client.execute("GET", "k")
    await client.wait_connected()
    assert await client.execute("SET", "k", "v") == b"OK"  # serving again
    downs = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert len(downs) == 4 and all("elements" in line for line in downs)  # one line a drop


async def test_header_like_bytes_inside_a_string_are_not_headers(redis: RedisServer, nursery: trio.Nursery):
    client = await _connected(nursery, redis.url, max_reply_bytes=3000)
    tricky = b"\r\n*99999999\r\n$5\r\n%77777777\r\n"
    with trio.fail_after(5):
        await client.execute("SET", "k", tricky)
        for _ in range(3):
            assert await client.execute("GET", "k") == tricky
            assert await client.pipeline([["GET", "k"], ["MGET", "k", "k"]]) == [tricky, [tricky, tricky]]

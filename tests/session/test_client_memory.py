"""One memory budget for all clients together (``proxy.total_client_buffer_bytes``): past it,
clients that have stopped reading are dropped, the most stalled first, until under it; a
client that reads is never dropped for it; and what is counted is given back when clients go."""

from __future__ import annotations

import trio
import trio.testing

from aggregator.fronts.session import serve_stream_session
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.outbox import MessageLog
from tests.session.harness import Client, running_proxy

TOTAL = 200_000


async def _stalled(proxy) -> tuple[Client, int]:
    """A client whose stream takes nothing it does not read; initialized, asks for the
    servers' logs, then it stops."""
    ours, theirs = trio.testing.lockstep_stream_pair()
    proxy.nursery.start_soon(serve_stream_session, proxy.hub, theirs, theirs)
    client = Client(ours)
    await client.initialize()
    await client.request("logging/setLevel", {"level": "info"})
    return client, max(proxy.hub.clients)


# The server's log lines reach every client that asked for logs: it is a Streamable HTTP
# upstream ("streams") that sends them outside any request (as on its GET stream).
BROADCASTING = {"a": ["streams"]}


def test_message_log_frames_what_waits_in_one_buffer():
    log = MessageLog()
    for text in (b"ab", b"cde", b"f"):
        log.append(text)
    assert log.take() == b"ab"
    chunk, size = log.take_all_framed(lambda number, length: b"<%d:%d>" % (number, length), b";")
    assert (bytes(chunk), size) == (b"<2:3>cde;<3:1>f;", 4)
    assert log.waiting == 0 and log.retained_bytes == 0
    assert log.take_all_framed(lambda number, length: b"x") == (bytearray(), 0)


def test_a_released_client_counts_nowhere_after():
    class Holder:
        def __init__(self, memory: ClientMemory) -> None:
            self.memory, self.held = memory, 0

    shared = ClientMemory(100)
    holder = Holder(shared)
    holder.held += 70
    shared.total += 70
    release_all(holder)
    assert shared.total == 0 and holder.held == 0
    holder.memory.total -= 30  # a write that finishes late
    assert shared.total == 0


async def test_past_the_total_budget_stalled_clients_are_dropped_and_a_reader_goes_on(autojump_clock):
    # Each client may hold 1 MiB; all together only 200 kB. Three clients stop reading
    # while a server broadcasts about 330 kB of log lines to everyone.
    async with running_proxy(
        BROADCASTING, client_buffer_bytes=1 << 20, total_client_buffer_bytes=TOTAL, client_write_timeout=600.0
    ) as proxy:
        memory = proxy.hub.client_memory
        reader = await proxy.connect()
        await reader.initialize()
        await reader.request("logging/setLevel", {"level": "info"})
        reader_key = max(proxy.hub.clients)
        stalled = [await _stalled(proxy) for _ in range(3)]
        # The second one is about to receive a 50 kB answer more than the others.
        await stalled[1][0].send(
            {"id": "e", "method": "tools/call", "params": {"name": "a__echo", "arguments": {"pad": "x" * 50_000}}}
        )
        with trio.fail_after(5):
            while memory.total < 50_000:  # noqa: ASYNC110 - polls a state, bounded above
                await trio.sleep(0.01)
        assert memory.total <= TOTAL and proxy.hub.clients[stalled[1][1]].held >= 50_000
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(memory.total)
                await trio.sleep(0.001)

        proxy.nursery.start_soon(watch)
        await reader.send(
            {"id": 9, "method": "tools/call", "params": {"name": "a__flood", "arguments": {"count": 3000, "size": 10}}}
        )
        with trio.fail_after(30):
            answer = await reader.response(9)
        assert answer["result"]["content"][0]["text"] == "flooded"
        logs = [n for n in reader.notifications if n["method"] == "notifications/message"]
        assert len(logs) == 3000  # the reader got every line: it never held much
        assert reader_key in proxy.hub.clients
        # Those that did not read are gone once they have read nothing for STALLED_AFTER;
        # meanwhile each held no more than its own budget.
        with trio.fail_after(5):
            while any(key in proxy.hub.clients for _, key in stalled):  # noqa: ASYNC110 - bounded above
                await trio.sleep(0.01)
        assert max(seen) <= TOTAL + 3 * (1 << 20), max(seen)
        assert memory.total <= TOTAL
        assert memory.total == sum(client.held for client in proxy.hub.clients.values())
        for client, _ in stalled:
            with trio.fail_after(5):
                while await client.stream.receive_some(65536):
                    pass
        with trio.fail_after(5):
            assert (await reader.request("ping"))["result"] == {}
        # Clients that go give back what they held.
        await reader.stream.aclose()
        with trio.fail_after(5):
            while proxy.hub.clients:  # noqa: ASYNC110 - polls a state, bounded above
                await trio.sleep(0.01)
        assert memory.total == 0


async def test_which_client_was_dropped_first(autojump_clock, caplog):
    async with running_proxy(
        BROADCASTING, client_buffer_bytes=1 << 20, total_client_buffer_bytes=TOTAL, client_write_timeout=600.0
    ) as proxy:
        reader = await proxy.connect()
        await reader.initialize()
        await reader.request("logging/setLevel", {"level": "info"})
        stalled = [await _stalled(proxy) for _ in range(3)]
        await stalled[1][0].send(
            {"id": "e", "method": "tools/call", "params": {"name": "a__echo", "arguments": {"pad": "x" * 50_000}}}
        )
        with trio.fail_after(5):
            while proxy.hub.client_memory.total < 50_000:  # noqa: ASYNC110 - bounded above
                await trio.sleep(0.01)
        await reader.send(
            {"id": 9, "method": "tools/call", "params": {"name": "a__flood", "arguments": {"count": 3000, "size": 10}}}
        )
        with trio.fail_after(30):
            await reader.response(9)
            await trio.sleep(1)  # the stalled ones have now read nothing for long enough
    drops = [r.getMessage() for r in caplog.records if "dropped:" in r.getMessage()]
    assert len(drops) == 3, drops
    assert (
        f"client session {stalled[1][1]} dropped: all clients together hold more than {TOTAL} bytes; it holds "
        in drops[0]
        and "has read nothing for" in drops[0]
    ), drops
    assert all(r.levelname == "ERROR" for r in caplog.records if "dropped:" in r.getMessage())

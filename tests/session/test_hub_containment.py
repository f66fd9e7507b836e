"""The hub's own tasks are fault boundaries: a bug in one of them is logged and ends only
what it was doing, never the clock, another server or the process."""

import trio

from tests.session.harness import running_proxy


async def test_a_bug_while_expiring_requests_does_not_stop_the_clock(autojump_clock, monkeypatch, caplog):
    async with running_proxy({"a": []}, {"request_timeout": 2.0}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            timeouts = proxy.hub.router.inflight  # what times requests out
            real = timeouts._time_out
            calls = []

            def broken_once(pending):
                calls.append(pending)
                if len(calls) == 1:
                    raise RuntimeError("injected fault")
                return real(pending)

            monkeypatch.setattr(timeouts, "_time_out", broken_once)
            await client.send({"id": "first", "method": "tools/call", "params": {"name": "a__hang"}})
            await trio.sleep(3)  # its expiry failed: logged, and the proxy goes on
            assert "injected fault" in caplog.text
            assert "result" in await client.request("ping")
            start = trio.current_time()
            answer = await client.request("tools/call", {"name": "a__hang"})
            assert answer["error"]["data"]["reason"] == "timeout"  # the clock still runs
            assert 2.0 <= trio.current_time() - start < 2.2


async def test_a_bug_in_a_per_session_connection_ends_only_that_connection(autojump_clock, monkeypatch, caplog):
    from aggregator.upstreams.session import UpstreamSession

    async with running_proxy({"a": [], "b": []}, {"isolation": "per-session"}) as proxy:
        one, two = await proxy.connect(), await proxy.connect()
        with trio.fail_after(30):
            await one.initialize()
            await two.initialize()
            real = UpstreamSession._handshake
            armed = [True]

            async def broken_once(self):
                if armed[0] and self.per_session:
                    armed[0] = False
                    raise RuntimeError("injected fault")
                return await real(self)

            monkeypatch.setattr(UpstreamSession, "_handshake", broken_once)
            failed = await one.request("tools/call", {"name": "a__echo", "arguments": {}})
            assert "error" in failed  # that session's connection ended; its request is answered
            assert "injected fault" in caplog.text
            assert "result" in await two.request("tools/call", {"name": "b__echo", "arguments": {}})
            assert "result" in await one.request("tools/call", {"name": "a__echo", "arguments": {}})

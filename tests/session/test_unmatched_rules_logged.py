"""At startup the proxy logs the rules that match nothing its ready servers listed."""

import logging

import trio

from tests.session.harness import running_proxy


async def test_a_rule_matching_no_listed_tool_is_logged_once_startup_is_done(autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="aggregator.hub.hub")
    settings = {"tools": {"deny": ["ech0", "hang"]}}
    async with running_proxy({"a": [], "b": ["hang_init"]}, settings, startup_timeout=3.0) as proxy:
        with trio.fail_after(30):
            await proxy.hub.startup_done.wait()
        warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("policy: ")]
        # b never answered: its rules are not judged (its list is unknown), a's are.
        assert warnings == ["policy: servers.a.tools.deny: 'ech0' matches no tool of server a"]

"""list_changed notices (``aggregator.core.notices.announcements``): queued per profile or session,
sent together once the debounce passes, only to initialized clients that were told the
capability."""

from __future__ import annotations

import pytest

from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.commands import ToClient
from aggregator.core.events import ClientConnected, ClientMessage, ServerItems, TimePassed
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Listens
from aggregator.core.records.clients import ClientState
from tests.core.helpers import Clock, connect, make_router, msg, unpack


def notices(out):
    return sorted((session, m["method"]) for kind, session, m in unpack(out) if kind == "ToClient")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ([("a", "tools")], ["notifications/tools/list_changed"]),
        ([("a", "tools"), ("b", "tools")], ["notifications/tools/list_changed"]),
        (
            [("a", "tools"), ("a", "resources")],
            ["notifications/resources/list_changed", "notifications/tools/list_changed"],
        ),
        ([("a", "resourceTemplates"), ("b", "resources")], ["notifications/resources/list_changed"]),
        ([("a", "prompts")], []),  # no server has prompts: clients were not told the capability
    ],
)
def test_changes_within_the_debounce_reach_each_client_once(clock, changes, expected):
    r = make_router(clock, debounce=0.05)
    connect(r, 1)
    r.handle(ServerItems("a", "prompts", []))  # listed, empty: nothing to announce
    clock.now += 1
    r.handle(TimePassed())  # what the setup's listings queued
    assert r.next_deadline() is None
    out = []
    for server, kind in changes:
        item = {"uriTemplate": f"x://{server}/{{id}}"} if kind == "resourceTemplates" else None
        items = (
            [item] if item else [{"name": f"n{server}"} if kind in ("tools", "prompts") else {"uri": f"x://{server}"}]
        )
        out += r.handle(ServerItems(server, kind, items))
    assert out == []  # nothing before the debounce
    assert r.next_deadline() == pytest.approx(clock.now + 0.05)
    clock.now += 0.05
    assert notices(r.handle(TimePassed())) == [(1, method) for method in expected]
    assert r.handle(TimePassed()) == []


def test_without_a_debounce_a_change_goes_out_at_once(clock):
    r = make_router(clock, debounce=0)
    connect(r, 1)
    assert notices(r.handle(ServerItems("a", "tools", [{"name": "new"}]))) == [(1, "notifications/tools/list_changed")]


def test_a_listing_that_changes_nothing_is_not_announced(clock):
    r = make_router(clock, debounce=0)
    connect(r, 1)
    assert r.handle(ServerItems("a", "tools", [{"name": "slow"}, {"name": "fast"}])) == []


def test_a_client_before_initialize_is_not_told(clock):
    r = make_router(clock, debounce=0)
    connect(r, 1)
    r.handle(ClientConnected(2))
    assert notices(r.handle(ServerItems("b", "tools", []))) == [(1, "notifications/tools/list_changed")]
    r.handle(ClientMessage(2, msg(id=0, method="initialize", params={})))
    assert notices(r.handle(ServerItems("b", "tools", [{"name": "x"}]))) == [
        (1, "notifications/tools/list_changed"),
        (2, "notifications/tools/list_changed"),
    ]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # changed before it initialized: its initialize answer gave it the lists already
        (["change", "init"], []),
        (["init", "change"], [(2, "notifications/tools/list_changed")]),
        # changed again after it initialized, within the same debounce: that one is news
        (["change", "init", "change"], [(2, "notifications/tools/list_changed")]),
    ],
)
def test_a_client_is_told_only_of_changes_after_its_initialize_answer(clock, steps, expected):
    r = make_router(clock, debounce=0.05)
    clock.now += 1
    r.handle(TimePassed())  # what the setup's listings queued
    r.handle(ClientConnected(2))
    names = iter(["x", "y"])
    for step in steps:
        if step == "init":
            r.handle(ClientMessage(2, msg(id=0, method="initialize", params={})))
        else:
            r.handle(ServerItems("b", "tools", [{"name": next(names)}]))
        clock.now += 0.01
    clock.now += 0.05
    assert notices(r.handle(TimePassed())) == expected


def test_the_announcements_own_what_is_due_and_when_without_a_router():
    clock = Clock()
    client = ClientState(1, initialize_seen=True, advertised={"tools": {}})
    clients = {1: client}
    announcements = Announcements(clock, 0.05, clients, SessionViews(), Listens())
    assert announcements.announce(["tools"]) == [] and announcements.at == clock.now + 0.05
    assert announcements.announce(["tools"], "other") == []  # another profile's: not this client's
    assert announcements.send() == [ToClient(1, {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})]
    assert announcements.at is None and announcements.due == {}
    client.announced_upto = announcements.count  # given the lists after the change: nothing new to it
    announcements.debounce = 0
    assert announcements.announce(["prompts"]) == []  # not advertised to it

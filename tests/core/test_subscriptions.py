"""Resource subscriptions refcounted across sessions (``aggregator.core.notices.subscriptions``). Pure."""

from __future__ import annotations

from aggregator.core.notices.subscriptions import Subscriptions


def test_a_leaving_session_frees_what_only_it_held_in_the_order_it_came():
    subs = Subscriptions()
    keys = [("a", "x://1"), ("b", "x://2"), ("a", "x://3")]
    for key in keys:
        assert subs.add(key, 1)  # the first subscriber: subscribe upstream
    assert not subs.add(("b", "x://2"), 2)  # shared with session 2
    assert subs.holds(1) and subs.holds(2) and not subs.holds(3)
    assert subs.drop_session(1) == [("a", "x://1"), ("a", "x://3")]
    assert not subs.holds(1) and subs.subscribers(("b", "x://2")) == {2}
    assert subs.drop_session(1) == []
    assert subs.remove(("b", "x://2"), 2) and not subs.holds(2)


def test_unsubscribing_everything_one_by_one_leaves_no_trace_of_the_session():
    subs = Subscriptions()
    subs.add(("a", "x://1"), 5)
    subs.add(("a", "x://2"), 5)
    assert not subs.remove(("a", "x://9"), 5)  # never subscribed
    assert subs.remove(("a", "x://1"), 5) and subs.holds(5)
    assert subs.remove(("a", "x://2"), 5) and not subs.holds(5)
    assert subs.of_server("a") == []

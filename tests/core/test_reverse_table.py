"""The table of server-to-client requests in flight (``aggregator.core.reverse.reverse_table``): ids
minted once, counts that match the entries, elicitations bounded per session."""

from __future__ import annotations

from aggregator.core.reverse.reverse_table import Reverse, ReverseTable, replica_of


def test_a_request_is_found_both_ways_and_leaves_no_trace():
    table = ReverseTable(limit=4)
    first = table.open(1, Reverse("a", 7, "sampling/createMessage"))
    second = table.open(1, Reverse("a", 8, "roots/list"))
    assert first != second and table.asked == {1: 2}
    assert table.ids[("a", 7)] == (1, first)
    assert table.end(1, first) == Reverse("a", 7, "sampling/createMessage")
    assert table.end(1, first) is None  # ended once
    assert table.end(1, second) is not None
    assert table.requests == {} and table.ids == {} and table.asked == {}


def test_a_question_of_the_proxys_is_not_found_by_a_server_id():
    table = ReverseTable(limit=4)
    proxy_id = table.mint()
    table.add(2, proxy_id, Reverse("a", object(), "elicitation/create"))
    assert table.ids == {} and table.asked == {2: 1}
    assert table.mint() == proxy_id + 1  # one counter: no id repeats


def test_elicitations_past_the_limit_forget_the_oldest_of_that_session():
    table = ReverseTable(limit=2)
    for eid in ("e1", "e2", "e3"):
        table.remember_elicitation("a", eid, 1)
    table.remember_elicitation("a", "x", 2)
    assert list(table.elicitations) == [("a", "e2"), ("a", "e3"), ("a", "x")]
    assert table.forget_elicitation(("a", "e3")) == 1 and table.forget_elicitation(("a", "e3")) is None
    assert table.elicitation_count == {1: 1, 2: 1}


def test_ids_name_the_replica_in_a_cluster_and_are_numbers_alone():
    assert type(ReverseTable(limit=4).ask_id()) is int
    table = ReverseTable(limit=4, replica="eu-1")
    first, second = table.ask_id(), table.ask_id()
    assert (first, second) == ("eu-1.1", "eu-1.2")
    assert [replica_of(id) for id in (first, "a-b_c.17", 7, "7", ".7", "eu-1.x", "eu-1.", None)] == [
        "eu-1",
        "a-b_c",
        None,
        None,
        None,
        None,
        None,
        None,
    ]

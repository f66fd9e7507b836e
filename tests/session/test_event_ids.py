"""Event ids of the Streamable HTTP front (``fronts.http.sessions.event_prefix``, read by
``fronts.http.streams.EVENT_ID``): numbers alone, or under ``[cluster]`` keys naming the
replica and the request, so that a resumption another replica gets knows whose it was."""

from __future__ import annotations

import pytest

from aggregator.fronts.http.sessions import MAX_ID_IN_EVENT, event_prefix, request_of
from aggregator.fronts.http.streams import EVENT_ID


def test_alone_an_event_id_is_two_numbers():
    assert event_prefix("", 3, 7) == b"3"
    match = EVENT_ID.fullmatch("3-17")
    assert match is not None and (match[1], match[2], match[3], match[4]) == (None, "3", None, "17")


@pytest.mark.parametrize("request_id", [7, 0, "call-7", "a-b_c.d", "é" * 10, "-1", None])
def test_in_a_cluster_an_event_id_names_the_replica_and_the_request(request_id):
    prefix = event_prefix("eu-1", 3, request_id).decode()
    match = EVENT_ID.fullmatch(f"{prefix}-17")
    assert match is not None, prefix
    assert (match[1], match[2], match[4]) == ("eu-1", "3", "17")
    assert request_of(match[3] or "") == request_id


def test_an_id_too_long_or_not_a_token_is_no_request():
    assert event_prefix("eu-1", 3, "x" * MAX_ID_IN_EVENT) == b"eu-1.3."
    assert [request_of(token) for token in ("", "!!", "e30", "bnVsbA")] == [None, None, None, None]

"""The rules for which client a server's request, log line or roots belong to
(``core.reverse.affinity``), one table row per case."""

import pytest

from aggregator.core.reverse.affinity import (
    AMBIGUOUS,
    ANSWER,
    ENDED,
    FORWARD,
    FROM_ABSENT_CLIENT,
    FROM_PROXY,
    HOLD,
    NO_REQUEST,
    UNAVAILABLE,
    Owner,
    log_owner,
    request_owner,
    roots_action,
    roots_followers,
    roots_source,
    unroutable,
)

# (case, facts, expected Owner)
REQUESTS = [
    ("per-session link: its session", dict(link_session=3, in_flight={}), Owner(3, None, "link")),
    ("per-session link: its request from the stream", dict(link_session=3, stream=(3, "x")), Owner(3, "x", "link")),
    (
        "per-session link: its request from the progress token",
        dict(link_session=3, progress=(3, 9)),
        Owner(3, 9, "link"),
    ),
    ("per-session link whose client left", dict(link_session=3, live=False), Owner(None, None, UNAVAILABLE)),
    (
        "stream names the request",
        dict(stream=(1, 7), in_flight={1: [7], 2: [1]}, clients=[1, 2]),
        Owner(1, 7, "stream"),
    ),
    ("stream beats task and progress", dict(stream=(2, 1), task=1, progress=(1, 5)), Owner(2, 1, "stream")),
    (
        "stream of a request that ended: nobody, not the one in flight",
        dict(ended=True, in_flight={1: [3]}, clients=[1]),
        Owner(None, None, ENDED),
    ),
    ("stream of a request that ended: nobody, not the task owner", dict(ended=True, task=2), Owner(None, None, ENDED)),
    (
        "per-session link: its session even on an ended request's stream",
        dict(link_session=3, ended=True),
        Owner(3, None, "link"),
    ),
    ("task owner", dict(task=2, in_flight={1: [1], 2: [4]}, clients=[1, 2]), Owner(2, None, "task")),
    ("task owner with its request from progress", dict(task=2, progress=(2, 4)), Owner(2, 4, "task")),
    ("task beats progress of another session", dict(task=2, progress=(1, 5)), Owner(2, None, "task")),
    ("progress token", dict(progress=(1, "a"), in_flight={1: ["a"], 2: [3]}), Owner(1, "a", "progress")),
    ("one session in flight, one request", dict(in_flight={2: [5]}, clients=[1, 2]), Owner(2, 5, "in_flight")),
    ("one session in flight, two requests", dict(in_flight={2: [5, 6]}, clients=[1, 2]), Owner(2, None, "in_flight")),
    ("two sessions in flight", dict(in_flight={1: [1], 2: [1]}, clients=[1, 2]), Owner(None, None, AMBIGUOUS)),
    ("nothing in flight, one client", dict(in_flight={}, clients=[4]), Owner(4, None, "only_client")),
    ("nothing in flight, two clients", dict(in_flight={}, clients=[1, 2]), Owner(None, None, AMBIGUOUS)),
    ("nothing in flight, no client", dict(in_flight={}, clients=[]), Owner(None, None, UNAVAILABLE)),
]


@pytest.mark.parametrize(("case", "facts", "expected"), REQUESTS, ids=[row[0] for row in REQUESTS])
def test_request_owner(case, facts, expected):
    assert request_owner(**facts) == expected


LOGS = [
    ("per-session link", dict(link_session=3), Owner(3, None, "link")),
    ("per-session link whose client left", dict(link_session=3, live=False), Owner(None, None, UNAVAILABLE)),
    ("on a request's stream", dict(stream=(1, 7), streams=True, in_flight={1: [7], 2: [2]}), Owner(1, 7, "stream")),
    ("names a task", dict(task=2, in_flight={1: [1], 2: [2]}), Owner(2, None, "task")),
    (
        "on the stream of a request that ended",
        dict(ended=True, streams=True, in_flight={1: [1]}),
        Owner(None, None, ENDED),
    ),
    ("carries a progress token", dict(progress=(2, 2), in_flight={1: [1], 2: [2]}), Owner(2, 2, "progress")),
    ("stdio: one session in flight", dict(in_flight={1: [8]}), Owner(1, 8, "in_flight")),
    ("stdio: two sessions in flight", dict(in_flight={1: [8], 2: [8]}), Owner(None, None, AMBIGUOUS)),
    ("stdio: nothing in flight", dict(in_flight={}), Owner(None, None, NO_REQUEST)),
    # One client only still does not make an idle line that client's request.
    ("stdio: nothing in flight (never the only-client rule)", dict(in_flight=None), Owner(None, None, NO_REQUEST)),
    (
        "HTTP: not on a request's stream, one session in flight",
        dict(streams=True, in_flight={1: [8]}),
        Owner(None, None, NO_REQUEST),
    ),
    (
        "HTTP: not on a request's stream, two sessions in flight",
        dict(streams=True, in_flight={1: [8], 2: [1]}),
        Owner(None, None, NO_REQUEST),
    ),
]


@pytest.mark.parametrize(("case", "facts", "expected"), LOGS, ids=[row[0] for row in LOGS])
def test_log_owner(case, facts, expected):
    assert log_owner(**facts) == expected


SOURCES = [
    ("per-session server: its client", (5, False, [1, 5]), 5),
    ("per-session server of a one-client proxy", (5, True, [5]), 5),
    ("shared server, many clients possible", (None, False, [1]), FROM_PROXY),
    ("shared server, many clients possible, none yet", (None, False, []), FROM_PROXY),
    ("shared server, one client only, there", (None, True, [1]), 1),
    ("shared server, one client only, not yet there", (None, True, []), FROM_ABSENT_CLIENT),
]


@pytest.mark.parametrize(("case", "args", "expected"), SOURCES, ids=[row[0] for row in SOURCES])
def test_roots_source(case, args, expected):
    assert roots_source(*args) == expected


ACTIONS = [
    ("from the proxy", (FROM_PROXY, False, False), ANSWER),
    ("from the proxy, whatever the clients", (FROM_PROXY, True, True), ANSWER),
    ("its client not there yet", (FROM_ABSENT_CLIENT, False, False), HOLD),
    ("its client initializing", (1, False, True), HOLD),
    ("its client initializing, roots unknown yet", (1, False, False), HOLD),
    ("its client ready with roots", (1, True, True), FORWARD),
    ("its client ready without roots", (1, True, False), ANSWER),
]


@pytest.mark.parametrize(("case", "args", "expected"), ACTIONS, ids=[row[0] for row in ACTIONS])
def test_roots_action(case, args, expected):
    assert roots_action(*args) == expected


LINKS = [("shared", None), ("p@1", 1), ("p@2", 2), ("q@1", 1)]
FOLLOWERS = [
    ("many clients: only its own per-session servers", (1, LINKS, False), ["p@1", "q@1"]),
    ("one client: also the shared servers", (1, LINKS, True), ["shared", "p@1", "q@1"]),
    ("a session with no servers of its own", (7, LINKS, False), []),
]


@pytest.mark.parametrize(("case", "args", "expected"), FOLLOWERS, ids=[row[0] for row in FOLLOWERS])
def test_roots_followers(case, args, expected):
    assert roots_followers(*args) == expected


MESSAGES = [
    (
        "ambiguous",
        ("sampling/createMessage", "git", AMBIGUOUS, False),
        ["several clients", "'git'", 'isolation = "per-session"'],
    ),
    ("no client", ("elicitation/create", "git", UNAVAILABLE, False), ["no client is connected"]),
    ("per-session client gone", ("sampling/createMessage", "nb", UNAVAILABLE, True), ["its client has disconnected"]),
    ("its request ended", ("sampling/createMessage", "git", ENDED, False), ["has ended", "cancelled"]),
]


@pytest.mark.parametrize(("case", "args", "parts"), MESSAGES, ids=[row[0] for row in MESSAGES])
def test_unroutable_says_why_and_what_to_do(case, args, parts):
    text = unroutable(*args)
    assert args[0] in text and all(part in text for part in parts), text
    assert "outside any one client" not in text

"""The events the router takes (``aggregator.core.events``): one typed union, each with
its handler in ``Router.handle``, each an attrs record."""

from __future__ import annotations

import typing

import attrs
import pytest

from aggregator.core import events
from aggregator.core.events import ClientMessage, Event, ServerMessage
from tests.core.helpers import msg

DEFINED = sorted(
    (obj for obj in vars(events).values() if isinstance(obj, type) and obj.__module__ == events.__name__),
    key=lambda cls: cls.__name__,
)


def test_the_union_names_every_event_and_nothing_else():
    assert set(typing.get_args(Event)) == set(DEFINED)


@pytest.mark.parametrize("event", DEFINED, ids=lambda c: c.__name__)
def test_each_event_is_an_attrs_record_with_a_handler(router, event):
    assert attrs.has(event)
    assert event in router._events


def test_an_unknown_event_is_refused(router):
    with pytest.raises(KeyError):
        router.handle(object())


def test_a_call_goes_through_handle_both_ways(router):
    [sent] = router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    [answer] = router.handle(ServerMessage("a", msg(id=sent.message["id"], result={})))
    assert (answer.session, answer.message["id"]) == (1, 1)

"""The router is one class: it composes the objects that own the core's state and handle
its events, and inherits from none of them (no mixins sharing its fields)."""

from __future__ import annotations

from aggregator.core.handlers.client_events import ClientEvents
from aggregator.core.handlers.reconfigure import Reconfigure
from aggregator.core.handlers.server_messages import ServerMessages
from aggregator.core.handlers.upstream_events import UpstreamEvents
from aggregator.core.router import Router


def test_the_router_is_one_class():
    assert Router.__mro__ == (Router, object)


def test_the_event_handlers_are_objects_the_router_composes(router):
    for name, kind in (
        ("upstreams", UpstreamEvents),
        ("reconfigure", Reconfigure),
        ("client_events", ClientEvents),
        ("server_messages", ServerMessages),
    ):
        handler = getattr(router, name)
        assert type(handler) is kind
        assert type(handler).__mro__ == (kind, object)

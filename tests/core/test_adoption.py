"""A legacy session initialized elsewhere (another replica, or before a restart), taken over
with ``ClientAdopted``: no initialize, nothing upstream, and from then on served exactly as
the client that initialized here."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.core.events import ClientAdopted, ClientMessage, ServerMessage
from tests.core.helpers import CLIENT_CAPS, Clock, connect, make_router, msg, unpack

INFO = {"name": "c1"}


def adopt(router: Any, key: int, **kw: Any) -> list[Any]:
    facts: dict[str, Any] = {
        "profile": "default",
        "principal": None,
        "protocol_version": "2025-11-25",
        "capabilities": CLIENT_CAPS,
        "client_info": INFO,
    }
    return router.handle(ClientAdopted(key, **(facts | kw)))


def without_ids(commands: list[Any]) -> list[tuple[str, Any, Any]]:
    """Commands as ``unpack`` gives them, the ids a server sees left out (minted per upstream)."""
    out = []
    for kind, target, message in unpack(commands):
        if kind == "ToServer" and type(message) is dict:
            message = {key: value for key, value in message.items() if key != "id"}
        out.append((kind, target, message))
    return out


# (a request the client sends, what it is answered or where it goes)
SERVED = [
    {"id": 1, "method": "ping"},
    {"id": 2, "method": "tools/list"},
    {"id": 3, "method": "resources/list"},
    {"id": 4, "method": "tools/call", "params": {"name": "a__fast", "arguments": {"x": 1}}},
    {"id": 5, "method": "resources/read", "params": {"uri": "a+demo://r/1"}},
    {"id": 6, "method": "logging/setLevel", "params": {"level": "debug"}},
    {"id": 7, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}}},
    {"id": 8, "method": "tools/call", "params": {"name": "nobody__there"}},
]


@pytest.mark.parametrize("request_", SERVED, ids=lambda r: r["method"])
def test_an_adopted_session_is_served_as_one_initialized_here(request_):
    here, adopted = make_router(Clock()), make_router(Clock())
    connect(here, 1)
    assert adopt(adopted, 1) == []  # nothing upstream, nothing to the client
    expected = without_ids(here.handle(ClientMessage(1, msg(**request_))))
    assert without_ids(adopted.handle(ClientMessage(1, msg(**request_)))) == expected


def test_its_state_is_the_handshake_it_had():
    router = make_router(Clock())
    adopt(router, 4, principal=7, protocol_version="2025-06-18", client_info={"name": "x", "version": "1"})
    info = router.session_info(4)
    assert (info.protocol_version, info.principal, info.profile) == ("2025-06-18", 7, "default")
    client = router.clients[4]
    assert client.initialized and client.capabilities == CLIENT_CAPS and client.client_info["name"] == "x"
    assert client.advertised == router.handshake.merged_capabilities()


def test_a_server_asks_it_what_it_declared():
    """A server's sampling request during its call reaches it (it declared sampling), as it
    would reach the client that initialized here."""
    router = make_router(Clock())
    adopt(router, 1)
    [(_, server, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": "a__slow"})))
    )
    ask = {"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {"messages": []}}
    ask["params"]["_meta"] = {"relatedRequestId": sent["id"]}
    [(kind, key, asked)] = unpack(router.handle(ServerMessage(server, msg(**ask))))
    assert (kind, key, asked["method"]) == ("ToClient", 1, "sampling/createMessage")


def test_a_profile_this_replica_does_not_have_is_refused():
    with pytest.raises(ValueError, match="no such profile"):
        adopt(make_router(Clock()), 1, profile="elsewhere")

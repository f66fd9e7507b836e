"""Subscribe answers held until a modern server acknowledges the listen that carries them.

A legacy client's ``resources/subscribe`` to a modern server becomes a new
``subscriptions/listen`` upstream. Answering the client at once would let it act (call a
tool that changes the resource) before the server registered the subscription, and the
update would be lost. So the answer waits for the server's
``notifications/subscriptions/acknowledged`` of that listen, at most ``ACK_WAIT`` seconds
(a server that never acknowledges delays its clients' subscribes by that much, no more),
or until the listen ends or the connection is lost.

Functions over a link's ``acks`` (the answers held) and its own table (the wait's deadline,
``AckWait``); the router's own-request group calls them and keeps its clock in step.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, NamedTuple

from aggregator.core.commands import Command, ToClient
from aggregator.core.records.links import UpstreamLink
from aggregator.mcp.modern import LISTEN, SUBSCRIPTION_ID

ACK_WAIT = 2.0  # seconds subscribe answers wait for the server to acknowledge its listen


class AckWait(NamedTuple):
    """A placeholder in the own table (never sent): stop holding the subscribe answers of
    the listen ``listen`` at its deadline, acknowledged or not."""

    listen: str


def wait(link: UpstreamLink, listen: str, now: float) -> None:
    """Hold subscribe answers for the listen ``listen`` (the newest: an older one's
    acknowledgment no longer counts), at most ``ACK_WAIT`` from ``now``. The caller's
    clock must wake for the link's own table's new deadline."""
    link.own.drop_if(_ack_wait)
    link.own.open(LISTEN, None, AckWait(listen), now + ACK_WAIT)


def acknowledged(link: UpstreamLink, params: dict[str, Any]) -> bool:
    """Whether the server's acknowledgment (``params``) is of the newest listen held for."""
    meta = params.get("_meta")
    waiting = link.own.find(_ack_wait)
    return type(meta) is dict and waiting is not None and meta.get(SUBSCRIPTION_ID) == waiting.waiter.listen


def release(link: UpstreamLink, clients: Container[int]) -> list[Command]:
    """Answer the held subscribes (of the clients still here, ``clients``), and stop
    waiting (the link's own table changed: the caller's clock must know)."""
    held, link.acks = link.acks, []
    link.own.drop_if(_ack_wait)
    return [ToClient(session, {"jsonrpc": "2.0", "id": id, "result": {}}) for session, id in held if session in clients]


def _ack_wait(waiter: object) -> bool:
    return type(waiter) is AckWait

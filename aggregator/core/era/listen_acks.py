"""Subscribe answers held until a modern server acknowledges the listen that carries them.

A legacy client's ``resources/subscribe`` to a modern server becomes a new
``subscriptions/listen`` upstream. Answering the client at once would let it act (call a
tool that changes the resource) before the server registered the subscription, and the
update would be lost. So the answer waits for the server's
``notifications/subscriptions/acknowledged`` of that listen, at most ``ACK_WAIT`` seconds
(a server that never acknowledges delays its clients' subscribes by that much, no more),
or until the listen ends or the connection is lost.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from aggregator.core.commands import Command
from aggregator.core.state import RouterState, UpstreamLink, answer
from aggregator.mcp.modern import LISTEN, SUBSCRIPTION_ID

ACK_WAIT = 2.0  # seconds subscribe answers wait for the server to acknowledge its listen


class AckWait(NamedTuple):
    """A placeholder in the own table (never sent): stop holding the subscribe answers of
    the listen ``listen`` at its deadline, acknowledged or not."""

    listen: str


class ListenAcks(RouterState):
    def _wait_for_ack(self, link: UpstreamLink, listen: str) -> None:
        """Hold subscribe answers for the listen ``listen`` (the newest: an older one's
        acknowledgment no longer counts)."""
        link.own.drop_if(_ack_wait)
        link.own.open(LISTEN, None, AckWait(listen), self.clock() + ACK_WAIT)
        self._reset_own_at()  # the router's clock wakes for it

    def _listen_acknowledged(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """The server acknowledged a listen: if it is the newest, the answers held for it go out."""
        meta = params.get("_meta")
        waiting = link.own.find(_ack_wait)
        if type(meta) is dict and waiting is not None and meta.get(SUBSCRIPTION_ID) == waiting.waiter.listen:
            return self._release_acks(link)
        return []

    def _release_acks(self, link: UpstreamLink) -> list[Command]:
        """Answer the held subscribes (of the clients still here), and stop waiting."""
        held, link.acks = link.acks, []
        link.own.drop_if(_ack_wait)
        self._reset_own_at()
        return [answer(session, id, {}) for session, id in held if session in self.clients]


def _ack_wait(waiter: object) -> bool:
    return type(waiter) is AckWait

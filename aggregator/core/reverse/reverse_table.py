"""The server-to-client requests in flight, and the URL-mode elicitations still open. Sans-IO.

Rules (invariant 5 of the router):

1. A server's request to a client goes to it under an id the proxy mints (``ask_id``, of
   ``mint``: one counter for the process, which also numbers parked calls, so no id
   repeats): a number, or under ``[cluster]`` the string ``"<replica>.<number>"``, so that
   an answer reaching another replica names the one that asked (``replica_of``); its
   answer goes back under the server's own id. ``requests`` maps (session, proxy id) to
   where the answer goes (``Reverse``); ``ids`` maps (server, the server's id) back, so
   a server's cancel finds its request. A question of the proxy's own (``Question``, the
   input bridge's) has no server id and no entry in ``ids``.
2. Each session's unanswered requests are counted (``asked``); the callers refuse one
   past their limit, so a client that answers nothing holds nothing more.
3. A URL-mode elicitation is its session's until the server says it completed; a server
   may never say so, so past ``limit`` per session the oldest is forgotten.
4. Every entry leaves by ``end`` or ``forget_elicitation``, which keep the counts right;
   a count at zero is no entry at all.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ProxyId = int | str  # what a client knows a server-to-client request by (rule 1)


class Reverse(NamedTuple):
    """A server-to-client request in flight: where its answer goes back to."""

    server: str
    upstream_id: Any
    method: str


class ReverseTable:
    """Server-to-client requests by the (session, proxy id) their client knows them by."""

    def __init__(self, limit: int, replica: str = "") -> None:
        self.limit = limit  # URL-mode elicitations remembered per session
        self.replica = replica  # the name the ids carry ([cluster]); "": plain numbers
        self.requests: dict[tuple[int, ProxyId], Reverse] = {}  # (session, proxy id) -> where back
        self.ids: dict[tuple[str, Any], tuple[int, ProxyId]] = {}  # (server, its id) -> (session, proxy id)
        self.asked: dict[int, int] = {}  # session -> its requests unanswered
        self.elicitations: dict[tuple[str, Any], int] = {}  # (server, elicitationId) -> session
        self.elicitation_count: dict[int, int] = {}  # session -> its entries in ``elicitations``
        self._next_id = 1

    def mint(self) -> int:
        """A new proxy id (rule 1)."""
        id = self._next_id
        self._next_id = id + 1
        return id

    def ask_id(self) -> ProxyId:
        """A new id for a request to a client (rule 1): a number, or one naming this replica."""
        number = self.mint()
        return f"{self.replica}.{number}" if self.replica else number

    def open(self, session: int, reverse: Reverse) -> ProxyId:
        """``session`` is asked a server's request ``reverse``: its proxy id."""
        proxy_id = self.ask_id()
        self.add(session, proxy_id, reverse)
        self.ids[(reverse.server, reverse.upstream_id)] = (session, proxy_id)
        return proxy_id

    def add(self, session: int, proxy_id: ProxyId, reverse: Reverse) -> None:
        """``session`` is asked ``reverse`` under ``proxy_id`` (``ask_id``); only a server's
        own request is found by its id too (``open``)."""
        self.asked[session] = self.asked.get(session, 0) + 1
        self.requests[(session, proxy_id)] = reverse

    def end(self, session: int, proxy_id: Any) -> Reverse | None:
        """Forget a request (answered, refused, withdrawn); None if it was not in flight."""
        reverse = self.requests.pop((session, proxy_id), None)
        if reverse is not None:
            self.ids.pop((reverse.server, reverse.upstream_id), None)
            left = self.asked.get(session, 1) - 1
            if left > 0:
                self.asked[session] = left
            else:
                self.asked.pop(session, None)
        return reverse

    def remember_elicitation(self, server: str, eid: str, session: int) -> None:
        """A URL-mode elicitation of ``server`` is ``session``'s: its completion goes there
        (rule 3; only past the limit is the table searched)."""
        elicitations = self.elicitations
        elicitations.pop((server, eid), None)
        elicitations[(server, eid)] = session
        count = self.elicitation_count[session] = self.elicitation_count.get(session, 0) + 1
        if count > self.limit:
            oldest = next(key for key, owner in elicitations.items() if owner == session)
            self.forget_elicitation(oldest)

    def forget_elicitation(self, key: tuple[str, Any]) -> int | None:
        """Forget an elicitation; the session it was for, if it was known."""
        session = self.elicitations.pop(key, None)
        if session is not None:
            left = self.elicitation_count.get(session, 1) - 1
            if left > 0:
                self.elicitation_count[session] = left
            else:
                self.elicitation_count.pop(session, None)
        return session


def replica_of(id: Any) -> str | None:
    """The replica an id a client answers names (``"<replica>.<number>"``, rule 1); None
    for any other id (a number: one of a proxy without ``[cluster]``)."""
    if type(id) is not str:
        return None
    replica, dot, number = id.rpartition(".")
    return replica if dot and replica and number.isdigit() else None

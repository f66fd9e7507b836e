"""list_changed notices: queued per profile or session, sent together after the debounce. Sans-IO.

``Announcements`` owns what is due and when, and turns it into notices for the clients
it is given (the router's table, read, never changed here):

- A change is queued for a profile (every client of that profile without a view of its
  own) or for one session (by its key), with a count: the number of the change. A client
  is told only of changes numbered after it was given the lists (``announced_upto``, set
  at its handshake from ``count``), so a client that initialized after a change was given
  it already.
- With a debounce, what is queued goes out together once it passes (``at``: the router's
  clock wakes then); without one, at once.
- A modern caller hears of them only on its open ``subscriptions/listen`` requests opened
  before the change, tagged with the listen's id; a legacy session once it initialized,
  for the kinds it was advertised.

It imports the router's records (``state``), the listens (``subscriptions``) and the
session views (``session_catalog``); nothing of the router's groups.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.commands import Command, ToClient
from aggregator.core.lifecycle.upstream_era import MODERN_ERA
from aggregator.core.notices.subscriptions import Listens
from aggregator.core.records.clients import ClientState
from aggregator.mcp.constants import LIST_CHANGED
from aggregator.mcp.modern import SUBSCRIPTION_ID

# Whose notices are due: a profile's clients (by its name) or one session (by its key).
Target = str | int


class Announcements:
    """list_changed notices, per profile (clients without a view of their own) or per session."""

    def __init__(
        self,
        clock: Callable[[], float],
        debounce: float,
        clients: dict[int, ClientState],
        views: SessionViews,
        listens: Listens,
    ) -> None:
        self.clock = clock
        self.debounce = debounce
        self.clients = clients
        self.views = views
        self.listens = listens
        self.due: dict[Target, dict[str, int]] = {}  # profile or session -> notice -> its latest change
        self.count = 0  # the number of the latest change
        self.at: float | None = None  # when what is due goes out (None: nothing is due)

    def announce(self, kinds: list[str], target: Target = "default") -> list[Command]:
        """Queue list_changed notices of ``kinds`` for ``target``; they go out together once
        the debounce passes (at once without one)."""
        if not kinds:
            return []
        self.count += 1
        due = self.due.setdefault(target, {})
        for kind in kinds:
            due[LIST_CHANGED[kind]] = self.count
        if self.debounce <= 0:
            return self.send()
        if self.at is None:
            self.at = self.clock() + self.debounce
        return []

    def inherit(self, profile: str, session: int) -> None:
        """``session`` has just got a view of its own: what its profile has due goes to it
        by its own key from now on."""
        inherited = self.due.get(profile)
        if inherited:
            mine = self.due.setdefault(session, {})
            for method, count in inherited.items():
                mine[method] = max(count, mine.get(method, 0))

    def send(self) -> list[Command]:
        """Everything due, to each client it concerns."""
        due, self.due = self.due, {}
        self.at = None
        out: list[Command] = []
        for client in self.clients.values():
            if client.era is MODERN_ERA:
                if not self.listens.count(client.key):
                    continue  # it hears of changes only on its listens
            elif not client.initialize_seen:
                continue
            methods = dict(due.get(client.key, ()))
            if client.key not in self.views:
                for method, count in due.get(client.profile, {}).items():
                    methods[method] = max(count, methods.get(method, 0))
            if client.era is MODERN_ERA:  # only on its listens
                out += self._on_listens(client, methods)
                continue
            for method, count in methods.items():
                if count <= client.announced_upto:
                    continue  # changed before it was given the lists: nothing new to it
                capability = method.split("/")[1]
                if capability in client.advertised:
                    out.append(ToClient(client.key, {"jsonrpc": "2.0", "method": method}))
        return out

    def _on_listens(self, client: ClientState, methods: dict[str, int]) -> list[Command]:
        """The notices due to a modern client's listens (those opened before the change), each tagged."""
        out: list[Command] = []
        for listen in self.listens.of_session(client.key):
            for method, count in methods.items():
                if count > listen.since and method in listen.methods:
                    notice = {"jsonrpc": "2.0", "method": method, "params": {"_meta": {SUBSCRIPTION_ID: listen.id}}}
                    out.append(ToClient(client.key, notice, listen.id))
        return out

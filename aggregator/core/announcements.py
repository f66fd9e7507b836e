"""list_changed notices: queued per profile or session, sent together after the debounce. Sans-IO.

A modern caller hears of them only on its open ``subscriptions/listen`` requests, tagged
with the listen's id (``modern_callers``); a legacy session once it initialized.
"""

from __future__ import annotations

from aggregator.core.commands import Command, ToClient
from aggregator.core.state import RouterState
from aggregator.core.upstream_era import Era
from aggregator.mcp.constants import LIST_CHANGED


class Announcements(RouterState):
    """list_changed notices, per profile (clients without a view of their own) or per session."""

    def _announce(self, kinds: list[str], profile: str | int = "default") -> list[Command]:
        """Queue list_changed notices for one profile's clients (those without a view of
        their own), or for one session (by its key); they go out together once the
        debounce passes, each to the clients given the lists before it changed (a client
        that initialized after the change was given it already)."""
        if not kinds:
            return []
        self._announce_count += 1
        due = self._announce_methods.setdefault(profile, {})
        for kind in kinds:
            due[LIST_CHANGED[kind]] = self._announce_count
        if self.list_changed_debounce <= 0:
            return self._send_announcements()
        if self._announce_at is None:
            self._announce_at = self.clock() + self.list_changed_debounce
        return []

    def _send_announcements(self) -> list[Command]:
        due, self._announce_methods = self._announce_methods, {}
        self._announce_at = None
        out: list[Command] = []
        for client in self.clients.values():
            if client.era is Era.MODERN:
                if not self.listens.count(client.key):
                    continue  # it hears of changes only on its listens
            elif not client.initialize_seen:
                continue
            methods = dict(due.get(client.key, ()))
            if client.key not in self.views:
                for method, count in due.get(client.profile, {}).items():
                    methods[method] = max(count, methods.get(method, 0))
            if client.era is Era.MODERN:  # only on its listens (``modern_callers``)
                out += self._listen_notices(client, methods)
                continue
            for method, count in methods.items():
                if count <= client.announced_upto:
                    continue  # changed before it was given the lists: nothing new to it
                capability = method.split("/")[1]
                if capability in client.advertised:
                    out.append(ToClient(client.key, {"jsonrpc": "2.0", "method": method}))
        return out

"""Resource subscriptions, refcounted across client sessions. Pure data.

One upstream subscription per (server, upstream URI), however many clients asked: the
first subscriber makes the proxy subscribe upstream, the last one leaving makes it
unsubscribe. ``notifications/resources/updated`` goes only to the sessions subscribed.
"""

from __future__ import annotations

Key = tuple[str, str]  # (server, upstream URI)


class Subscriptions:
    def __init__(self) -> None:
        self._sessions: dict[Key, set[int]] = {}

    def add(self, key: Key, session: int) -> bool:
        """Subscribe a session; True if it is the first (subscribe upstream)."""
        sessions = self._sessions.setdefault(key, set())
        first = not sessions
        sessions.add(session)
        return first

    def remove(self, key: Key, session: int) -> bool:
        """Unsubscribe a session; True if it was the last (unsubscribe upstream)."""
        sessions = self._sessions.get(key)
        if not sessions or session not in sessions:
            return False
        sessions.discard(session)
        if sessions:
            return False
        del self._sessions[key]
        return True

    def has(self, key: Key, session: int) -> bool:
        return session in self._sessions.get(key, ())

    def subscribers(self, key: Key) -> set[int]:
        return self._sessions.get(key, set())

    def drop_session(self, session: int) -> list[Key]:
        """Forget a session; return the keys nobody is subscribed to any more."""
        emptied = []
        for key in [k for k, s in self._sessions.items() if session in s]:
            if self.remove(key, session):
                emptied.append(key)
        return emptied

    def of_server(self, server: str) -> list[str]:
        """The URIs someone is subscribed to on a server (to renew after a restart)."""
        return [uri for (name, uri) in self._sessions if name == server]

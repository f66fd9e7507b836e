"""Resource subscriptions, refcounted across client sessions. Pure data.

One upstream subscription per (server, upstream URI), however many clients asked: the
first subscriber makes the proxy subscribe upstream, the last one leaving makes it
unsubscribe. ``notifications/resources/updated`` goes only to the sessions subscribed.

A modern caller subscribes through ``subscriptions/listen`` instead (``Listens``): the
resources its open listens name count as its subscriptions here, once per client.
"""

from __future__ import annotations

Key = tuple[str, str]  # (server, upstream URI)


class Subscriptions:
    def __init__(self) -> None:
        self._sessions: dict[Key, set[int]] = {}
        # The same, by session: a session that leaves is forgotten in what it holds, not by
        # a scan of every subscription (a stateless request leaves after each answer).
        # (A dict for its order: what a leaving session frees goes in the order it came.)
        self._keys: dict[int, dict[Key, None]] = {}

    def add(self, key: Key, session: int) -> bool:
        """Subscribe a session; True if it is the first (subscribe upstream)."""
        sessions = self._sessions.setdefault(key, set())
        first = not sessions
        sessions.add(session)
        self._keys.setdefault(session, {})[key] = None
        return first

    def remove(self, key: Key, session: int) -> bool:
        """Unsubscribe a session; True if it was the last (unsubscribe upstream)."""
        sessions = self._sessions.get(key)
        if not sessions or session not in sessions:
            return False
        sessions.discard(session)
        keys = self._keys[session]
        keys.pop(key, None)
        if not keys:
            del self._keys[session]
        if sessions:
            return False
        del self._sessions[key]
        return True

    def holds(self, session: int) -> bool:
        """Whether a session is subscribed to anything."""
        return session in self._keys

    def has(self, key: Key, session: int) -> bool:
        return session in self._sessions.get(key, ())

    def subscribers(self, key: Key) -> set[int]:
        return self._sessions.get(key, set())

    def drop_session(self, session: int) -> list[Key]:
        """Forget a session; return the keys nobody is subscribed to any more."""
        emptied = []
        for key in list(self._keys.get(session, ())):
            if self.remove(key, session):
                emptied.append(key)
        return emptied

    def of_server(self, server: str) -> list[str]:
        """The URIs someone is subscribed to on a server (to renew after a restart)."""
        return [uri for (name, uri) in self._sessions if name == server]


class Listen:
    """One modern caller's open ``subscriptions/listen`` request: what it asked for and
    the proxy agreed to (``methods``: the list_changed notifications; ``keys``: the
    resources, by (link, upstream URI)), and the announcement count when it opened (a
    change queued before is not news to it)."""

    __slots__ = ("session", "id", "methods", "keys", "since")

    def __init__(self, session: int, id: object, methods: frozenset[str], keys: set[Key], since: int) -> None:
        self.session = session
        self.id = id
        self.methods = methods
        self.keys = keys
        self.since = since


class Listens:
    """The open listen requests, by client and request id. Each resource key a listen holds
    is one subscription of its client in ``Subscriptions`` (shared by the client's listens)."""

    def __init__(self) -> None:
        # Read-only outside: ``client.key in listens.by_session`` is the hot path's test
        # that a client has no listen open (a dict lookup, no call).
        self.by_session: dict[int, dict[object, Listen]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_session)

    def open(self, listen: Listen) -> None:
        self.by_session.setdefault(listen.session, {})[listen.id] = listen

    def get(self, session: int, id: object) -> Listen | None:
        own = self.by_session.get(session)
        return own.get(id) if own is not None else None

    def count(self, session: int) -> int:
        return len(self.by_session.get(session, ()))

    def of_session(self, session: int) -> list[Listen]:
        return list(self.by_session.get(session, {}).values())

    def close(self, session: int, id: object) -> tuple[Listen | None, list[Key]]:
        """End one listen: it, and the keys no other listen of its client still holds."""
        own = self.by_session.get(session)
        listen = own.pop(id, None) if own is not None else None
        if listen is None or own is None:
            return None, []
        if not own:
            del self.by_session[session]
        still = set().union(*(other.keys for other in own.values())) if own else set()
        return listen, [key for key in listen.keys if key not in still]

    def drop_session(self, session: int) -> list[Listen]:
        return list(self.by_session.pop(session, {}).values())

    def all(self) -> list[Listen]:
        return [listen for own in self.by_session.values() for listen in own.values()]

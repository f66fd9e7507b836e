"""What one session sees when some of its servers are its own (``isolation = "per-session"``).

A per-session server's items belong to its session. Once the session's own connection to
such a server has listed, that listing replaces the server's shared listing for this
session, in every list and every lookup (names, URIs, templates), through the same policy,
naming and collision rules as any server; every other server's items come from the
session's profile catalog, read in place. So a view holds what its own connections list
(their items, exposed forms and routes) and a few numbers, never a copy of the shared
catalog, and nothing of it is seen by another session.

Composing the two is exact while no item of the session's own servers meets another
server's: the normal case, each server having its own prefix. When one does (an own item
takes a name, URI or template another server has; the shared listing of an own server won
or lost a collision; two own servers collide), or when plugins' catalog hooks must see a
whole list, the view builds a full catalog over the same store (own listings first, then
the shared one) in the profile catalog's way, and serves from it until the collision is
gone. Either way the session sees what a catalog built from scratch over that store shows:
the tests compare the two.

Pure data in, data out. Each change returns the kinds whose visible list changed, so the
router announces ``list_changed`` to this session only, and only for real changes.
"""

from __future__ import annotations

import itertools
from collections import ChainMap
from typing import Any

from aggregator.core.catalogs.catalog import Catalog, CatalogLookups, Route
from aggregator.jsonrpc.codec import dumps
from aggregator.mcp.constants import KINDS

# Generations of views, unique in the process and never a profile catalog's (an integer):
# a cursor made for one list is refused by any other.
_STAMPS = itertools.count(1)

Items = list[dict[str, Any]]


class _Routes:
    """One route table of a composed view: the session's own servers' routes, then the
    profile's for every other server."""

    __slots__ = ("view", "attr")

    def __init__(self, view: SessionCatalog, attr: str) -> None:
        self.view = view
        self.attr = attr

    def get(self, key: str, default: Route | None = None) -> Route | None:
        own = self.view.own
        for catalog in own.values():
            route: Route | None = getattr(catalog, self.attr).get(key)
            if route is not None:
                return route
        route = getattr(self.view.shared, self.attr).get(key)
        if route is None or route.server in own:
            return default
        return route

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


class SessionCatalog(CatalogLookups):
    """One session's catalog: its profile's, with its own servers' listings in place of
    their shared ones. Answers the same queries as ``Catalog``."""

    def __init__(self, shared: Catalog) -> None:
        self.shared = shared
        self.naming = shared.naming
        self.uri_prefixes = shared.uri_prefixes
        self.own: dict[str, Catalog] = {}  # own server -> a catalog of its own listing only
        # The store a full catalog reads: each own server's listing, then the shared store.
        self._items: ChainMap[str, dict[str, Items]] = ChainMap(shared._items)
        self._full: Catalog | None = None
        self._order = {name: index for index, name in enumerate(shared.naming)}
        self.generation = f"s{next(_STAMPS)}"
        self.search_cache: Any = None  # ``core.catalogs.discovery``: its size in tokens and search index
        self._tools = _Routes(self, "tools")
        self._prompts = _Routes(self, "prompts")
        self._resources = _Routes(self, "resources")

    # --- the tables the lookups read ------------------------------------------------------

    @property
    def tools(self) -> Any:
        return self._full.tools if self._full is not None else self._tools

    @property
    def prompts(self) -> Any:
        return self._full.prompts if self._full is not None else self._prompts

    @property
    def resources(self) -> Any:
        return self._full.resources if self._full is not None else self._resources

    @property
    def _templates(self) -> list[tuple[str, str, str]]:
        if self._full is not None:
            return self._full._templates
        own = self.own
        entries = [entry for entry in self.shared._templates if entry[0] not in own]
        for catalog in own.values():
            entries += catalog._templates
        entries.sort(key=lambda entry: self._order[entry[0]])  # config order; stable within a server
        return entries

    def uri_visible(self, server: str, uri: str) -> bool:
        if self._full is not None:
            return self._full.uri_visible(server, uri)
        return self.own.get(server, self.shared).uri_visible(server, uri)

    def owns(self, server: str) -> bool:
        """Whether the session sees its own listing of ``server``."""
        return server in self.own

    # --- changes --------------------------------------------------------------------------

    def set_listing(self, server: str, listing: dict[str, Items]) -> list[str]:
        """The session's own connection to ``server`` listed every kind it has: from now on
        the session sees that listing for it. Returns the kinds whose visible list changed."""
        before = self._snapshot()
        catalog = self.own.get(server)
        if catalog is None:
            shared = self.shared
            catalog = Catalog(
                [shared.naming[server]],
                shared.separator,
                shared.page_size,
                store={},
                policy=shared.policy,
                max_name_length=shared.max_name_length,
                charset=shared.charset,
            )
            self.own[server] = catalog
            self._items.maps.insert(0, catalog._items)
        catalog._items[server] = {kind: listing[kind] for kind in KINDS if kind in listing}
        for kind in KINDS:
            catalog.rebuild(kind)
        self._settle(rebuild=True)
        return self._changed_since(before)

    def set_items(self, server: str, kind: str, items: Items) -> list[str]:
        """A fresh listing of one kind from the session's own connection to ``server``."""
        return self._update(kind, self.own[server].set_items(server, kind, items))

    def shared_changed(self, server: str, kind: str, changed: bool) -> list[str]:
        """The profile catalog took a fresh listing of one kind from ``server`` (``changed``:
        whether what the profile shows changed). Returns ``[kind]`` if this view changed."""
        return self._update(kind, changed and server not in self.own)

    def drop(self, server: str) -> list[str]:
        """The session's own connection to ``server`` is gone: the session sees the shared
        listing of it again. Returns the kinds whose visible list changed."""
        catalog = self.own.get(server)
        if catalog is None:
            return []
        before = self._snapshot()
        del self.own[server]
        self._items.maps = [store for store in self._items.maps if store is not catalog._items]
        self._settle(rebuild=True)
        return self._changed_since(before)

    def _update(self, kind: str, composed_changed: bool) -> list[str]:
        was = self._full
        self._settle(rebuild=False)
        if was is None and self._full is None:
            changed = composed_changed
        elif self._full is not None and self._full is was:
            changed = self._full.rebuild(kind)
        else:
            changed = True  # how the view is built changed with this kind: say it may have
        if changed:
            self.generation = f"s{next(_STAMPS)}"
        return [kind] if changed else []

    def _settle(self, rebuild: bool) -> None:
        """Compose, or build in full if something of the session's own servers collides."""
        if not self._collides():
            self._full = None
        elif self._full is None or rebuild:
            shared = self.shared
            full = Catalog(
                shared.naming.values(),
                shared.separator,
                shared.page_size,
                store=self._items,
                policy=shared.policy,
                max_name_length=shared.max_name_length,
                charset=shared.charset,
                catalog_hook=shared.catalog_hook,
            )
            for kind in KINDS:
                full.rebuild(kind)
            self._full = full

    def _collides(self) -> bool:
        shared, own = self.shared, self.own
        if shared.catalog_hook is not None:
            return True
        for kind in KINDS:
            if not own.keys().isdisjoint(shared.contested[kind]):
                return True
        for attr in ("tools", "prompts", "resources"):
            theirs = getattr(shared, attr)
            seen: set[str] = set()
            for catalog in own.values():
                for key in getattr(catalog, attr):
                    route = theirs.get(key)
                    if (route is not None and route.server not in own) or key in seen:
                        return True
                    seen.add(key)
        theirs_templates = {entry[2] for entry in shared._templates if entry[0] not in own}
        seen = set()
        for catalog in own.values():
            for _server, _original, key in catalog._templates:
                if key in theirs_templates or key in seen:
                    return True
                seen.add(key)
        return False

    def _snapshot(self) -> dict[str, Items]:
        return {kind: self.visible(kind) for kind in KINDS}

    def _changed_since(self, before: dict[str, Items]) -> list[str]:
        changed = [kind for kind in KINDS if self.visible(kind) != before[kind]]
        if changed:
            self.generation = f"s{next(_STAMPS)}"
        return changed

    # --- what the session is shown --------------------------------------------------------

    def _pieces(self, kind: str) -> list[tuple[Items, int, int]]:
        """The visible list of one kind as slices (list, start, end) of the profile's and
        the own catalogs' lists, in config order."""
        if self._full is not None:
            items = self._full.exposed[kind]
            return [(items, 0, len(items))]
        shared_items = self.shared.exposed[kind]
        bounds = self.shared.bounds[kind]
        pieces: list[tuple[Items, int, int]] = []
        position = 0
        for name in sorted(self.own, key=self._order.__getitem__):
            start, end = bounds.get(name, (position, position))
            if start > position:
                pieces.append((shared_items, position, start))
            own_items = self.own[name].exposed[kind]
            if own_items:
                pieces.append((own_items, 0, len(own_items)))
            position = end
        if position < len(shared_items):
            pieces.append((shared_items, position, len(shared_items)))
        return pieces

    def visible(self, kind: str) -> Items:
        """Everything of one kind the session sees, in order (a new list)."""
        return [item for items, start, end in self._pieces(kind) for item in items[start:end]]

    def page(self, kind: str, cursor: object) -> bytes:
        """The serialized result of one `*/list` page; raises on a bad cursor."""
        codec = self.shared._cursors
        offset = 0 if cursor is None else codec.decode(cursor, kind, self.generation)
        size = self.shared.page_size
        items: Items = []
        total = 0
        for listed, start, end in self._pieces(kind):
            length = end - start
            if len(items) < size and offset < total + length:
                first = start + max(0, offset - total)
                items.extend(listed[first : min(end, first + size - len(items))])
            total += length
        result: dict[str, Any] = {kind: items}
        if offset + size < total:
            result["nextCursor"] = codec.encode(kind, self.generation, offset + size)
        return dumps(result)


class SessionViews:
    """The views of the sessions that have one, by session key: made when a session's own
    connection first lists, gone when its last own connection ends or the session leaves."""

    def __init__(self) -> None:
        self._views: dict[int, SessionCatalog] = {}

    def __bool__(self) -> bool:
        return bool(self._views)

    def __contains__(self, session: int) -> bool:
        return session in self._views

    def get(self, session: int) -> SessionCatalog | None:
        return self._views.get(session)

    def pop(self, session: int) -> None:
        self._views.pop(session, None)

    def listed(
        self, session: int, profile: Catalog, server: str, listing: dict[str, Items]
    ) -> tuple[SessionCatalog, list[str], bool]:
        """A session's own connection to ``server`` listed: (its view, the kinds that
        changed for it, whether the view is new)."""
        view = self._views.get(session)
        made = view is None
        if view is None:
            view = self._views[session] = SessionCatalog(profile)
        return view, view.set_listing(server, listing), made

    def own_items(self, session: int, server: str, kind: str, items: Items) -> list[str]:
        """A fresh listing of one kind from a session's own connection: the kinds that
        changed for it (none before that connection has listed in full)."""
        view = self._views.get(session)
        if view is None or not view.owns(server):
            return []
        return view.set_items(server, kind, items)

    def shared_changed(self, profile: Catalog, server: str, kind: str, changed: bool) -> list[tuple[int, list[str]]]:
        """``profile`` took a listing of ``server``: (session, kinds) for each view over it
        that changed."""
        out = []
        for session, view in self._views.items():
            if view.shared is profile:
                kinds = view.shared_changed(server, kind, changed)
                if kinds:
                    out.append((session, kinds))
        return out

    def seen_over(self, profile: Catalog) -> dict[int, dict[str, Items]]:
        """What each session with a view over ``profile`` sees now (before a renewal)."""
        return {session: view._snapshot() for session, view in self._views.items() if view.shared is profile}

    def renewed(self, profile: Catalog, seen: dict[int, dict[str, Items]]) -> list[tuple[int, list[str]]]:
        """``profile`` was renewed in place (a reload: servers, names, rules): each view over
        it takes its names, order and rules, for the session's own listings too. Returns
        (session, kinds) for each view whose visible lists changed since ``seen``."""
        out = []
        for session, before in seen.items():
            view = self._views[session]
            view.naming, view.uri_prefixes = profile.naming, profile.uri_prefixes
            view._order = {name: index for index, name in enumerate(profile.naming)}
            for server, own in view.own.items():
                own.naming = {server: profile.naming[server]}
                own.uri_prefixes = {n.uri_prefix.lower(): n.name for n in own.naming.values() if n.uri_prefix}
                own.policy = profile.policy
                for kind in KINDS:
                    own.rebuild(kind)
            view._settle(rebuild=True)
            kinds = view._changed_since(before)
            if kinds:
                out.append((session, kinds))
        return out

    def lost(self, session: int, server: str) -> tuple[list[str], bool]:
        """A session's own connection to ``server`` ended: (the kinds that changed for it,
        whether it has no view any more)."""
        view = self._views.get(session)
        if view is None:
            return [], False
        changed = view.drop(server)
        if view.own:
            return changed, False
        del self._views[session]
        return changed, True

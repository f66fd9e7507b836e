"""The merged catalog: every server's tools, prompts, resources and templates, exposed.

Owns the exposed names and URIs, the maps back to ``(server, original)``, collision
resolution, and the pages served to clients. Pure data in, data out.

Order is deterministic: servers in config order, each server's items in the order the
upstream listed them. Each rebuild that changes what clients see bumps ``generation``,
which empties the cache of serialized pages; a cursor is bound to a digest of the list it
pages through (``listed``), so it is refused once that list changed, and read by every
replica that lists the same items.

Resources and templates are looked up, checked and compared in normal form
(``aggregator.core.catalogs.uris``): a client's URI is normalised once, in ``route_uri`` and
``route_template``, before any table or rule sees it, and the tables are keyed by the
normal form of what servers list. So every spelling of a hidden URI is as absent as the
URI itself, and every spelling of a listed one reaches its server under the server's own
spelling.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, NamedTuple

from aggregator.core.catalogs.cursor import CursorCodec
from aggregator.core.catalogs.naming import disambiguate, expose_name, tool_prefix, uri_prefix
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.catalogs.uris import (
    InvalidUri,
    expose_uri,
    normalize_template,
    normalize_uri,
    readings,
    split_uri,
    template_matches,
)
from aggregator.jsonrpc.codec import dumps
from aggregator.mcp.constants import CAPABILITY_OF as CAPABILITY_OF  # re-exported (router)
from aggregator.mcp.constants import KEY_OF, KINDS, PROMPTS, RESOURCES, TEMPLATES, TOOLS
from aggregator.mcp.constants import LIST_METHODS as LIST_METHODS  # re-exported (router)

log = logging.getLogger(__name__)

# What plugins' catalog hooks are to the core: (profile, kind, items) -> the items kept.
CatalogHook = Callable[[str, str, list[dict[str, Any]]], list[dict[str, Any]]]


def _compared(kind: str, original: str) -> str:
    """A server's own key as policy and lookups compare it: names as they are, URIs and
    templates in normal form. Raises ``InvalidUri`` for a URI no client could read."""
    if kind == RESOURCES:
        return normalize_uri(original)
    if kind == TEMPLATES:
        return normalize_template(original)
    return original


class Route(NamedTuple):
    server: str
    original: str


class ServerNaming(NamedTuple):
    name: str
    prefix: str
    uri_prefix: str


class CatalogLookups:
    """Name and URI lookups over a catalog's tables; shared by ``Catalog`` and the
    per-session view (``aggregator.core.catalogs.session_catalog``), which provide the tables:
    ``tools``, ``prompts``, ``resources`` (anything with ``get``), ``_templates``,
    ``_items`` (the store), ``naming``, ``uri_prefixes`` and ``uri_visible``."""

    tools: Any
    prompts: Any
    resources: Any
    _templates: Any
    _items: Any
    naming: dict[str, ServerNaming]
    uri_prefixes: dict[str, str]

    def uri_visible(self, server: str, uri: str) -> bool:
        raise NotImplementedError

    def route_uri(self, uri: str) -> Route | None:
        """The server that owns an exposed resource URI, and the URI to send it: its own
        spelling of a URI it listed, else the normal form. None if no server owns it or this
        profile may not read it; ``InvalidUri`` if it is refused whoever owns it."""
        normal = normalize_uri(uri)
        if normal.startswith("aggregator:"):
            return None  # the proxy's own scheme (kept results): never a server's
        route: Route | None = self.resources.get(normal)
        if route is not None:
            return route
        route = self._owner(normal)
        if route is None or not self.uri_visible(*route):
            return None
        return route

    def _owner(self, uri: str) -> Route | None:
        split = split_uri(uri, self.uri_prefixes)
        if split is not None:
            return Route(*split)
        # Servers that keep their URIs: by template, then the only such server.
        unprefixed = [
            n.name
            for n in self.naming.values()
            if not n.uri_prefix
            and (RESOURCES in self._items.get(n.name, {}) or TEMPLATES in self._items.get(n.name, {}))
        ]
        for server, _original, template in self._templates:
            if server in unprefixed and template_matches(template, uri):
                return Route(server, uri)
        if len(unprefixed) == 1:
            return Route(unprefixed[0], uri)
        return None

    def route_template(self, exposed: str) -> Route | None:
        """The server and its own template for an exposed template (``completion/complete``
        names one), or failing that ``route_uri`` of it: a ref may name a plain URI."""
        plus = exposed.find("+")
        prefix = exposed[:plus].lower() if plus > 0 else ""
        if prefix in self.uri_prefixes:  # the prefix is compared without case, like a scheme's
            key = f"{prefix}+{normalize_template(exposed[plus + 1 :])}"
        else:
            key = normalize_template(exposed)
        for server, original, template in self._templates:
            if template == key:
                return Route(server, original)
        return self.route_uri(exposed)


class Catalog(CatalogLookups):
    """What one profile sees. Several catalogs may share one ``store`` of upstream items."""

    def __init__(
        self,
        servers: Iterable[Any],
        separator: str,
        page_size: int,
        *,
        store: MutableMapping[str, dict[str, list[dict[str, Any]]]] | None = None,
        policy: ProfilePolicy | None = None,
        max_name_length: int = 128,
        charset: str = "mcp",
        catalog_hook: CatalogHook | None = None,
        cursors: CursorCodec | None = None,
    ) -> None:
        # The plugins' catalog hooks (sync, one plain callable), given what this profile
        # sees of each kind; None when no plugin has one.
        self.catalog_hook = catalog_hook
        self.separator = separator
        self.page_size = page_size
        self.policy = policy
        self.max_name_length = max_name_length
        self.charset = charset
        # (server, original, reason) per kind, for `aggregator tools --explain`
        self.hidden: dict[str, list[tuple[str, str, str]]] = {kind: [] for kind in KINDS}
        self._hidden_uris: set[tuple[str, str]] = set()  # (server, its URI in normal form)
        self._hidden_templates: list[tuple[str, str]] = []  # (server, its template in normal form)
        self.naming: dict[str, ServerNaming] = {
            s.name: ServerNaming(s.name, tool_prefix(s), uri_prefix(s)) for s in servers
        }
        self.uri_prefixes = {n.uri_prefix.lower(): n.name for n in self.naming.values() if n.uri_prefix}
        self.generation = 0
        # server -> kind -> upstream items, for servers that are ready
        self._items: MutableMapping[str, dict[str, list[dict[str, Any]]]] = store if store is not None else {}
        self.exposed: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        self.tools: dict[str, Route] = {}
        self.prompts: dict[str, Route] = {}
        self.resources: dict[str, Route] = {}  # by exposed URI in normal form
        self._templates: list[tuple[str, str, str]] = []  # (server, original, exposed in normal form)
        self.collisions: dict[str, list[str]] = {kind: [] for kind in KINDS}
        # For per-session views over this catalog: the servers whose items collided with
        # another server's, and where each server's items are in ``exposed`` (start, end),
        # per kind (no bounds while plugins may reorder what is exposed).
        self.contested: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self.bounds: dict[str, dict[str, tuple[int, int]]] = {kind: {} for kind in KINDS}
        self._cursors = cursors if cursors is not None else CursorCodec()
        self._listed: dict[str, tuple[int, str]] = {}  # kind -> (generation, digest of its list)
        self._page_cache: dict[tuple[str, int], bytes] = {}
        self.search_cache: Any = None  # ``core.catalogs.discovery``: its size in tokens and search index

    # --- updates ---------------------------------------------------------------------

    def set_items(self, server: str, kind: str, items: list[dict[str, Any]]) -> bool:
        """Replace one server's items of one kind; True if what clients see changed."""
        self._items.setdefault(server, {})[kind] = items
        return self.rebuild(kind)

    def forget(self, server: str) -> list[str]:
        """Drop a server's items from the (shared) store; return the kinds it had.
        Each catalog over the store then needs ``rebuild`` for those kinds."""
        return list(self._items.pop(server, {}))

    def items_of(self, server: str, kind: str) -> list[dict[str, Any]]:
        return self._items.get(server, {}).get(kind, [])

    def rebuild(self, kind: str) -> bool:
        """Recompute what this catalog exposes of one kind from the (shared) store; True if
        what clients see changed."""
        key = KEY_OF[kind]
        named = kind in (TOOLS, PROMPTS)
        hidden: list[tuple[str, str, str]] = []
        # The server's own key as policy compares it: URIs and templates in normal form.
        hidden_keys: list[tuple[str, str]] = []
        candidates = self._candidates(kind, hidden, hidden_keys)
        routes, assigned, collisions, contested = self._assign(kind, candidates)
        # 3. What clients see, in listing order.
        exposed_items: list[dict[str, Any]] = []
        templates: list[tuple[str, str, str]] = []
        lookup_of: dict[str, str] = {}  # exposed name, URI or template -> its lookup key
        counts: dict[str, int] = {}
        for index, (name, original, item, _, _, lookup) in enumerate(candidates):
            exposed = assigned.get(index)
            if exposed is None:
                continue
            counts[name] = counts.get(name, 0) + 1
            exposed_items.append(item if exposed == original else {**item, key: exposed})
            lookup_of[exposed] = lookup if not named else exposed
            if kind == TEMPLATES:
                templates.append((name, original, lookup))
        if self.catalog_hook is not None:
            exposed_items, names = self._plugins_keep(kind, exposed_items, lookup_of, routes, hidden, hidden_keys)
            templates = [t for t in templates if t[2] in names]
            self.bounds[kind] = {}
        else:
            self.bounds[kind] = self._bounds(counts)
        self.hidden[kind] = hidden
        if kind == TOOLS:
            self.tools = routes
        elif kind == PROMPTS:
            self.prompts = routes
        elif kind == RESOURCES:
            self.resources = routes
            self._hidden_uris = set(hidden_keys)
        else:
            self._templates = templates
            self._hidden_templates = hidden_keys
        for message in collisions:
            if message not in self.collisions[kind]:
                log.warning("name collision: %s", message)
        self.collisions[kind] = collisions
        self.contested[kind] = contested
        changed = exposed_items != self.exposed[kind]
        self.exposed[kind] = exposed_items
        if changed:
            self.generation += 1
            self._page_cache.clear()
        return changed

    def _candidates(
        self, kind: str, hidden: list[tuple[str, str, str]], hidden_keys: list[tuple[str, str]]
    ) -> list[tuple[str, str, dict[str, Any], str, bool, str]]:
        """1. Candidates, in listing order: (server, original, item as exposed, name, exact,
        lookup key: the name, or the exposed URI or template in normal form). What policy
        hides goes to ``hidden`` and ``hidden_keys`` instead."""
        key = KEY_OF[kind]
        candidates: list[tuple[str, str, dict[str, Any], str, bool, str]] = []
        for name, naming in self.naming.items():
            for item in self._items.get(name, {}).get(kind) or ():
                original = item.get(key) if type(item) is dict else None
                if type(original) is not str or not original:
                    log.warning("server %s: ignoring a %s entry without a %r", name, kind, key)
                    continue
                try:
                    compared = _compared(kind, original)
                except InvalidUri as exc:
                    log.warning("server %s: ignoring resource %r: %s", name, original[:200], exc)
                    continue
                override = None
                if self.policy is not None:
                    reason = self.policy.hidden_reason(name, kind, compared, item)
                    if reason is not None:
                        hidden.append((name, original, reason))
                        hidden_keys.append((name, compared))
                        continue
                    override = self.policy.override(name, kind, original)
                    if override is not None:
                        shown = (("title", override.title), ("description", override.description))
                        item = {**item, **{k: v for k, v in shown if v}}
                if kind in (TOOLS, PROMPTS):
                    base = override.name if override is not None and override.name else original
                    exposed = expose_name(naming.prefix, self.separator, base, self.max_name_length, self.charset)
                    exact = exposed == (f"{naming.prefix}{self.separator}{base}" if naming.prefix else base)
                    lookup = exposed
                else:
                    exposed, exact = expose_uri(naming.uri_prefix, original), True
                    # The prefix is ours and already valid: only its case can change.
                    lookup = expose_uri(naming.uri_prefix.lower(), compared)
                candidates.append((name, original, item, exposed, exact, lookup))
        return candidates

    def _assign(
        self, kind: str, candidates: list[tuple[str, str, dict[str, Any], str, bool, str]]
    ) -> tuple[dict[str, Route], dict[int, str], list[str], set[str]]:
        """2. Names, by priority: names used as they are before names that had to be changed
        (sanitised or shortened), each in config order. So a collision never depends on the
        order a server lists things in, and a name stays the same across restarts.
        Returns (routes by lookup key, exposed name by candidate, collisions, contested servers)."""
        order = sorted(range(len(candidates)), key=lambda i: (not candidates[i][4], i))
        routes: dict[str, Route] = {}
        assigned: dict[int, str] = {}
        collisions: list[str] = []
        contested: set[str] = set()
        for index in order:
            name, original, _item, exposed, _exact, lookup = candidates[index]
            if lookup in routes:
                first = routes[lookup]
                if first.server == name and first.original == original:
                    continue  # the same item listed twice by one server
                if first.server != name:
                    contested.update((first.server, name))
                if kind in (TOOLS, PROMPTS):
                    renamed = disambiguate(exposed, name, original, self.max_name_length)
                    collisions.append(
                        f"{kind[:-1]} name {exposed!r}: {first.server}:{first.original!r} keeps"
                        f" it, {name}:{original!r} is exposed as {renamed!r}"
                    )
                    exposed = lookup = renamed
                    if exposed in routes:
                        continue
                else:
                    collisions.append(
                        f"{kind[:-1]} {exposed!r} is listed by {first.server} and {name}; {first.server} serves it"
                    )
                    continue
            routes[lookup] = Route(name, original)
            assigned[index] = exposed
        return routes, assigned, collisions, contested

    def _plugins_keep(
        self,
        kind: str,
        exposed_items: list[dict[str, Any]],
        lookup_of: dict[str, str],
        routes: dict[str, Route],
        hidden: list[tuple[str, str, str]],
        hidden_keys: list[tuple[str, str]],
    ) -> tuple[list[dict[str, Any]], set[str]]:
        """Plugins may drop items or change how they read, never their exposed names: what
        they keep, and its lookup keys. What they drop leaves ``routes`` for ``hidden``."""
        assert self.catalog_hook is not None
        key = KEY_OF[kind]
        profile = self.policy.name if self.policy is not None else "default"
        kept = [
            item
            for item in self.catalog_hook(profile, kind, exposed_items)
            if type(item) is dict and item.get(key) in lookup_of
        ]
        names = {lookup_of[item[key]] for item in kept}
        for exposed, route in list(routes.items()):
            if exposed not in names:
                del routes[exposed]
                hidden.append((route.server, route.original, "a plugin's catalog hook"))
                hidden_keys.append((route.server, _compared(kind, route.original)))
        return kept, names

    def _bounds(self, counts: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Where each server's items are in the exposed list (listing order, by server)."""
        bounds: dict[str, tuple[int, int]] = {}
        start = 0
        for name in self.naming:
            end = start + counts.get(name, 0)
            bounds[name] = (start, end)
            start = end
        return bounds

    # --- queries ---------------------------------------------------------------------

    def visible(self, kind: str) -> list[dict[str, Any]]:
        return self.exposed[kind]

    def page(self, kind: str, cursor: object) -> bytes:
        """The serialized result of one `*/list` page; raises on a bad cursor."""
        offset = 0 if cursor is None else self._cursors.decode(cursor, kind, self.listed(kind))
        cached = self._page_cache.get((kind, offset))
        if cached is not None:
            return cached
        items = self.exposed[kind]
        end = offset + self.page_size
        result: dict[str, Any] = {kind: items[offset:end]}
        if end < len(items):
            result["nextCursor"] = self._cursors.encode(kind, self.listed(kind), end)
        page = dumps(result)
        self._page_cache[(kind, offset)] = page
        return page

    def listed(self, kind: str) -> str:
        """What a cursor over ``kind`` is bound to: a digest of the list it pages through.
        Unlike ``generation`` (a count of this process's rebuilds), it is the same on every
        replica that lists the same items, so a cursor one made is read by the others."""
        known = self._listed.get(kind)
        if known is not None and known[0] == self.generation:
            return known[1]
        digest = hashlib.sha256(dumps(self.exposed[kind])).hexdigest()[:16]
        self._listed[kind] = (self.generation, digest)
        return digest

    def uri_visible(self, server: str, uri: str) -> bool:
        """Whether this profile may read (or subscribe to) a server's URI (in normal form)."""
        if self.policy is None:
            return True
        if self._hidden_uris or self._hidden_templates:  # they hold however the server reads it
            every = readings(uri)
            if any((server, each) in self._hidden_uris for each in every):
                return False
            for owner, template in self._hidden_templates:
                if owner == server and any(template_matches(template, each) for each in every):
                    return False
        return self.policy.uri_reason(server, uri) is None

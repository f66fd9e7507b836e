"""The merged catalog: every server's tools, prompts, resources and templates, exposed.

Owns the exposed names and URIs, the maps back to ``(server, original)``, collision
resolution, and the pages served to clients. Pure data in, data out.

Order is deterministic: servers in config order, each server's items in the order the
upstream listed them. Each rebuild bumps ``generation``, which invalidates cursors and the
cache of serialized pages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from aggregator.core.cursor import CursorCodec
from aggregator.core.naming import disambiguate, expose_name, tool_prefix, uri_prefix
from aggregator.core.policy import ProfilePolicy
from aggregator.core.uris import expose_uri, split_uri, template_matches
from aggregator.jsonrpc.codec import dumps

log = logging.getLogger(__name__)

TOOLS = "tools"
PROMPTS = "prompts"
RESOURCES = "resources"
TEMPLATES = "resourceTemplates"
KINDS = (TOOLS, PROMPTS, RESOURCES, TEMPLATES)
LIST_METHODS = {
    "tools/list": TOOLS,
    "prompts/list": PROMPTS,
    "resources/list": RESOURCES,
    "resources/templates/list": TEMPLATES,
}
# The capability that says a server has each kind.
CAPABILITY_OF = {TOOLS: "tools", PROMPTS: "prompts", RESOURCES: "resources", TEMPLATES: "resources"}
# The field of an item that the proxy rewrites, per kind.
KEY_OF = {TOOLS: "name", PROMPTS: "name", RESOURCES: "uri", TEMPLATES: "uriTemplate"}


class Route(NamedTuple):
    server: str
    original: str


class ServerNaming(NamedTuple):
    name: str
    prefix: str
    uri_prefix: str


class Catalog:
    """What one profile sees. Several catalogs may share one ``store`` of upstream items."""

    def __init__(
        self, servers: Iterable[Any], separator: str, page_size: int, *,
        store: dict[str, dict[str, list[dict[str, Any]]]] | None = None,
        policy: ProfilePolicy | None = None, max_name_length: int = 128, charset: str = "mcp",
        plugins: Any = None,
    ) -> None:
        # Plugins' catalog hooks (sync), given what this profile sees of each kind.
        self.plugins = plugins if plugins is not None and plugins._catalog else None
        self.separator = separator
        self.page_size = page_size
        self.policy = policy
        self.max_name_length = max_name_length
        self.charset = charset
        # (server, original, reason) per kind, for `aggregator tools --explain`
        self.hidden: dict[str, list[tuple[str, str, str]]] = {kind: [] for kind in KINDS}
        self._hidden_uris: set[tuple[str, str]] = set()
        self._hidden_templates: list[tuple[str, str]] = []
        self.naming: dict[str, ServerNaming] = {
            s.name: ServerNaming(s.name, tool_prefix(s), uri_prefix(s)) for s in servers
        }
        self.uri_prefixes = {n.uri_prefix.lower(): n.name for n in self.naming.values() if n.uri_prefix}
        self.generation = 0
        # server -> kind -> upstream items, for servers that are ready
        self._items: dict[str, dict[str, list[dict[str, Any]]]] = store if store is not None else {}
        self.exposed: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        self.tools: dict[str, Route] = {}
        self.prompts: dict[str, Route] = {}
        self.resources: dict[str, Route] = {}
        self._templates: list[tuple[str, str, str]] = []  # (server, original, exposed)
        self.collisions: dict[str, list[str]] = {kind: [] for kind in KINDS}
        self._cursors = CursorCodec()
        self._page_cache: dict[tuple[str, int], bytes] = {}

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
        policy = self.policy
        hidden: list[tuple[str, str, str]] = []
        # 1. Candidates, in listing order: (server, original, item as exposed, name, exact).
        candidates: list[tuple[str, str, dict[str, Any], str, bool]] = []
        for name, naming in self.naming.items():
            for item in self._items.get(name, {}).get(kind) or ():
                original = item.get(key) if type(item) is dict else None
                if type(original) is not str or not original:
                    log.warning("server %s: ignoring a %s entry without a %r", name, kind, key)
                    continue
                override = None
                if policy is not None:
                    reason = policy.hidden_reason(name, kind, original, item)
                    if reason is not None:
                        hidden.append((name, original, reason))
                        continue
                    override = policy.override(name, kind, original)
                    if override is not None:
                        item = {**item, **{k: v for k, v in (("title", override.title),
                                                                ("description", override.description)) if v}}
                if named:
                    base = override.name if override is not None and override.name else original
                    exposed = expose_name(naming.prefix, self.separator, base, self.max_name_length, self.charset)
                    exact = exposed == (f"{naming.prefix}{self.separator}{base}" if naming.prefix else base)
                else:
                    exposed, exact = expose_uri(naming.uri_prefix, original), True
                candidates.append((name, original, item, exposed, exact))
        # 2. Names, by priority: names used as they are before names that had to be changed
        #    (sanitised or shortened), each in config order. So a collision never depends
        #    on the order a server lists things in, and a name stays the same across restarts.
        order = sorted(range(len(candidates)), key=lambda i: (not candidates[i][4], i))
        routes: dict[str, Route] = {}
        assigned: dict[int, str] = {}
        collisions: list[str] = []
        for index in order:
            name, original, _item, exposed, _exact = candidates[index]
            if exposed in routes:
                first = routes[exposed]
                if first.server == name and first.original == original:
                    continue  # the same item listed twice by one server
                if named:
                    renamed = disambiguate(exposed, name, original, self.max_name_length)
                    collisions.append(
                        f"{kind[:-1]} name {exposed!r}: {first.server}:{first.original!r} keeps"
                        f" it, {name}:{original!r} is exposed as {renamed!r}"
                    )
                    exposed = renamed
                    if exposed in routes:
                        continue
                else:
                    collisions.append(
                        f"{kind[:-1]} {exposed!r} is listed by {first.server} and {name};"
                        f" {first.server} serves it"
                    )
                    continue
            routes[exposed] = Route(name, original)
            assigned[index] = exposed
        # 3. What clients see, in listing order.
        exposed_items: list[dict[str, Any]] = []
        templates: list[tuple[str, str, str]] = []
        for index, (name, original, item, _, _) in enumerate(candidates):
            exposed = assigned.get(index)
            if exposed is None:
                continue
            exposed_items.append(item if exposed == original else {**item, key: exposed})
            if kind == TEMPLATES:
                templates.append((name, original, exposed))
        if self.plugins is not None:
            # Plugins may drop items or change how they read, never their exposed names.
            profile = self.policy.name if self.policy is not None else "default"
            kept = [item for item in self.plugins.catalog(profile, kind, exposed_items)
                    if type(item) is dict and item.get(key) in routes]
            names = {item[key] for item in kept}
            for exposed, route in list(routes.items()):
                if exposed not in names:
                    del routes[exposed]
                    hidden.append((route.server, route.original, "a plugin's catalog hook"))
            templates = [t for t in templates if t[2] in names]
            exposed_items = kept
        self.hidden[kind] = hidden
        if kind == TOOLS:
            self.tools = routes
        elif kind == PROMPTS:
            self.prompts = routes
        elif kind == RESOURCES:
            self.resources = routes
            self._hidden_uris = {(server, original) for server, original, _ in hidden}
        else:
            self._templates = templates
            self._hidden_templates = [(server, original) for server, original, _ in hidden]
        for message in collisions:
            if message not in self.collisions[kind]:
                log.warning("name collision: %s", message)
        self.collisions[kind] = collisions
        changed = exposed_items != self.exposed[kind]
        self.exposed[kind] = exposed_items
        if changed:
            self.generation += 1
            self._page_cache.clear()
        return changed

    # --- queries ---------------------------------------------------------------------

    def page(self, kind: str, cursor: object) -> bytes:
        """The serialized result of one `*/list` page; raises on a bad cursor."""
        offset = 0 if cursor is None else self._cursors.decode(cursor, kind, self.generation)
        cached = self._page_cache.get((kind, offset))
        if cached is not None:
            return cached
        items = self.exposed[kind]
        end = offset + self.page_size
        result: dict[str, Any] = {kind: items[offset:end]}
        if end < len(items):
            result["nextCursor"] = self._cursors.encode(kind, self.generation, end)
        page = dumps(result)
        self._page_cache[(kind, offset)] = page
        return page

    def route_uri(self, uri: str) -> Route | None:
        """The server that owns an exposed resource URI, and its own URI for it, or None
        if no server does or this profile may not read it."""
        route = self.resources.get(uri)
        if route is not None:
            return route
        route = self._owner(uri)
        if route is None or not self.uri_visible(*route):
            return None
        return route

    def uri_visible(self, server: str, uri: str) -> bool:
        """Whether this profile may read (or subscribe to) a server's URI."""
        if self.policy is None:
            return True
        if (server, uri) in self._hidden_uris:
            return False
        for owner, template in self._hidden_templates:
            if owner == server and template_matches(template, uri):
                return False
        return self.policy.uri_reason(server, uri) is None

    def _owner(self, uri: str) -> Route | None:
        split = split_uri(uri, self.uri_prefixes)
        if split is not None:
            return Route(*split)
        # Servers that keep their URIs: by template, then the only such server.
        unprefixed = [
            n.name for n in self.naming.values()
            if not n.uri_prefix and (RESOURCES in self._items.get(n.name, {})
                                     or TEMPLATES in self._items.get(n.name, {}))
        ]
        for server, original, _exposed in self._templates:
            if server in unprefixed and template_matches(original, uri):
                return Route(server, uri)
        if len(unprefixed) == 1:
            return Route(unprefixed[0], uri)
        return None

    def route_template(self, exposed: str) -> Route | None:
        for server, original, template in self._templates:
            if template == exposed:
                return Route(server, original)
        return self.route_uri(exposed)

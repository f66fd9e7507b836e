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
    def __init__(self, servers: Iterable[Any], separator: str, page_size: int) -> None:
        self.separator = separator
        self.page_size = page_size
        self.naming: dict[str, ServerNaming] = {
            s.name: ServerNaming(s.name, tool_prefix(s), uri_prefix(s)) for s in servers
        }
        self.uri_prefixes = {n.uri_prefix.lower(): n.name for n in self.naming.values() if n.uri_prefix}
        self.generation = 0
        # server -> kind -> upstream items, for servers that are ready
        self._items: dict[str, dict[str, list[dict[str, Any]]]] = {}
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
        return self._rebuild(kind)

    def remove_server(self, server: str) -> list[str]:
        """Forget a server's items; return the kinds whose exposed list changed."""
        kinds = list(self._items.pop(server, {}))
        return [kind for kind in kinds if self._rebuild(kind)]

    def items_of(self, server: str, kind: str) -> list[dict[str, Any]]:
        return self._items.get(server, {}).get(kind, [])

    def _rebuild(self, kind: str) -> bool:
        key = KEY_OF[kind]
        exposed_items: list[dict[str, Any]] = []
        routes: dict[str, Route] = {}
        templates: list[tuple[str, str, str]] = []
        collisions: list[str] = []
        for name, naming in self.naming.items():
            items = self._items.get(name, {}).get(kind)
            if not items:
                continue
            for item in items:
                original = item.get(key) if type(item) is dict else None
                if type(original) is not str or not original:
                    log.warning("server %s: ignoring a %s entry without a %r", name, kind, key)
                    continue
                if kind in (TOOLS, PROMPTS):
                    exposed = expose_name(naming.prefix, self.separator, original)
                else:
                    exposed = expose_uri(naming.uri_prefix, original)
                if exposed in routes:
                    first = routes[exposed]
                    if first.server == name and first.original == original:
                        continue  # the same item listed twice by one server
                    if kind in (TOOLS, PROMPTS):
                        renamed = disambiguate(exposed, name, original)
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
                exposed_items.append(item if exposed == original else {**item, key: exposed})
                if kind == TEMPLATES:
                    templates.append((name, original, exposed))
        if kind == TOOLS:
            self.tools = routes
        elif kind == PROMPTS:
            self.prompts = routes
        elif kind == RESOURCES:
            self.resources = routes
        else:
            self._templates = templates
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
        """The server that owns an exposed resource URI, and its own URI for it."""
        route = self.resources.get(uri)
        if route is not None:
            return route
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

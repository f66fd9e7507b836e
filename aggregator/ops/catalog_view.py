"""A profile's catalog as people read it: each exposed item with the server and the name it
has there, and each hidden item with the rule that hid it. ``aggregator tools`` prints it;
the status snapshot (``status``) shows it.

Imports the core only: it reads a profile's ``Catalog``, never the hub.
"""

from __future__ import annotations

from typing import Any

from aggregator.core.catalogs.catalog import Catalog, Route
from aggregator.mcp.constants import KEY_OF, KINDS


def catalog_view(catalog: Catalog) -> dict[str, Any]:
    """Per kind, the rows a profile's clients see (name, server, original name, title,
    description); under ``hidden``, per kind, what is hidden and by which rule."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        rows = []
        for item in catalog.exposed[kind]:
            exposed = item.get(KEY_OF[kind])
            route = _route_of(catalog, kind, exposed)
            rows.append(
                {
                    "name": exposed,
                    "server": route.server if route else None,
                    "original": route.original if route else None,
                    "title": _text(item.get("title")) or _text(_annotations(item).get("title")),
                    "description": _text(item.get("description")),
                }
            )
        out[kind] = rows
    out["hidden"] = {
        kind: [
            {"server": server, "original": original, "rule": reason}
            for server, original, reason in catalog.hidden[kind]
        ]
        for kind in KINDS
    }
    return out


def _annotations(item: dict[str, Any]) -> dict[str, Any]:
    """A listed item's ``annotations``, or nothing when a server sent something else."""
    annotations = item.get("annotations")
    return annotations if type(annotations) is dict else {}


def _text(value: Any) -> str | None:
    """A string a server sent, or None for anything else (the page shows text only)."""
    return value if type(value) is str else None


def _route_of(catalog: Catalog, kind: str, exposed: str | None) -> Route | None:
    if exposed is None:  # every listed item has its key; nothing routes without one
        return None
    route: Route | None
    if kind == "tools":
        route = catalog.tools.get(exposed)
    elif kind == "prompts":
        route = catalog.prompts.get(exposed)
    elif kind == "resources":
        route = catalog.route_uri(exposed)
    else:
        route = catalog.route_template(exposed)
    return route

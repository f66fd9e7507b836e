"""The status page's view of a catalog (``ops.catalog_view``) takes a server's listing as it
comes: an ``annotations`` that is not an object, or a title or description that is not text,
shows as nothing rather than failing ``/status``, ``/status.json`` and ``aggregator status``."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.ops.catalog_view import catalog_view


@pytest.mark.parametrize(
    "item, title, description",
    [
        ({"name": "t", "annotations": [1, 2], "description": 12, "inputSchema": "no"}, None, None),
        ({"name": "t", "annotations": "x", "title": 3}, None, None),
        ({"name": "t", "annotations": {"title": ["no"]}}, None, None),
        ({"name": "t", "annotations": {"title": "Shown"}, "description": "d"}, "Shown", "d"),
        ({"name": "t", "title": "Own", "annotations": {"title": "Other"}}, "Own", None),
    ],
)
def test_what_a_server_listed_shows_as_text_or_nothing(
    item: dict[str, Any], title: str | None, description: str | None
) -> None:
    catalog = Catalog([ServerConfig(name="a", command="x")], "__", 50)
    catalog.set_items("a", "tools", [item])
    (row,) = catalog_view(catalog)["tools"]
    assert (row["name"], row["server"], row["title"], row["description"]) == ("a__t", "a", title, description)

"""example: a small plugin to copy. It shows each hook once.

    [[plugins]]
    use = "example"                      # or "my_plugins.py:MyPlugin" for your own file
    options = { blocked_words = ["rm -rf"] }

- ``request``: refuses a tool call whose arguments contain a blocked word.
- ``catalog``: tells the model which server each tool comes from.
- ``server_request``: never lets a server ask for sampling.
"""

from __future__ import annotations

import json
from typing import Any

from aggregator.plugins import Deny, Request, ServerRequest


class ExamplePlugin:
    name = "example"

    def __init__(self, blocked_words: list[str] | None = None) -> None:
        self.blocked_words = [word.lower() for word in blocked_words or []]

    def request(self, request: Request) -> None:
        if request.method != "tools/call":
            return
        text = json.dumps(request.params.get("arguments") or {}, default=str).lower()
        for word in self.blocked_words:
            if word in text:
                raise Deny(f"{request.exposed}: the arguments contain {word!r}, which is not allowed here")

    def catalog(self, profile: str, kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        if kind != "tools":
            return None
        out = []
        for item in items:
            server = item["name"].split("__", 1)[0] if "__" in item["name"] else "an upstream server"
            description = item.get("description") or ""
            out.append({**item, "description": f"[from {server}] {description}".strip()})
        return out

    def server_request(self, request: ServerRequest) -> bool | None:
        return request.method != "sampling/createMessage"

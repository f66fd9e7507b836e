"""example: a small plugin to copy. It shows each hook once.

    [[plugins]]
    use = "example"                      # or "my_plugins.py:MyPlugin" for your own file
    options = { blocked_words = ["rm -rf"] }

- ``load`` / ``done``: say when it starts and stops (open and close what you need there).
- ``request``: refuses a tool call whose arguments contain a blocked word.
- ``catalog``: tells the model which tools only read (their ``readOnlyHint``). It reads
  what a tool says about itself, never its name: exposed names are not parsed (prefixes,
  separators and renames are the config's business).
- ``server_request``: never lets a server ask for sampling.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aggregator.plugins import Deny, Request, ServerRequest

log = logging.getLogger(__name__)


class ExamplePlugin:
    name = "example"

    def __init__(self, blocked_words: list[str] | None = None) -> None:
        self.blocked_words = [word.lower() for word in blocked_words or []]

    def load(self) -> None:
        log.info("example plugin: blocking %d word(s)", len(self.blocked_words))

    def done(self) -> None:
        log.info("example plugin: done")

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
            annotations = item.get("annotations")
            if type(annotations) is dict and annotations.get("readOnlyHint") is True:
                item = {**item, "description": f"[read-only] {item.get('description') or ''}".strip()}
            out.append(item)
        return out

    def server_request(self, request: ServerRequest) -> bool | None:
        return request.method != "sampling/createMessage"

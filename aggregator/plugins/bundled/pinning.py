"""pin-definitions: a tool whose definition changes after approval is quarantined.

    [[plugins]]
    use = "pin-definitions"
    options = { path = "aggregator-pins.json" }

The first time a tool is seen, the hash of its name, description, input and output
schemas and annotations is pinned (trust on first use), in ``path``. From then on a tool
whose definition differs from its pin (a "rug pull": new instructions slipped into a
description, a schema that now asks for more) disappears from every client's list, so
calls to it are refused like calls to a tool that does not exist; the change is logged
as a diff. ``aggregator approve [NAME ...]`` accepts the current definitions (all that
changed, or the named ones) after a person has looked at them.

The catalog hook runs inside the routing core, so it only records that there are new
pins; the file is written by ``after_catalog`` (which the proxy runs outside the core,
right after) and, for anything left, by ``done``. Each write replaces the file whole.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from aggregator.plugins import InvalidOptions

log = logging.getLogger(__name__)
PINNED_FIELDS = ("name", "description", "inputSchema", "outputSchema", "annotations")


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    return {field: tool[field] for field in PINNED_FIELDS if field in tool}


def digest(tool: dict[str, Any]) -> str:
    canonical = json.dumps(
        definition(tool), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )  # a JsonNumber (a literal kept exactly) as its text
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class PinDefinitions:
    name = "pin-definitions"

    def __init__(self, path: str = "aggregator-pins.json") -> None:
        if not isinstance(path, str) or not path.strip() or "\0" in path:
            raise InvalidOptions({"path": f"must be the name of a file (a non-empty string), got {path!r}"})
        self.path = Path(path)
        # Each save writes a file beside it and renames it: refuse now what would fail then.
        directory = self.path.parent
        if not directory.is_dir():
            raise InvalidOptions({"path": f"the directory {directory} does not exist"})
        try:
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as exc:
            raise InvalidOptions(
                {"path": f"cannot write in {directory} (the pins are saved there): {exc.strerror or exc}"}
            ) from None
        self.pins: dict[str, dict[str, Any]] = self._read()
        # Tools quarantined now: exposed name -> the definition waiting for approval.
        self.changed: dict[str, dict[str, Any]] = {}
        self.unsaved = False  # pins made by the catalog hook, not yet on disk

    def _read(self) -> dict[str, dict[str, Any]]:
        """The pins saved before, if any; InvalidOptions if the file cannot be used."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidOptions(
                {"path": f"cannot read {self.path}: {getattr(exc, 'strerror', None) or exc}"}
            ) from None
        try:
            pins = json.loads(text)
        except ValueError as exc:
            raise InvalidOptions({"path": f"{self.path} is not valid JSON: {exc}"}) from None
        if not isinstance(pins, dict) or not all(
            isinstance(pin, dict) and isinstance(pin.get("sha256"), str) and isinstance(pin.get("definition"), dict)
            for pin in pins.values()
        ):
            raise InvalidOptions({"path": f"{self.path} is not a pins file (an object of tool pins)"})
        return pins

    def catalog(self, profile: str, kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        if kind != "tools":
            return None
        kept, pinned_new = [], False
        for tool in items:
            name = tool["name"]
            pin = self.pins.get(name)
            current = digest(tool)
            if pin is None:
                self.pins[name] = {"sha256": current, "definition": definition(tool)}
                pinned_new = True
                kept.append(tool)
            elif pin["sha256"] == current:
                kept.append(tool)
                self.changed.pop(name, None)
            else:
                if name not in self.changed:
                    log.warning(
                        "tool %s changed since it was approved; quarantined until `aggregator approve %s`:\n%s",
                        name,
                        name,
                        self._diff(pin["definition"], definition(tool)),
                    )
                self.changed[name] = definition(tool)
        if pinned_new:
            self.unsaved = True  # written by after_catalog: no I/O inside the core
        return kept

    def after_catalog(self) -> None:
        if self.unsaved:
            self.save()

    def done(self) -> None:
        if self.unsaved:
            self.save()

    def approve(self, names: list[str] | None = None) -> list[str]:
        """Accept the current definitions of changed tools (all, or those named)."""
        chosen = [n for n in self.changed if not names or n in names]
        for name in chosen:
            tool = self.changed.pop(name)
            self.pins[name] = {"sha256": digest(tool), "definition": tool}
        if chosen:
            self.save()
        return chosen

    def save(self) -> None:
        """Write every pin (the file is replaced whole)."""
        self.unsaved = False
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(
            json.dumps(self.pins, indent=2, sort_keys=True, ensure_ascii=False, default=str), encoding="utf-8"
        )
        os.replace(temporary, self.path)

    @staticmethod
    def _diff(before: dict[str, Any], after: dict[str, Any]) -> str:
        lines = difflib.unified_diff(
            json.dumps(before, indent=2, sort_keys=True, default=str).splitlines(),
            json.dumps(after, indent=2, sort_keys=True, default=str).splitlines(),
            "approved",
            "now",
            lineterm="",
        )
        return "\n".join(lines)

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

Replicas (``[cluster] store``): the pins live in the store instead, one hash (``pins``, a
field per tool, each value signed with the ``[cluster] keys``, kept with no expiry: a pin
forgotten would let a changed tool be pinned anew as if first seen), and the store wins
over the file. A first sight is written only if no replica pinned that tool before
(``HSETNX``: of two replicas, the first wins, and the other takes its pin); an approval
replaces the pin and is published on the ``pins`` channel, so every running replica reads
the pins again at once and serves the approved definition. Each replica reads every pin
when its ``shared`` hook starts, when the store is back after an outage, and on each
approval; the file is read at start and imported once, when the store has no pins yet
(and then no longer written). A pin whose signature does not verify is not trusted: its
tool is quarantined until approved. While the store is down, a replica goes on with the
pins it has, and writes its first sights once the store is back.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, TypeGuard

import trio

from aggregator.errors import StoreError
from aggregator.plugins import InvalidOptions

log = logging.getLogger(__name__)
PINNED_FIELDS = ("name", "description", "inputSchema", "outputSchema", "annotations")
PINS = "pins"  # the store's hash of pins (a field per tool), and the channel approvals are told on
LOOK_EVERY = 1.0  # seconds between looks at whether the store is back (then every pin is read again)
UNTRUSTED = {"sha256": "", "definition": {}}  # a pin in the store whose signature does not verify


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    return {field: tool[field] for field in PINNED_FIELDS if field in tool}


def digest(tool: dict[str, Any]) -> str:
    canonical = json.dumps(
        definition(tool), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )  # a JsonNumber (a literal kept exactly) as its text
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _is_pin(pin: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(pin, dict) and isinstance(pin.get("sha256"), str) and isinstance(pin.get("definition"), dict)


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
        self.from_file = dict(self.pins)  # imported into a store that has no pins yet
        # Tools quarantined now: exposed name -> the definition waiting for approval.
        self.changed: dict[str, dict[str, Any]] = {}
        self.unsaved = False  # pins made by the catalog hook, not yet on disk
        # With [cluster] store: the store (while the shared hook runs), first sights not yet
        # in it, approvals not yet in it, whether every pin was read from it at least once.
        self.sharing = False  # the shared hook ran: the pins are the store's
        self.store: Any = None
        self.unshared: set[str] = set()
        self.approved: dict[str, dict[str, Any]] = {}
        self.synced = trio.Event()
        self.stale = True  # every pin to be read again from the store
        self.heard = False  # of an approval: the catalogs are built again after the reading
        self.wake = trio.Event()  # set when the shared hook has something to do
        self.down = False

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
        if not isinstance(pins, dict) or not all(_is_pin(pin) for pin in pins.values()):
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
                self.unshared.add(name)
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
        if self.sharing:
            self.wake.set()  # the shared hook writes the first sights to the store
        elif self.unsaved:
            self.save()

    def done(self) -> None:
        if self.unsaved and not self.sharing:
            self.save()

    def approve(self, names: list[str] | None = None) -> list[str]:
        """Accept the current definitions of changed tools (all, or those named). With a
        store, ``share_approvals`` writes them there."""
        chosen = [n for n in self.changed if not names or n in names]
        for name in chosen:
            tool = self.changed.pop(name)
            self.pins[name] = {"sha256": digest(tool), "definition": tool}
            self.approved[name] = self.pins[name]
        if chosen and not self.sharing:
            self.save()
        return chosen

    # --- with [cluster] store ------------------------------------------------------------

    async def shared(self, store: Any) -> None:
        """Keep the pins in the replicas' store: read them all at start, when the store is
        back after an outage and on each approval (told on the ``pins`` channel); write
        this replica's first sights."""
        self.sharing = True  # from now on the pins are the store's, the file is not written
        approvals = await store.subscribe(PINS)
        self.store, self.stale = store, True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hear_approvals, approvals)
                while True:
                    self.wake = trio.Event()
                    if not store.status().up:
                        self.stale = True  # read again once it is back: approvals may have been missed
                    elif self.stale:
                        self.stale = not await self._sync(store)
                    elif self.unshared:
                        await self._share_first_sights(store)
                    with trio.move_on_after(LOOK_EVERY):
                        await self.wake.wait()
        finally:
            self.store = None
            store.unsubscribe(PINS)

    async def _hear_approvals(self, approvals: trio.MemoryReceiveChannel[bytes]) -> None:
        async for _ in approvals:
            self.stale = self.heard = True
            self.wake.set()

    async def share_approvals(self) -> None:
        """Write the approvals to the store (each replaces its tool's pin) and tell every
        replica; StoreError if the store cannot be used."""
        store, approved = self.store, self.approved
        if store is None or not approved:
            return
        values = {name: self._sign(store, name, pin) for name, pin in approved.items()}
        await store.hset(PINS, values, ttl=None)
        self.approved = {}
        await store.publish(PINS, json.dumps(sorted(values)).encode())

    async def _sync(self, store: Any) -> bool:
        """Read every pin from the store (importing the file's into a store that has none,
        and writing this replica's first sights that are not there), take them as the
        pins, and have the catalogs built again if that changed any. Whether it could."""
        try:
            found = await store.hgetall(PINS)
            if not found and self.from_file:
                for name, pin in self.from_file.items():
                    await store.hset_new(PINS, name, self._sign(store, name, pin), ttl=None)
                log.info("pin-definitions: %d pins of %s imported into the store", len(self.from_file), self.path)
                found = await store.hgetall(PINS)
            for name in sorted(self.unshared - set(found)):
                await store.hset_new(PINS, name, self._sign(store, name, self.pins[name]), ttl=None)
            if self.unshared - set(found):
                found = await store.hgetall(PINS)
        except StoreError as exc:
            self._outage(exc)
            return False
        self._back()
        self.unshared -= set(found)
        before = self.pins
        # The store's pins win; first sights not in it yet (its writes failed) are kept.
        self.pins = {name: self._trusted(store, name, value) for name, value in found.items()}
        self.pins.update({name: before[name] for name in self.unshared if name in before})
        self.synced.set()
        if self.pins != before or self.heard:  # (an approval made here changed the pins already)
            self.heard = False
            store.catalogs_changed()  # the catalog hooks run again with these pins
        return True

    async def _share_first_sights(self, store: Any) -> None:
        """Write this replica's first sights to the store; a tool another replica pinned
        first takes that pin (its catalogs built again if it differs)."""
        taken = False
        for name in sorted(self.unshared):
            pin = self.pins[name]
            try:
                if not await store.hset_new(PINS, name, self._sign(store, name, pin), ttl=None):
                    value = await store.hget(PINS, name)
                    if value is not None:
                        theirs = self._trusted(store, name, value)
                        taken = taken or theirs != pin
                        self.pins[name] = theirs
            except StoreError as exc:
                self._outage(exc)
                return  # written once the store is back (``_sync``)
            self.unshared.discard(name)
        self._back()
        if taken:
            store.catalogs_changed()

    @staticmethod
    def _sign(store: Any, name: str, pin: dict[str, Any]) -> bytes:
        text = json.dumps(pin, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        signed: bytes = store.sign(f"{PINS}:{name}", text.encode("utf-8"))
        return signed

    @staticmethod
    def _trusted(store: Any, name: str, value: bytes) -> dict[str, Any]:
        """A pin read from the store, or ``UNTRUSTED`` (its tool quarantined) if its
        signature does not verify or it is not a pin."""
        opened = store.verify(f"{PINS}:{name}", value)
        try:
            pin = None if opened is None else json.loads(opened)
        except ValueError:
            pin = None
        if not _is_pin(pin):
            log.warning("pin-definitions: the store's pin of %s cannot be trusted; quarantined until approved", name)
            return dict(UNTRUSTED)
        return pin

    def _outage(self, exc: Exception) -> None:
        if not self.down:
            self.down = True
            log.warning("pin-definitions: the shared store cannot be used now (%s); going on with the pins held", exc)

    def _back(self) -> None:
        if self.down:
            self.down = False
            log.info("pin-definitions: the shared store is back")

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

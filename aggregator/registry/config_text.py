"""A server table added to a config file's text, every other byte of it kept: the table is
appended at the end (after one blank line, in the file's own line endings); ``replace``
first takes out the ``[servers.KEY]`` table and its sub-tables (and the comments this
module's tables start with), leaving the comments that belong to the next table, and
checks that the file then reads as before without ``servers.KEY`` (else nothing is written).

A key that is written another way (an inline table, dotted keys under ``[servers]``) is
not rewritten: the user is told to edit it by hand.

Pure: text in, text out; imports ``identifiers`` and ``tables`` beside it.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from aggregator.registry.identifiers import RegistryError
from aggregator.registry.tables import MARK

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def existing_servers(text: str, source: str) -> dict[str, Any]:
    """The ``[servers]`` of ``text`` as TOML reads them; RegistryError when it is not TOML."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{source} is not valid TOML ({exc}); nothing was written") from None
    servers = raw.get("servers", {})
    return servers if isinstance(servers, dict) else {}


def with_table(text: str, key: str, table: str, *, replace: bool, source: str) -> str:
    """``text`` with ``table`` (for ``[servers.KEY]``) added at its end; RegistryError when
    the key is there and ``replace`` is false, or when it cannot be taken out."""
    if key in existing_servers(text, source):
        if not replace:
            raise RegistryError(
                f"{source} already has servers.{key}; choose another key (--as NAME) or replace it (--replace)"
            )
        before = tomllib.loads(text)
        text = _without(text, key, source)
        try:
            after: dict[str, Any] | None = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            after = None
        if after is not None and key in after.get("servers", {}):
            raise RegistryError(
                f"servers.{key} in {source} is not written as a [servers.{key}] table of its own; edit it by hand"
            )
        del before["servers"][key]
        if after != before:  # anything but servers.KEY touched: refuse, write nothing
            raise RegistryError(
                f"servers.{key} in {source} cannot be taken out without changing other settings; edit it by hand"
            )
    newline = "\r\n" if "\r\n" in text else "\n"
    lead = ""
    if text and not text.endswith("\n"):
        lead = newline
    if text and not (text + lead).endswith(("\n\n", "\r\n\r\n")):
        lead += newline
    return text + lead + table.replace("\n", newline)


def _without(text: str, key: str, source: str) -> str:
    """``text`` without the header lines of ``[servers.KEY]`` and its sub-tables, and the
    lines up to the next other table (its own comments, just above it, stay)."""
    lines = text.splitlines(keepends=True)
    keep = [True] * len(lines)
    found = False
    index = 0
    while index < len(lines):
        if not _is_ours(lines[index], key):
            index += 1
            continue
        found = True
        start = index
        while start > 0 and lines[start - 1].lstrip().startswith("#"):  # our own comment block above
            start -= 1
        if not lines[start].lstrip().startswith(MARK.strip()):
            start = index
        end = index + 1
        while end < len(lines) and not (_header(lines[end]) is not None and not _is_ours(lines[end], key)):
            end += 1
        if end < len(lines):  # the next table's comments, just above it, are its own
            while end - 1 > index and lines[end - 1].lstrip().startswith("#"):
                end -= 1
        for position in range(start, end):
            keep[position] = False
        index = end
    if not found:
        raise RegistryError(
            f"servers.{key} in {source} is not written as a [servers.{key}] table of its own; edit it by hand"
        )
    return "".join(line for line, kept in zip(lines, keep, strict=True) if kept)


def _header(line: str) -> list[str] | None:
    """The dotted path of a table header line (``[servers."a.b".tools]`` -> servers, a.b,
    tools); None if the line is not one. Quoted keys may hold ``#``, ``]`` or dots: the
    header is read key by key, the way TOML reads it."""
    text = line.rstrip("\r\n")
    start = len(text) - len(text.lstrip(" \t"))
    if not text.startswith("[", start):
        return None
    double = text.startswith("[[", start)
    position = start + (2 if double else 1)
    first = position
    while True:
        position = _skip_blank(text, position)
        end = _key_end(text, position)
        if end is None:
            return None
        position = _skip_blank(text, end)
        if text.startswith(".", position):
            position += 1
            continue
        break
    closing = "]]" if double else "]"
    if not text.startswith(closing, position):
        return None
    rest = text[position + len(closing) :].strip(" \t")
    if rest and not rest.startswith("#"):
        return None
    try:
        # The header's keys as TOML reads them: parse a one-key document with that path.
        parsed = tomllib.loads(f"[{text[first:position]}]\n")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    node: Any = parsed
    while isinstance(node, dict) and len(node) == 1:
        name = next(iter(node))
        path.append(name)
        node = node[name]
    return path


def _skip_blank(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t":
        position += 1
    return position


def _key_end(text: str, position: int) -> int | None:
    """Where the key starting at ``position`` ends: a bare key, a "basic" one (with its
    escapes) or a 'literal' one; None when there is no key there."""
    if text.startswith('"', position):
        position += 1
        while position < len(text):
            if text[position] == "\\":
                position += 2
            elif text[position] == '"':
                return position + 1
            else:
                position += 1
        return None
    if text.startswith("'", position):
        end = text.find("'", position + 1)
        return None if end < 0 else end + 1
    match = _BARE_KEY.match(text, position)
    return match.end() if match else None


def _is_ours(line: str, key: str) -> bool:
    path = _header(line)
    return path is not None and len(path) >= 2 and path[0] == "servers" and path[1] == key

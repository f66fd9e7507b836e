"""A server table added to a config file's text, every other byte of it kept: the table is
appended at the end (after one blank line, in the file's own line endings); ``replace``
first takes out the ``[servers.KEY]`` table and its sub-tables and the comments ``add``
wrote with it (its provenance lines above it, its descriptions in it), leaving every other
comment where it was, and checks that the file then reads as before without
``servers.KEY`` (else nothing is written).

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
# The comments ``add`` writes inside a table (``tables``): a variable or header described,
# an optional one left out as a commented line.
_OURS = re.compile(
    r"# (env\.[A-Za-z_][A-Za-z0-9_]* = |headers\.\S+ = |header \S+ \(|to pass the optional |"
    r"[A-Za-z_][A-Za-z0-9_]* \((secret, required|secret|required|optional)\): )"
)


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
        # Anything but servers.KEY touched: refuse, write nothing.
        if _without_empty_servers(after) != _without_empty_servers(before):
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


def dropped_settings(text: str, key: str, table: str) -> list[str]:
    """The settings of ``servers.KEY`` in ``text`` that a replacement by ``table`` leaves
    out, as dotted paths under the table (``request_timeout``, ``tools.deny``), policy
    rules (``tools``, ``prompts``, ``resources``) first; empty when the key is not there or
    the text is not TOML (``with_table`` says so)."""
    try:
        old = tomllib.loads(text).get("servers", {}).get(key)
        new = tomllib.loads(table).get("servers", {}).get(key, {})
    except (tomllib.TOMLDecodeError, AttributeError):
        return []
    if not isinstance(old, dict):
        return []
    dropped = [path for path in _leaves(old) if not _has(new, path)]
    policy = [path for path in dropped if path.split(".", 1)[0] in _POLICY]
    return policy + [path for path in dropped if path not in policy]


_POLICY = ("tools", "prompts", "resources")


def _leaves(table: dict[str, Any], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for name, value in table.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            paths.extend(_leaves(value, path + "."))
        else:
            paths.append(path)
    return paths


def _has(table: dict[str, Any], path: str) -> bool:
    node: Any = table
    for name in path.split("."):
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
    return True


def _without_empty_servers(document: dict[str, Any] | None) -> dict[str, Any] | None:
    """``document`` with an empty ``servers`` left out: taking out a file's only server
    leaves no ``servers`` at all when nothing else wrote the ``[servers]`` header."""
    if document is None or document.get("servers") != {}:
        return document
    return {name: value for name, value in document.items() if name != "servers"}


def _without(text: str, key: str, source: str) -> str:
    """``text`` without the lines ``add`` wrote for ``[servers.KEY]`` (``_OURS``: its
    provenance comments just above the header, the header, and the comments it writes in
    the table), the table's settings and its sub-tables; every other comment stays, byte
    for byte, where it was: the user's own above, inside and after the table, and the
    next table's just above it."""
    lines = text.splitlines(keepends=True)
    keep = [True] * len(lines)
    found = False
    index = 0
    while index < len(lines):
        if not _is_ours(lines[index], key):
            index += 1
            continue
        found = True
        for position in _provenance(lines, index):
            keep[position] = False
        end = index + 1
        while end < len(lines) and not (_header(lines[end]) is not None and not _is_ours(lines[end], key)):
            end += 1
        if end < len(lines):  # the next table's comments, just above it, are its own
            while end - 1 > index and lines[end - 1].lstrip().startswith("#"):
                end -= 1
        kept_comment = False  # the line before is a comment of the user's, kept
        for position in range(index, end):
            line = lines[position].lstrip()
            blank = not line.strip()
            if line.startswith("#") and not _OURS.match(line):
                kept_comment = True
                continue
            if not (blank and kept_comment):  # (a blank line after the user's comment stays)
                keep[position] = False
            kept_comment = False
        index = end
    if not found:
        raise RegistryError(
            f"servers.{key} in {source} is not written as a [servers.{key}] table of its own; edit it by hand"
        )
    return "".join(line for line, kept in zip(lines, keep, strict=True) if kept)


def _provenance(lines: list[str], header: int) -> range:
    """The comment lines ``add`` wrote just above the header at ``header``: the nearest
    line starting with ``MARK`` in the comment block above it, the description below it,
    then its ``# set VAR: ...`` lines; empty when the block has no such line."""
    start = header
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    marks = [n for n in range(start, header) if lines[n].lstrip().startswith(MARK.strip())]
    if not marks:
        return range(0)
    mark = marks[-1]
    end = min(mark + 2, header)  # the mark, and the description line after it
    while end < header and lines[end].lstrip().startswith("# set "):
        end += 1
    return range(mark, end)


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

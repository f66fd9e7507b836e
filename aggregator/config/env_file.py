"""Environment files (a server's ``env_file``, Cursor's and VS Code's ``envFile``): one
``KEY=VALUE`` a line, read when the config is loaded.

Blank lines and lines starting with ``#`` are skipped; ``export`` before a key is allowed.
A value may be quoted: within double quotes ``\\n``, ``\\"`` and ``\\\\`` are escapes;
within single quotes nothing is. An unquoted value ends at `` #`` (a comment) and has its
surrounding whitespace removed. Nothing is expanded: ``$`` is a ``$``.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def parse_env_file(text: str) -> tuple[dict[str, str], list[str]]:
    """The variables a file sets, and its problems as "line N: ..." (values never shown)."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        key, sep, rest = stripped.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            problems.append(f"line {number}: expected KEY=VALUE (a key of letters, digits and _)")
            continue
        value, after = _value(rest.strip())
        if value is None:
            problems.append(f"line {number}: {key}: a quoted value without its closing quote")
        elif after.strip() and not after.strip().startswith("#"):
            problems.append(f"line {number}: {key}: text after the closing quote")
        else:
            values[key] = value
    return values, problems


def _value(raw: str) -> tuple[str | None, str]:
    """One value as written after ``=``, and what follows its closing quote; None when a
    quote is not closed on its line."""
    if raw[:1] == "'":
        end = raw.find("'", 1)
        return (None, "") if end == -1 else (raw[1:end], raw[end + 1 :])
    if raw[:1] == '"':
        out: list[str] = []
        index = 1
        while index < len(raw):
            char = raw[index]
            if char == '"':
                return "".join(out), raw[index + 1 :]
            if char == "\\" and index + 1 < len(raw):
                following = raw[index + 1]
                out.append(_ESCAPES.get(following, "\\" + following))
                index += 2
                continue
            out.append(char)
            index += 1
        return None, ""
    comment = re.search(r"\s#", raw)
    return (raw[: comment.start()] if comment else raw).strip(), ""

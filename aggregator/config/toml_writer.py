"""Writing the raw config form as TOML (``aggregator import``): the small subset a server
list needs, since tomllib only reads."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any


def raw_to_toml(raw: Mapping[str, Any], comments: Mapping[str, str] | None = None) -> str:
    """Write the raw config form as TOML (strings, numbers, booleans, lists, tables);
    ``comments`` puts a comment line above a server's table."""
    lines: list[str] = []
    for name, table in raw.get("servers", {}).items():
        if comments and name in comments:
            lines.append("# " + " ".join(comments[name].splitlines()))
        lines.append(f"[servers.{_toml_key(name)}]")
        nested = []
        for key, value in table.items():
            if isinstance(value, dict):
                nested.append((key, value))
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        for key, value in nested:
            inline = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inline} }}")
        lines.append("")
    return "\n".join(lines)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")

"""The server lists of MCP clients' JSON files: ``mcpServers`` (Claude Desktop, Cursor,
Windsurf) and VS Code's ``servers``, translated into the raw form of aggregator.toml."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aggregator.config.structuring import describe
from aggregator.errors import ConfigError

_JSON_TYPES = {
    "stdio": "stdio",
    "http": "streamable-http",
    "streamable-http": "streamable-http",
    "streamableHttp": "streamable-http",
    "sse": "sse",
    "ws": "websocket",
    "websocket": "websocket",
}
_JSON_KEYS = {"command", "args", "env", "cwd", "url", "headers"}
# Client-specific keys that carry no meaning for a proxy; accepted and ignored.
_JSON_IGNORED = {
    "alwaysAllow",
    "autoApprove",
    "timeout",
    "description",
    "envFile",
    "dev",
    "gallery",
    "version",
    "name",
    "icon",
    "trust",
    "includeTools",
    "excludeTools",
}


def mcp_servers_json_to_raw(data: bytes, *, source: str = "<json>") -> dict[str, Any]:
    """Translate a client's JSON server list into the raw form of aggregator.toml."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"not valid JSON: {exc}", source=source) from None
    if not isinstance(document, dict):
        raise ConfigError("expected a JSON object with `mcpServers` or `servers`", source=source)
    key = "mcpServers" if "mcpServers" in document else "servers" if "servers" in document else None
    if key is None:
        raise ConfigError("expected a JSON object with `mcpServers` or `servers`", source=source)
    entries = document[key]
    if not isinstance(entries, dict):
        raise ConfigError(f"{key}: expected an object of servers", source=source)
    problems: list[str] = []
    servers: dict[str, Any] = {}
    for name, entry in entries.items():
        path = f"{key}.{name}"
        if not isinstance(entry, dict):
            problems.append(f"{path}: expected an object")
            continue
        table: dict[str, Any] = {k: entry[k] for k in _JSON_KEYS if k in entry}
        problems.extend(_json_shape_problems(table, path))
        kind = entry.get("type", entry.get("transport"))
        if kind is not None:
            if kind not in _JSON_TYPES:
                problems.append(f"{path}.type: unknown transport {kind!r}")
            else:
                table["transport"] = _JSON_TYPES[kind]
        if entry.get("disabled") is True:
            table["enabled"] = False
        for extra in sorted(set(entry) - _JSON_KEYS - _JSON_IGNORED - {"type", "transport", "disabled"}):
            problems.append(f"{path}.{extra}: unknown key")
        servers[name] = table
    if problems:
        raise ConfigError(problems, source=source)
    return {"servers": servers}


def _json_shape_problems(table: Mapping[str, Any], path: str) -> list[str]:
    """Values of the wrong type in one JSON server entry, by their path in the JSON file
    (a number in `args` is refused rather than turned into a string: a client would not
    run it either)."""
    problems = []
    for key in ("command", "cwd", "url"):
        if key in table and not isinstance(table[key], str):
            problems.append(f"{path}.{key}: expected a string, got {describe(table[key])}")
    args = table.get("args", [])
    if not isinstance(args, list):
        problems.append(f"{path}.args: expected a list of strings, got {describe(args)}")
    else:
        problems.extend(
            f"{path}.args[{index}]: expected a string, got {describe(item)}"
            for index, item in enumerate(args)
            if not isinstance(item, str)
        )
    for key in ("env", "headers"):
        value = table.get(key, {})
        if not isinstance(value, dict):
            problems.append(f"{path}.{key}: expected an object of strings, got {describe(value)}")
        else:
            problems.extend(
                f"{path}.{key}.{name}: expected a string, got {describe(item)}"
                for name, item in value.items()
                if not isinstance(item, str)
            )
    return problems

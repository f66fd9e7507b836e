"""The server lists of MCP clients' JSON files: ``mcpServers`` (Claude Desktop, Cursor,
Windsurf) and VS Code's ``servers``, translated into the raw form of aggregator.toml."""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aggregator.config.structuring import describe, describe_secret, unknown_key
from aggregator.core.catalogs.naming import NAME_CHARS, URI_PREFIX
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
_JSON_KEYS = {"command", "args", "env", "cwd", "url", "headers", "envFile"}
# Client-specific keys that carry no meaning for a proxy; accepted and ignored.
_JSON_IGNORED = {
    "alwaysAllow",
    "autoApprove",
    "timeout",
    "description",
    "dev",
    "gallery",
    "version",
    "name",
    "icon",
    "trust",
}
# Which tools a client uses of a server (Gemini CLI, Cursor-style files): exact tool names,
# kept as the server's tool allow and deny lists.
_TOOL_FILTERS = {"includeTools": "allow", "excludeTools": "deny"}


def mcp_servers_json_to_raw(
    data: bytes | str, *, source: str = "<json>", directory: Path | None = None, renamed: dict[str, str] | None = None
) -> dict[str, Any]:
    """Translate a client's JSON server list into the raw form of aggregator.toml.

    A server name that is not a legal server key ("Brave Search") gets one derived from it
    (``brave_search``); ``renamed`` receives each derived key with its original name.
    ``directory`` is the JSON file's: ``envFile`` and ``cwd`` are made absolute against it,
    and ``${workspaceFolder}`` is its workspace (the parent of a ``.vscode`` or ``.cursor``
    directory, or the directory itself)."""
    entries, key = _server_entries(data, source)
    problems: list[str] = list(_unencodable(entries, key))
    if problems:  # such a string can be neither written to TOML nor given to a process
        raise ConfigError(problems, source=source)
    servers: dict[str, Any] = {}
    keys = _server_keys(list(entries))
    for name, entry in entries.items():
        path = f"{key}.{name}"
        if not isinstance(entry, dict):
            problems.append(f"{path}: expected an object")
            continue
        table: dict[str, Any] = {_TOML_NAME[k] if k in _TOML_NAME else k: entry[k] for k in entry if k in _JSON_KEYS}
        problems.extend(_json_shape_problems(table, path))
        kind = entry.get("type", entry.get("transport"))
        if kind is not None:
            if kind not in _JSON_TYPES:
                problems.append(f"{path}.type: unknown transport {kind!r}")
            else:
                table["transport"] = _JSON_TYPES[kind]
        if entry.get("disabled") is True:
            table["enabled"] = False
        known = _JSON_KEYS | _JSON_IGNORED | set(_TOOL_FILTERS) | {"type", "transport", "disabled"}
        for extra in sorted(set(entry) - known):
            problems.append(unknown_key(path, extra, known))
        servers[keys[name]] = table = _placed(table, directory) if directory is not None else table
        tools = _tool_rules(entry, path, problems)  # names, placed as they are
        if tools:
            table["tools"] = tools
        if renamed is not None and keys[name] != name:
            renamed[keys[name]] = name
    if problems:
        raise ConfigError(problems, source=source)
    return {"servers": servers}


def _unencodable(value: Any, path: str) -> Iterator[str]:
    """Where ``value`` holds a string with a lone surrogate (JSON's ``"\\ud800"``): no
    character, so it cannot be encoded as UTF-8 for a file, an argument or the environment."""
    if isinstance(value, str):
        if not _encodes(value):
            yield f"{path}: holds a lone surrogate (a \\uD800-\\uDFFF escape alone), which is no character"
    elif isinstance(value, dict):
        for name, item in value.items():
            shown = name if _encodes(name) else name.encode("utf-8", "backslashreplace").decode()
            yield from _unencodable(item, f"{path}.{shown}")
            if not _encodes(name):
                yield f"{path}.{shown}: the key holds a lone surrogate, which is no character"
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unencodable(item, f"{path}[{index}]")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# JSON keys whose aggregator.toml name differs.
_TOML_NAME: dict[str, str] = {"envFile": "env_file"}


def _server_entries(data: bytes | str, source: str) -> tuple[dict[str, Any], str]:
    """The object of servers in a client's JSON document, and its key."""
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
    return entries, key


def _legal_key(name: str) -> bool:
    """Whether a client's server name can be a server key and prefix as it is."""
    return bool(NAME_CHARS.fullmatch(name) and URI_PREFIX.fullmatch(name.replace("_", "-"))) and "__" not in name


def _server_keys(names: list[str]) -> dict[str, str]:
    """Each client server name's key: itself when legal, else derived from it (letters
    without accents, lower case, other characters as one _; a letter first), unique."""
    taken = {name for name in names if _legal_key(name)}
    keys: dict[str, str] = {}
    for name in names:
        if name in taken:
            keys[name] = name
            continue
        plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        base = re.sub(r"[^A-Za-z0-9]+", "_", plain).strip("_").lower()[:48] or "server"
        if not base[0].isalpha():
            base = f"server_{base}"
        key, number = base, 2
        while key in taken:
            key, number = f"{base}_{number}", number + 1
        taken.add(key)
        keys[name] = key
    return keys


def _placed(table: dict[str, Any], directory: Path) -> dict[str, Any]:
    """One server's table with ``${workspaceFolder}`` replaced and ``env_file`` and ``cwd``
    made absolute against the JSON file's directory (they mean nothing beside a TOML file
    written elsewhere)."""
    workspace = directory.parent if directory.name in (".vscode", ".cursor") else directory
    folder = str(workspace).replace("$", "$$")

    def place(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("${workspaceFolder}", folder)
        if isinstance(value, list):
            return [place(item) for item in value]
        if isinstance(value, dict):
            return {key: place(item) for key, item in value.items()}
        return value

    table = place(table)
    for key in ("env_file", "cwd"):
        value = table.get(key)
        if isinstance(value, str) and value and "${" not in value.replace("$$", ""):
            absolute = os.path.join(str(directory).replace("$", "$$"), os.path.expanduser(value))
            table[key] = os.path.normpath(absolute)
    return table


def _tool_rules(entry: Mapping[str, Any], path: str, problems: list[str]) -> dict[str, list[str]]:
    """A server's ``includeTools`` and ``excludeTools`` as its ``tools`` policy: ``allow``
    and ``deny`` lists of exact names (a glob character or ``$`` in a name is escaped, so it
    matches only itself). A tool must be included, when ``includeTools`` is given, and not
    excluded; an empty ``includeTools`` includes no tool, which is ``deny = ["*"]``."""
    rules: dict[str, list[str]] = {}
    for key, rule in _TOOL_FILTERS.items():
        if key not in entry:
            continue
        names = entry[key]
        if not isinstance(names, list):
            problems.append(f"{path}.{key}: expected a list of tool names, got {describe(names)}")
            continue
        wrong = [
            f"{path}.{key}[{index}]: expected a string, got {describe(name)}"
            for index, name in enumerate(names)
            if not isinstance(name, str)
        ]
        problems.extend(wrong)
        if not wrong:
            rules[rule] = [_exact_glob(name) for name in names]
    if rules.get("allow") == []:
        del rules["allow"]
        rules["deny"] = ["*"]
    return rules


def _exact_glob(name: str) -> str:
    """A policy glob that matches ``name`` and nothing else, as a config value (``$`` doubled
    so that it is not read as a variable)."""
    return re.sub(r"[*?[]", lambda match: f"[{match.group()}]", name).replace("$", "$$")


def _json_shape_problems(table: Mapping[str, Any], path: str) -> list[str]:
    """Values of the wrong type in one JSON server entry, by their path in the JSON file
    (a number in `args` is refused rather than turned into a string: a client would not
    run it either)."""
    problems = []
    for key, shown in (("command", "command"), ("cwd", "cwd"), ("url", "url"), ("env_file", "envFile")):
        if key in table and not isinstance(table[key], str):
            problems.append(f"{path}.{shown}: expected a string, got {describe(table[key])}")
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
            problems.append(f"{path}.{key}: expected an object of strings, got {describe_secret(value)}")
        else:
            problems.extend(
                f"{path}.{key}.{name}: expected a string, got {describe_secret(item)}"
                for name, item in value.items()
                if not isinstance(item, str)
            )
    return problems

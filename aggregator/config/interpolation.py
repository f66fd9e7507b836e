"""${VAR} and ${VAR:-default} in config values: replaced from the environment, every other
``${`` form refused with its key path, and what each server's keys took from the
environment kept (its secrets, to mask)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# $$ is a literal $; ${NAME} and ${NAME:-default} are variables; any other ${ is refused.
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^${}]*))?\}|\$\{")
_FORM = "write ${NAME} or ${NAME:-default}, NAME made of letters, digits and _; $$ is a literal $"


def _malformed(value: str, start: int) -> str:
    """A sentence for the ``${`` at ``start`` that is not a variable, quoting only its form."""
    end = value.find("}", start)
    if end == -1:
        return f"an unclosed ${{ ({_FORM})"
    inside = value[start + 2 : end]
    if not inside:
        return f"an empty ${{}} ({_FORM})"
    if ":" in inside and not inside.startswith(":") and inside.split(":", 1)[0].isidentifier():
        head = inside.split(":", 1)[0]
        if inside[len(head) + 1 : len(head) + 2] != "-":
            # VS Code's ${input:...}, ${env:NAME} and the like: a client's own syntax.
            return f"${{{head}:...}} is another program's syntax, not expanded here ({_FORM})"
        return f"the default of ${{{head}:-...}} may not contain $, {{ or }} ({_FORM})"
    return f"${{...}} holding something other than a variable name ({_FORM})"


def interpolate(
    value: Any, path: str, environ: Mapping[str, str], problems: list[str], used: list[str] | None = None
) -> Any:
    """``value`` with ${VAR} and ${VAR:-default} replaced; each value taken from the
    environment is appended to ``used`` (a default is written in the config, not a secret)."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            if name is None:
                problems.append(f"{path}: {_malformed(value, match.start())}")
                return ""
            if name in environ and (default is None or environ[name] != ""):
                if used is not None:
                    used.append(environ[name])
                return environ[name]
            if default is not None:
                return default
            problems.append(f"{path}: environment variable {name} is not set")
            return ""

        return _VAR.sub(replace, value) if "$" in value else value
    if isinstance(value, list):
        return [interpolate(item, f"{path}[{i}]", environ, problems, used) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {
            key: interpolate(item, f"{path}.{key}" if path else key, environ, problems, used)
            for key, item in value.items()
        }
    return value


def interpolate_sections(
    raw: Mapping[str, Any], sections: tuple[str, ...], environ: Mapping[str, str], problems: list[str]
) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """The known sections interpolated, and what ${VAR} put into each server's keys."""
    data: dict[str, Any] = interpolate(
        {key: raw[key] for key in sections if key in raw and key != "servers"}, "", environ, problems
    )
    # Each server's tables on their own, to know what ${VAR} put into each (its secrets).
    interpolated: dict[str, tuple[str, ...]] = {}
    if isinstance(raw.get("servers"), dict):
        data["servers"] = {}
        for name, table in raw["servers"].items():
            used: list[str] = []
            data["servers"][name] = interpolate(table, f"servers.{name}", environ, problems, used)
            interpolated[name] = tuple(used)
    elif "servers" in raw:
        data["servers"] = raw["servers"]
    return data, interpolated

"""``aggregator import``: print the aggregator.toml equivalent of an mcpServers JSON file
(Claude Desktop, Cursor, VS Code), proved to load before it is printed."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from aggregator.config import mcp_servers_json_to_raw, raw_to_toml, structure_config
from aggregator.errors import ConfigError


def run_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    raw = mcp_servers_json_to_raw(data, source=str(path))
    text = raw_to_toml(raw)
    # Prove the output loads before printing it (variables stay unexpanded).
    structure_config(tomllib.loads(text), environ=_AnyEnviron(), source="(converted)")
    sys.stdout.write(f"# converted from {path}\n{text}")
    return 0


class _AnyEnviron(dict[str, str]):
    """An environment in which every variable is set: for validating without expanding."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return "${" + key + "}"

"""``aggregator import``: print the aggregator.toml equivalent of an mcpServers JSON file
(Claude Desktop, Cursor, VS Code), proved to load before anything is written. With
``--output`` the file is written whole (through a temporary file beside it) or not at all."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from pathlib import Path

from aggregator.config import mcp_servers_json_to_raw, raw_to_toml, structure_config
from aggregator.errors import AggregatorError, ConfigError


def run_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    output = getattr(args, "output", None)
    if output is not None and _same_file(path, Path(output)):
        raise AggregatorError(f"--output {output} is the file being imported; name another file (aggregator.toml)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    renamed: dict[str, str] = {}
    raw = mcp_servers_json_to_raw(data, source=str(path), directory=path.resolve().parent, renamed=renamed)
    comments = {
        key: f"{original!r} in {path.name} (a server key is made of A-Z a-z 0-9 _ . -)"
        for key, original in renamed.items()
    }
    text = f"# converted from {path}\n" + raw_to_toml(raw, comments)
    # Prove the output loads before writing it (variables stay unexpanded; env files unread).
    structure_config(tomllib.loads(text), environ=_AnyEnviron(), source="(converted)", read_files=False)
    if output is None:
        sys.stdout.write(text)
    else:
        _write_whole(Path(output), text)
    return 0


def _same_file(source: Path, target: Path) -> bool:
    """Whether ``target`` names ``source`` (the same path, or through a link or ``..``)."""
    try:
        return source.resolve() == target.resolve() or os.path.samefile(source, target)
    except (OSError, ValueError):  # one of them does not exist (yet): not the same file
        return False


def _write_whole(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a temporary file renamed over it: a reader never
    sees half a file, and a failure leaves what was there."""
    try:
        descriptor, temporary = tempfile.mkstemp(dir=target.resolve().parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise AggregatorError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, target)
    except OSError as exc:
        os.unlink(temporary)
        raise AggregatorError(f"cannot write {target}: {exc.strerror or exc}") from None


class _AnyEnviron(dict[str, str]):
    """An environment in which every variable is set: for validating without expanding."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return "${" + key + "}"

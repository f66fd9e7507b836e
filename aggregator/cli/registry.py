"""``aggregator search`` and ``aggregator add``: servers from an MCP registry.

``search`` lists the entries a registry matches (name, latest version, status, how each
runs, description), every text the registry sent shown escaped. ``add`` resolves one entry,
writes its ``[servers.KEY]`` table at the end of the config file (every other byte of the
file kept), then loads the file with the config loader, as ``serve`` and ``check`` would;
a file that does not load is put back as it was. An entry the registry marks deleted is
refused; a deprecated one is added with a warning.

The registry is ``--registry``, else ``[registry] url`` in the config, else the official
one. Variables stay unexpanded while the file is checked: a server's ``${API_KEY}`` is for
the user to set before serving, not a reason to refuse the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from aggregator.cli.common import DEFAULT_CONFIG
from aggregator.config import Config, load_config
from aggregator.errors import AggregatorError, ConfigError
from aggregator.plugins.resolve import plugin_problems
from aggregator.registry import (
    OFFICIAL_URL,
    Registry,
    RegistryError,
    default_key,
    dropped_settings,
    installation,
    open_registry,
    with_table,
)
from aggregator.registry.identifiers import escaped, shown

DEFAULT_LIMIT = 30
MAX_LIMIT = 1000
_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def run_search(args: argparse.Namespace) -> int:
    registry = _registry(args, _config_if_any(args))
    limit = args.limit
    if not 1 <= limit <= MAX_LIMIT:
        raise AggregatorError(f"--limit {limit}: give 1 to {MAX_LIMIT}")
    found = registry.search(args.query, limit, args.updated_since)
    for reason in found.skipped:
        print(escaped(f"aggregator: skipped an entry of {registry.label}: {reason}"), file=sys.stderr)
    if found.cut is not None:
        print(escaped(f"aggregator: {found.cut}"), file=sys.stderr)
    if not found.entries:
        print(escaped(f"no server in {registry.label} matches {args.query!r}"), file=sys.stderr)
        return 1
    raw_rows = [
        (entry.name, entry.version, entry.status or "-", ", ".join(entry.transports) or "-", entry.description)
        for entry in found.entries
    ]
    rows = [tuple(escaped(cell) for cell in row) for row in raw_rows]
    head = ("NAME", "VERSION", "STATUS", "RUNS AS", "DESCRIPTION")
    widths = [min(60, max(len(row[i]) for row in [head, *rows])) for i in range(4)]
    for row in [head, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])
    return 0


def run_add(args: argparse.Namespace) -> int:
    path = Path(args.config or DEFAULT_CONFIG)
    if path.suffix.lower() == ".json":
        raise AggregatorError(
            f"{path} is a JSON server list; add writes TOML (convert it first: aggregator import {path} -o"
            f" {DEFAULT_CONFIG})"
        )
    original: bytes | None = None
    if path.exists():
        try:
            original = path.read_bytes()
            text = original.decode("utf-8")
        except OSError as exc:
            raise AggregatorError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise AggregatorError(f"{path} is not UTF-8 text; nothing was written") from None
        config: Config | None = _loose_config(path)  # a file that does not load now is not written to
    else:
        text, config = "", None
    registry = _registry(args, config)
    entry = registry.get(args.name, args.version)
    if entry.status == "deleted":
        raise RegistryError(f"{entry.name} {entry.version} is deleted in registry {registry.label}; refused")
    if entry.status == "deprecated":
        print(
            escaped(f"aggregator: warning: {entry.name} {entry.version} is deprecated in registry {registry.label}"),
            file=sys.stderr,
        )
    key = args.key or default_key(entry.name)
    if not key or len(key) > 64 or not set(key) <= _KEY:
        raise AggregatorError(f"--as {shown(key)}: a server key is 1 to 64 of A-Z a-z 0-9 _ . -")
    added = installation(entry, key, registry.label)
    mark = "\ufeff" if text.startswith("\ufeff") else ""  # a byte order mark stays, the text is read after it
    text = text[len(mark) :]
    dropped = dropped_settings(text, key, added.text) if args.replace else []
    new_text = mark + with_table(text, key, added.text, replace=args.replace, source=str(path))
    _write(path, new_text.encode("utf-8"), original)
    try:
        load_config(path, environ=_Unexpanded(os.environ), plugin_check=plugin_problems)
    except ConfigError as exc:
        _put_back(path, original)
        what = "left as it was" if original is not None else "not created"
        problems = "\n".join(f"  {problem}" for problem in exc.problems)
        raise AggregatorError(
            f"{path} would not load with servers.{key} added, so it was {what}:\n{problems}"
        ) from None
    print(escaped(f"added servers.{key} to {path}: {entry.name} {entry.version}"))
    print(escaped(f"  runs: {added.runs}"))
    if added.variables:
        print(escaped(f"  set before serving: {', '.join(added.variables)}"))
    for note in added.notes:
        print(escaped(f"  note: {note}"))
    for setting in dropped:
        kind = "policy rule" if setting.split(".", 1)[0] in ("tools", "prompts", "resources") else "setting"
        print(
            escaped(f"aggregator: warning: --replace dropped the {kind} servers.{key}.{setting}; add it back by hand"),
            file=sys.stderr,
        )
    print(escaped(f"  try it: aggregator check --config {path}"))
    return 0


def _registry(args: argparse.Namespace, config: Config | None) -> Registry:
    """``--registry``, else the config's ``[registry] url`` (a directory relative to the
    config file), else the official registry."""
    if args.registry:
        return open_registry(args.registry, relative_to=Path.cwd())
    if config is not None and config.registry.url:
        directory = Path(config.directory) if config.directory else None
        try:
            return open_registry(config.registry.url, relative_to=directory)
        except RegistryError as exc:
            raise RegistryError(f"registry.url in the config: {exc}") from None
    return open_registry(OFFICIAL_URL)


def _config_if_any(args: argparse.Namespace) -> Config | None:
    path = Path(args.config or DEFAULT_CONFIG)
    if args.config is None and not path.exists():
        return None
    return _loose_config(path)


def _loose_config(path: Path) -> Config:
    """The config at ``path``, checked as the loader checks it, its variables unexpanded."""
    return load_config(path, environ=_Unexpanded(os.environ), plugin_check=plugin_problems)


def _write(path: Path, data: bytes, original: bytes | None) -> None:
    """Write ``data`` to ``path`` whole (a temporary file renamed over it, with the old
    file's permissions): a reader never sees half a file. A symbolic link is written
    through: the file it points at is replaced, the link stays a link."""
    target = path.resolve()
    try:
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise AggregatorError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        mode = path.stat().st_mode & 0o7777 if original is not None else 0o666 & ~_umask()
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except OSError as exc:
        os.unlink(temporary)
        raise AggregatorError(f"cannot write {path}: {exc.strerror or exc}") from None


def _put_back(path: Path, original: bytes | None) -> None:
    if original is None:
        path.resolve().unlink(missing_ok=True)
    else:
        _write(path, original, original)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _Unexpanded(Mapping[str, str]):
    """The environment, where every variable is set: one that is not reads as itself
    (``${NAME}``), so a table may name variables the user has yet to set."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return self.environ.get(key, "${" + key + "}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.environ)

    def __len__(self) -> int:
        return len(self.environ)

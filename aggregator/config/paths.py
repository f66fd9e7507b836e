"""Paths in the config: relative to the config file's directory, not to the directory the
proxy is started in (a desktop client starts it from /)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Plugin options that name a file or directory, resolved like every path of the config.
PATH_OPTION = re.compile(r"path|file|dir|directory|.+_(path|file|dir|directory)")


def beside(directory: Path | None, path: str | None) -> str | None:
    """A path of the config, relative to the config file's directory; a stdio server with
    no ``cwd`` runs there too. Unchanged when the config is not a file."""
    if path is not None:
        path = os.path.expanduser(path) if "\0" not in path else path
    if directory is None or (path is not None and ("\0" in path or os.path.isabs(path))):
        return path
    return str(directory / path) if path is not None else str(directory)

"""Servers from an MCP registry: finding them (``aggregator search``) and writing the
``[servers.KEY]`` table that runs one (``aggregator add``).

One module per job:

- ``identifiers``: what a registry may name (package names and versions per runner,
  arguments, variable and header names, remote URLs), checked strictly; ``RegistryError``;
- ``entries``: an entry (server.json, with the registry's ``_meta``) read into typed
  records, checked against the server.json schema of 2025-12-11;
- ``sources``: an HTTP registry (the API v0.1) or a directory of server.json files,
  every answer bounded in size, depth and time;
- ``tables``: an entry turned into a table's text (runner, pinned version, arguments,
  ``${VAR}`` for every variable, never a secret value);
- ``config_text``: that table added to a config file's text, every other byte kept.

Floor 3 (tests/core/test_layering.py), beside ``config``: it imports ``errors`` and
``jsonrpc`` only; ``cli/registry.py`` checks what it wrote with the config loader.
"""

from __future__ import annotations

from aggregator.registry.config_text import dropped_settings, existing_servers, with_table
from aggregator.registry.entries import ServerEntry, read_entry
from aggregator.registry.identifiers import RegistryError
from aggregator.registry.sources import OFFICIAL_URL, Found, Limits, Registry, open_registry
from aggregator.registry.tables import Installation, default_key, installation

__all__ = [
    "OFFICIAL_URL",
    "Found",
    "Installation",
    "Limits",
    "Registry",
    "RegistryError",
    "ServerEntry",
    "default_key",
    "dropped_settings",
    "existing_servers",
    "installation",
    "open_registry",
    "read_entry",
    "with_table",
]

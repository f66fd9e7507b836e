"""Configuration: frozen attrs classes, strict cattrs structuring, ${VAR} interpolation,
paths relative to the config file.

Owns reading ``aggregator.toml`` and the ``mcpServers`` JSON files that Claude Desktop,
Cursor and VS Code use. Every problem is reported with its key path
(``servers.git.args[2]: expected a string``) and all problems are reported at once.
Imports no I/O library beyond reading the one file it is given.

One module per job, all re-exported here:

- ``model``: the classes and their defaults;
- ``structuring``: raw data into the classes (cattrs), problems by key path;
- ``ranges``: the range of every number;
- ``validation``: what must agree across keys, listen addresses, paths and names;
- ``interpolation``: ${VAR} and ${VAR:-default}, other ${...} forms refused;
- ``paths``: relative paths resolved beside the config file;
- ``loading``: reading a file, all of the above in order;
- ``client_json``: MCP clients' JSON server lists (``mcpServers``, VS Code ``servers``);
- ``toml_writer``: the raw form written back as TOML (``aggregator import``);
- ``store_url``: the shared store's address (``[cluster] store``), its password never shown;
- ``masking``: a server's secrets (its env, headers, URL credentials, interpolated values)
  masked in text others see.

Floor 3 (tests/core/test_layering.py). May import ``core``, ``mcp``, ``jsonrpc``, ``errors``.
"""

from __future__ import annotations

from aggregator.config.client_json import mcp_servers_json_to_raw
from aggregator.config.loading import load_config, structure_config
from aggregator.config.model import (
    LOCAL_HOSTS,
    AuthConfig,
    ClusterConfig,
    Config,
    HttpConfig,
    IssuerConfig,
    ItemOverride,
    KindPolicy,
    PluginConfig,
    ProfileConfig,
    ProxyConfig,
    RegistryConfig,
    RuleSet,
    ServerConfig,
    Transport,
)
from aggregator.config.ranges import RANGES, Range, check_ranges
from aggregator.config.toml_writer import raw_to_toml
from aggregator.config.validation import check_http, parse_listen, same_listener

__all__ = [
    "LOCAL_HOSTS",
    "RANGES",
    "AuthConfig",
    "ClusterConfig",
    "Config",
    "HttpConfig",
    "IssuerConfig",
    "ItemOverride",
    "KindPolicy",
    "PluginConfig",
    "ProfileConfig",
    "ProxyConfig",
    "Range",
    "RegistryConfig",
    "RuleSet",
    "ServerConfig",
    "Transport",
    "check_http",
    "check_ranges",
    "load_config",
    "mcp_servers_json_to_raw",
    "parse_listen",
    "raw_to_toml",
    "same_listener",
    "structure_config",
]

"""Loading: read a file, interpolate ${VAR}, structure every table and check it, and
report all problems at once (``ConfigError``) with their key paths."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from aggregator.config.client_json import mcp_servers_json_to_raw
from aggregator.config.env_file import parse_env_file
from aggregator.config.interpolation import interpolate_sections
from aggregator.config.masking import SecretMask
from aggregator.config.model import (
    ADMIN_PATHS,
    AuthConfig,
    ClusterConfig,
    Config,
    HttpConfig,
    PluginConfig,
    ProfileConfig,
    ProxyConfig,
    RegistryConfig,
    RuleSet,
    ServerConfig,
)
from aggregator.config.paths import PATH_OPTION, beside
from aggregator.config.ranges import check_ranges
from aggregator.config.structuring import describe, structure_table, unknown_key, without_follow_ons
from aggregator.config.upstream_auth import (
    PER_USER,
    CredentialsConfig,
    acts_as_users,
    check_credentials,
    check_upstream_auth,
    oauth_path_problems,
)
from aggregator.config.validation import (
    check_auth,
    check_cluster,
    check_http,
    check_proxy,
    check_server,
    token_problems,
)
from aggregator.core.catalogs.naming import NAME_CHARS, validate_server_naming
from aggregator.errors import ConfigError

# Checks the [[plugins]] a config names (the plugin layer's, given by the caller: the config
# does not import it), returning problems by key path, so that they come with the others.
PluginCheck = Callable[[Sequence[PluginConfig], Path | None], list[str]]


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None, plugin_check: PluginCheck | None = None
) -> Config:
    """Read aggregator.toml, or an mcpServers / VS Code `servers` JSON file."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror or exc}") from None
    if file.suffix.lower() == ".json":
        raw = mcp_servers_json_to_raw(data, source=str(file), directory=file.resolve().parent)
    else:
        try:
            raw = tomllib.loads(data.decode("utf-8-sig"))  # (a byte order mark, as some editors write, is skipped)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid TOML: {exc}", source=str(file)) from None
    return structure_config(raw, environ=environ, source=str(file), plugin_check=plugin_check)


# --- structuring and checking ---------------------------------------------------------------


def structure_config(
    raw: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    source: str | None = None,
    read_files: bool = True,
    plugin_check: PluginCheck | None = None,
) -> Config:
    """Build a Config from parsed TOML/JSON data; raise ConfigError naming every problem.
    ``read_files`` false: servers' env files are not read nor their directories checked."""
    if environ is None:
        environ = os.environ
    problems: list[str] = []
    sections = (
        "proxy",
        "http",
        "auth",
        "policy",
        "profiles",
        "plugins",
        "servers",
        "credentials",
        "cluster",
        "registry",
    )
    unknown = sorted(set(raw) - set(sections))
    problems.extend(unknown_key("", key, sections) for key in unknown)
    data, interpolated = interpolate_sections(raw, sections, environ, problems)
    raw = data
    tables = _Tables(raw, problems)
    directory = Path(source).resolve().parent if source and not source.startswith("(") else None
    plugins = _plugins(raw.get("plugins", []), problems, directory)
    if plugin_check is not None:
        problems.extend(plugin_check(plugins, directory))
    policy = tables.section("policy", RuleSet)
    profiles: dict[str, ProfileConfig] = tables.keyed("profiles", ProfileConfig, "profiles")
    for name in profiles:
        if name == "default" or not NAME_CHARS.fullmatch(name):
            problems.append(f'profiles.{name}: a profile name is made of A-Z a-z 0-9 _ . - and is not "default"')
    proxy = tables.section("proxy", ProxyConfig)
    tables.checked("proxy", check_ranges(proxy, "proxy") + check_proxy(proxy))
    http = tables.section("http", HttpConfig)
    tables.checked("http", check_ranges(http, "http") + check_http(http))
    proxy, http = _client_limits(proxy, http, raw.get("proxy"), raw.get("http"))
    auth = tables.section("auth", AuthConfig)
    tables.checked("auth", check_ranges(auth, "auth") + check_auth(auth, profiles))
    servers = _servers(tables, interpolated, directory if read_files else None, proxy.env_passthrough, read_files)
    credentials = tables.section("credentials", CredentialsConfig)
    tables.checked(
        "credentials", check_ranges(credentials, "credentials") + check_credentials(credentials, servers, environ)
    )
    problems.extend(oauth_path_problems(credentials, _http_paths(http, profiles)))
    cluster = tables.section("cluster", ClusterConfig)
    tables.checked("cluster", check_ranges(cluster, "cluster") + check_cluster(cluster))
    if directory is not None and read_files:
        credentials = attrs.evolve(credentials, vault=beside(directory, credentials.vault) or credentials.vault)
    registry = tables.section("registry", RegistryConfig)
    # With a broken separator, the keys are still checked, against one no key holds.
    separator_broken = any(problem.startswith("proxy.separator") for problem in problems)
    problems.extend(validate_server_naming(list(servers.values()), "\0" if separator_broken else proxy.separator))
    named = set(raw["servers"]) if isinstance(raw.get("servers"), dict) else set()
    problems.extend(_profile_problems(profiles, named, http.auth_tokens))
    problems.extend(_min_ready_problems(proxy.min_ready, named, servers))
    if problems:
        raise ConfigError(problems, source=source)
    return Config(
        proxy=proxy,
        http=http,
        auth=auth,
        policy=policy,
        profiles=profiles,
        plugins=tuple(plugins),
        servers=servers,
        credentials=credentials,
        cluster=cluster,
        registry=registry,
        directory=str(directory) if directory is not None else None,
    )


def _http_paths(http: HttpConfig, profiles: Mapping[str, ProfileConfig]) -> dict[str, str]:
    """The proxy's own paths on its HTTP listener (the OAuth ones aside), each with what serves it."""
    paths = {path: f"an admin path ({path})" for path in ADMIN_PATHS}
    paths[http.messages_path] = f"the legacy SSE transport's http.messages_path ({http.messages_path})"
    paths[http.sse_path] = f"the legacy SSE transport's http.sse_path ({http.sse_path})"
    for name in profiles:
        paths[f"{http.path}/{name}"] = f"profile {name}'s endpoint ({http.path}/{name})"
    paths[http.path] = f"the MCP endpoint, http.path ({http.path})"
    return paths


def _servers(
    tables: _Tables,
    interpolated: Mapping[str, tuple[str, ...]],
    directory: Path | None,
    passthrough: tuple[str, ...],
    read_files: bool,
) -> dict[str, ServerConfig]:
    """The [servers.NAME] tables, structured and checked; each stdio server's ``cwd``
    resolved beside the config, its ``env_passthrough`` joined by the global one."""
    servers: dict[str, ServerConfig] = tables.keyed("servers", ServerConfig, "servers")
    for name, server in servers.items():
        stdio = server.effective_transport == "stdio"
        cwd = beside(directory, server.cwd) if stdio else server.cwd
        servers[name] = server = attrs.evolve(server, interpolated=interpolated.get(name, ()), cwd=cwd)
        path = f"servers.{name}"
        raw = tables.raw["servers"][name]
        tables.checked(
            path, check_ranges(server, path) + check_server(server, path) + check_upstream_auth(server, path, raw)
        )
        if server.auth in PER_USER:  # one user's credential never serves another
            servers[name] = server = attrs.evolve(server, isolation="per-session")
        if directory is not None and cwd is not None and "\0" not in cwd and not os.path.isdir(cwd):
            shown = SecretMask.of(server)(cwd)  # masked as the server's errors are (a ${VAR} in it)
            tables.problems.append(f"{path}.cwd: no such directory: {shown}")
        if server.env_file is not None and read_files:
            servers[name] = server = _with_env_file(server, beside(directory, server.env_file), path, tables.problems)
        if stdio:  # checked on its own first, so that a global mistake is not repeated here
            joined = tuple(dict.fromkeys((*passthrough, *server.env_passthrough)))
            servers[name] = attrs.evolve(server, env_passthrough=joined)
    return servers


def _min_ready_problems(
    min_ready: int | None, named: set[str], servers: Mapping[str, ServerConfig], running: str = ""
) -> list[str]:
    """``proxy.min_ready`` cannot ask for more servers than are enabled: /readyz would never
    say ready. (A server whose table has a mistake counts as enabled: its mistake is told.)
    A server acting as each user does not count: readiness never waits for it.
    ``running``: words saying the value is the running one (a reload checks against it)."""
    if min_ready is None or not isinstance(min_ready, int):
        return []
    per_user = sum(1 for name in named if name in servers and servers[name].enabled and acts_as_users(servers[name]))
    enabled = sum(1 for name in named if name not in servers or servers[name].enabled) - per_user
    if min_ready <= enabled:
        return []
    return [
        f"proxy.min_ready: {min_ready} servers must be ready{running}, but {enabled} enabled"
        f" {'server is' if enabled == 1 else 'servers are'} configured; /readyz would never say ready"
        + (" (a server acting as each user is not waited for)" if per_user else "")
    ]


def min_ready_problems(running: Config, servers: Mapping[str, ServerConfig]) -> list[str]:
    """A reload's ``servers`` checked against the running ``proxy.min_ready`` (a change to
    ``[proxy]`` waits for a restart, so the running value is the one in force)."""
    why = " (the running value: [proxy] changes take a restart)"
    return _min_ready_problems(running.proxy.min_ready, set(servers), servers, why)


def _with_env_file(server: ServerConfig, file: str | None, path: str, problems: list[str]) -> ServerConfig:
    """A stdio server with its env_file's variables in ``env`` (under its own ``env``); a
    file that cannot be read or parsed is a problem."""
    if server.effective_transport != "stdio":
        problems.append(f"{path}.env_file: only a stdio server (a `command`) has an environment")
        return server
    assert file is not None  # beside() keeps a path a path
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc)
        problems.append(f"{path}.env_file: cannot read {file}: {reason}")
        return server
    values, found = parse_env_file(text)
    problems.extend(f"{path}.env_file: {file}: {problem}" for problem in found)
    return attrs.evolve(server, env={**values, **server.env}, env_file=file)  # env values are masked as secrets


def _plugins(raw_plugins: Any, problems: list[str], directory: Path | None = None) -> list[PluginConfig]:
    """The [[plugins]] tables, each a plugin to load and its options (those named ``path``,
    ``file``, ``dir`` or ending in ``_path``, ``_file``, ``_dir``: relative to ``directory``)."""
    plugins: list[PluginConfig] = []
    if not isinstance(raw_plugins, list):
        problems.append("plugins: expected an array of tables ([[plugins]])")
        return plugins
    for index, table in enumerate(raw_plugins):
        path = f"plugins[{index}]"
        if not isinstance(table, dict) or not isinstance(table.get("use"), str):
            problems.append(f"{path}.use: required: the plugin to load")
            continue
        if set(table) - {"use", "options"}:
            problems.extend(
                unknown_key(path, key, ("use", "options")) for key in sorted(set(table) - {"use", "options"})
            )
            continue
        options = table.get("options", {})
        if not isinstance(options, dict):
            problems.append(f"{path}.options: expected a table")
            continue
        options = {
            key: beside(directory, value) if PATH_OPTION.fullmatch(key) and isinstance(value, str) and value else value
            for key, value in options.items()
        }
        plugins.append(PluginConfig(use=table["use"], options=options))
    return plugins


class _Tables:
    """Structures the tables of one config, recording their problems with their key paths
    and which keys of each failed (so that checks do not repeat a problem as another)."""

    def __init__(self, raw: Mapping[str, Any], problems: list[str]) -> None:
        self.raw = raw
        self.problems = problems
        self.broken_keys: dict[str, set[str]] = {}  # table path -> its keys that failed to structure

    def section(self, key: str, cls: type) -> Any:
        """One top-level table, structured; its problems recorded, defaults where broken."""
        if key not in self.raw:
            return cls()
        value, found, self.broken_keys[key] = structure_table(self.raw[key], cls, key)
        self.problems.extend(found)
        return value

    def keyed(self, key: str, cls: type, what: str) -> dict[str, Any]:
        """A table of named tables ([servers.NAME], [profiles.NAME]), each structured and
        given its name; problems recorded with their key paths."""
        tables = self.raw.get(key, {})
        if not isinstance(tables, dict):
            self.problems.append(f"{key}: expected a table of {what}, got {describe(tables)}")
            return {}
        out = {}
        for name, table in tables.items():
            path = f"{key}.{name}"
            if not isinstance(table, dict):
                self.problems.append(f"{path}: expected a table, got {describe(table)}")
            elif "name" in table or "interpolated" in table:
                # Set by loading (the [servers.NAME] key, what ${VAR} put in), not by the config.
                own = "name" if "name" in table else "interpolated"
                self.problems.append(f"{path}.{own}: unknown key")
            else:
                value, found, self.broken_keys[path] = structure_table(table, cls, path)
                self.problems.extend(found)
                out[name] = attrs.evolve(value, name=name)
        return out

    def checked(self, path: str, found: list[str]) -> None:
        """Record a table's check problems, less those that follow from a key already broken."""
        self.problems.extend(without_follow_ons(found, path, self.broken_keys.get(path, set())))


def _profile_problems(profiles: Mapping[str, ProfileConfig], named: set[str], auth_tokens: Sequence[str]) -> list[str]:
    """Profiles name only servers that exist, and each token selects one profile."""
    problems = []
    for name, profile in profiles.items():
        for server_name in profile.servers:
            if server_name not in named:
                problems.append(f"profiles.{name}.servers.{server_name}: no such server")
    tokens = [*auth_tokens, *(t for p in profiles.values() for t in p.tokens)]
    if len(set(tokens)) < len(tokens):
        problems.append("profiles: a token may select only one profile (or the default)")
    for name, profile in profiles.items():
        problems += token_problems(profile.tokens, f"profiles.{name}.tokens")
    return problems


def _client_limits(
    proxy: ProxyConfig, http: HttpConfig, raw_proxy: Any, raw_http: Any
) -> tuple[ProxyConfig, HttpConfig]:
    """One budget and one deadline for every client, whichever of their names was used."""
    given = raw_proxy if isinstance(raw_proxy, dict) else {}
    older = raw_http if isinstance(raw_http, dict) else {}
    if "max_stream_buffer_bytes" in older and "client_buffer_bytes" not in given:
        proxy = attrs.evolve(proxy, client_buffer_bytes=http.max_stream_buffer_bytes)
    if "write_timeout" in older and "client_write_timeout" not in given:
        proxy = attrs.evolve(proxy, client_write_timeout=http.write_timeout)
    return proxy, attrs.evolve(
        http, max_stream_buffer_bytes=proxy.client_buffer_bytes, write_timeout=proxy.client_write_timeout
    )

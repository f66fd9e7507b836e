"""Configuration: frozen attrs classes, strict cattrs structuring, ${VAR} interpolation.

Owns reading ``aggregator.toml`` and the ``mcpServers`` JSON files that Claude Desktop,
Cursor and VS Code use. Every problem is reported with its key path
(``servers.git.args[2]: expected a string``) and all problems are reported at once.
Imports no I/O library beyond reading the one file it is given.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from aggregator.core import defaults
from aggregator.core.naming import NAME_CHARS, validate_server_naming
from aggregator.core.nesting import CHAIN_VARIABLE
from aggregator.errors import ConfigError
from aggregator.jsonrpc.codec import DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT

Transport = Literal["stdio", "streamable-http", "sse", "websocket"]


@attrs.frozen(kw_only=True)
class ItemOverride:
    """What a client sees of one item instead of what its server says."""

    name: str | None = None
    title: str | None = None
    description: str | None = None


@attrs.frozen(kw_only=True)
class KindPolicy:
    """Which items of one kind a client may see and use, matched on the server's own names
    (URIs for resources, URI templates for templates) with shell-style globs."""

    allow: tuple[str, ...] = ()  # empty: everything not denied
    deny: tuple[str, ...] = ()
    read_only: bool = False  # tools only: expose only those with readOnlyHint true
    destructive: bool = True  # tools only: false hides every tool not saying destructiveHint false
    rename: Mapping[str, ItemOverride] = attrs.field(factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.allow or self.deny or self.read_only or not self.destructive or self.rename)


@attrs.frozen(kw_only=True)
class RuleSet:
    """Allow/deny rules for the four kinds (the global policy, or a profile's)."""

    tools: KindPolicy = attrs.field(factory=KindPolicy)
    prompts: KindPolicy = attrs.field(factory=KindPolicy)
    resources: KindPolicy = attrs.field(factory=KindPolicy)
    templates: KindPolicy = attrs.field(factory=KindPolicy)


@attrs.frozen(kw_only=True)
class ProfileConfig:
    """A named policy: what the clients that use it see, on top of the server rules."""

    name: str = ""
    tokens: tuple[str, ...] = ()  # HTTP bearer tokens that select this profile
    tools: KindPolicy = attrs.field(factory=KindPolicy)
    prompts: KindPolicy = attrs.field(factory=KindPolicy)
    resources: KindPolicy = attrs.field(factory=KindPolicy)
    templates: KindPolicy = attrs.field(factory=KindPolicy)
    servers: Mapping[str, RuleSet] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ServerConfig:
    name: str = ""  # filled from the [servers.NAME] key
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    transport: Transport | None = None
    prefix: str | None = None  # None: the server's key; "": no prefix
    uri_prefix: str | None = None  # None: derived from the prefix; "": URIs unchanged
    enabled: bool = True
    # "shared": one connection for all clients; "per-session": each client session gets
    # its own (its own process, for stdio), started on first use, stopped with the session.
    isolation: Literal["shared", "per-session"] = "shared"
    init_timeout: float = 10.0
    # A request without an answer after request_timeout fails (reason "timeout") and is
    # cancelled upstream. Progress can extend it, never past max_request_timeout.
    request_timeout: float = defaults.REQUEST_TIMEOUT
    timeout_resets_on_progress: bool = defaults.TIMEOUT_RESETS_ON_PROGRESS
    max_request_timeout: float = defaults.MAX_REQUEST_TIMEOUT
    # What every client may see and use of this server.
    tools: KindPolicy = attrs.field(factory=KindPolicy)
    prompts: KindPolicy = attrs.field(factory=KindPolicy)
    resources: KindPolicy = attrs.field(factory=KindPolicy)
    templates: KindPolicy = attrs.field(factory=KindPolicy)
    # Server-to-client requests this server may make (None: all that the proxy routes).
    server_requests: tuple[str, ...] | None = None

    @property
    def effective_transport(self) -> Transport:
        if self.transport is not None:
            return self.transport
        if self.command is not None:
            return "stdio"
        if (self.url or "").lower().startswith(("ws://", "wss://")):
            return "websocket"
        return "streamable-http"


@attrs.frozen(kw_only=True)
class ProxyConfig:
    separator: str = "__"
    # How long the first client's `initialize` waits for every server to be ready.
    startup_timeout: float = 10.0
    page_size: int = 100
    max_message_bytes: int = 16 * 1024 * 1024
    # Deepest JSON nesting accepted in a message, either direction (the envelope is level 1).
    max_json_depth: int = DEFAULT_MAX_DEPTH
    restart_backoff_initial: float = 0.5
    restart_backoff_max: float = 30.0
    # Server-to-client requests the proxy routes to clients (and so declares upstream).
    server_requests: tuple[str, ...] = defaults.SERVER_REQUESTS
    # The roots shared servers see (and per-session ones whose client has none); None: no roots.
    roots: tuple[str, ...] | None = None
    # Several list changes within this many seconds reach clients as one notification.
    list_changed_debounce: float = defaults.LIST_CHANGED_DEBOUNCE
    # Requests one client session may have in flight; more are refused (reason overloaded).
    max_in_flight_per_session: int = defaults.MAX_IN_FLIGHT_PER_SESSION
    # On SIGTERM/SIGINT: how long requests in flight may take to finish before they fail.
    drain_timeout: float = 10.0
    # Exposed tool and prompt names: at most this long, and made of this charset:
    # "mcp" is the spec's [A-Za-z0-9_.-]; "llm" is [A-Za-z0-9_-], what LLM APIs accept.
    max_name_length: int = 128
    name_charset: Literal["mcp", "llm"] = "mcp"
    # Memory and time one slow party may cost. A client (any front) with more than
    # client_buffer_bytes waiting for it, or a write to it unfinished after
    # client_write_timeout, is dropped and its requests are cancelled upstream. A server
    # with more than server_buffer_bytes waiting on its input gets no new requests (they
    # fail, reason overloaded); one that reads nothing for server_write_timeout has its
    # requests in flight failed the same way. What all clients together are holding
    # (waiting or being written) is bounded by total_client_buffer_bytes: past it, the
    # clients that have stopped reading are dropped the same way, the longest stalled
    # first, until the total is under it (a client that reads is never dropped for it).
    client_buffer_bytes: int = 16 * 1024 * 1024
    total_client_buffer_bytes: int = 32 * 1024 * 1024
    client_write_timeout: float = 30.0
    server_buffer_bytes: int = 16 * 1024 * 1024
    server_write_timeout: float = 10.0


LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@attrs.frozen(kw_only=True)
class HttpConfig:
    """The Streamable HTTP endpoint (``aggregator serve --http``)."""

    listen: str | None = None  # "127.0.0.1:8000"; None: no HTTP endpoint
    path: str = "/mcp"
    # The legacy HTTP+SSE transport (2024-11-05) on the same listener: GET sse_path opens
    # the stream, which names messages_path for the POSTs.
    sse_path: str = "/sse"
    messages_path: str = "/messages"
    # A WebSocket endpoint (one MCP session per connection) on its own listener.
    websocket_listen: str | None = None
    # Host header names accepted (any port); DNS rebinding defence. Add your own names
    # when you listen beyond loopback.
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS
    # Origin header values accepted, as scheme://host (any port). Requests without Origin
    # (not from a browser) are accepted.
    allowed_origins: tuple[str, ...] = tuple(f"{scheme}://{host}" for scheme in ("http", "https")
                                             for host in LOCAL_HOSTS)
    # Bearer tokens that may use the endpoint; empty: no authentication.
    auth_tokens: tuple[str, ...] = ()
    # Listening beyond loopback without tokens is refused unless this says so.
    allow_unauthenticated_remote: bool = False
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    # Total deadlines, however the bytes drip: a request's headers must be complete within
    # header_timeout of its first byte (of the connection's opening, for its first
    # request), its body within body_timeout of the headers' end. A keep-alive connection
    # with no new request for keepalive_timeout is closed.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 30.0
    # Open connections across the HTTP and WebSocket listeners; past it new ones get 503
    # and are closed at once.
    max_connections: int = 512
    # Sessions across Streamable HTTP, legacy SSE and WebSocket together.
    max_sessions: int = 256
    session_idle_timeout: float = 1800.0
    # A client whose response stream drops has that request cancelled after this long,
    # unless it resumes the stream (GET with Last-Event-ID) first.
    stream_drop_grace: float = 2.0
    # Older names of proxy.client_buffer_bytes and proxy.client_write_timeout (accepted;
    # the proxy keys win when both are given). After loading they hold the proxy values.
    max_stream_buffer_bytes: int = 16 * 1024 * 1024
    write_timeout: float = 30.0


@attrs.frozen(kw_only=True)
class PluginConfig:
    """One plugin: what to load (an entry point name, package.module:Name, or
    file.py:Name) and the keyword arguments to build it with."""

    use: str
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Config:
    proxy: ProxyConfig = attrs.field(factory=ProxyConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    policy: RuleSet = attrs.field(factory=RuleSet)  # for every client and server
    profiles: Mapping[str, ProfileConfig] = attrs.field(factory=dict)
    plugins: tuple[PluginConfig, ...] = ()
    servers: Mapping[str, ServerConfig] = attrs.field(factory=dict)
    directory: str | None = None  # where the config file is (relative plugin paths)

    @property
    def enabled_servers(self) -> list[ServerConfig]:
        return [server for server in self.servers.values() if server.enabled]


# --- structuring --------------------------------------------------------------------------


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)

    def structure_str(value: Any, _: type) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {_describe(value)}")
        return value

    def structure_float(value: Any, _: type) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {_describe(value)}")
        return float(value)

    def structure_int(value: Any, _: type) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {_describe(value)}")
        return value

    def structure_bool(value: Any, _: type) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {_describe(value)}")
        return value

    def structure_args(value: Any, _: type) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list of strings, got {_describe(value)}")
        problems = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                problems.append(f"[{index}]: expected a string, got {_describe(item)}")
        if problems:
            raise _PathErrors(problems)
        return tuple(value)

    def structure_str_map(value: Any, _: type) -> dict[str, str]:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table of strings, got {_describe(value)}")
        problems = [
            f".{key}: expected a string, got {_describe(item)}"
            for key, item in value.items()
            if not isinstance(item, str)
        ]
        if problems:
            raise _PathErrors(problems)
        return dict(value)

    def structure_transport(value: Any, _: type) -> str:
        allowed = ("stdio", "streamable-http", "sse", "websocket")
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {_describe(value)}")
        return value

    converter.register_structure_hook(str, structure_str)
    converter.register_structure_hook(float, structure_float)
    converter.register_structure_hook(int, structure_int)
    converter.register_structure_hook(bool, structure_bool)
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], structure_args)
    converter.register_structure_hook_func(
        lambda t: t == tuple[str, ...] | None, lambda v, _: None if v is None else structure_args(v, _))
    converter.register_structure_hook_func(lambda t: t == Mapping[str, str], structure_str_map)
    converter.register_structure_hook_func(lambda t: t == Transport, structure_transport)

    def structure_charset(value: Any, _: type) -> str:
        if value not in ("mcp", "llm"):
            raise ValueError(f"expected mcp or llm, got {_describe(value)}")
        return value

    converter.register_structure_hook_func(lambda t: t == Literal["mcp", "llm"], structure_charset)

    def table_of(cls: type, what: str) -> Any:
        """A hook for ``Mapping[str, cls]``: each entry structured, problems by key path."""
        def structure(value: Any, _: type) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise TypeError(f"expected a table of {what}, got {_describe(value)}")
            out, problems = {}, []
            for key, item in value.items():
                try:
                    out[key] = converter.structure(item, cls)
                except Exception as exc:  # noqa: BLE001 - every problem is reported
                    problems += [line.replace("$", f".{key}", 1) for line in _flatten(exc, "$")]
            if problems:
                raise _PathErrors(problems)
            return out
        return structure

    converter.register_structure_hook_func(lambda t: t == Mapping[str, ItemOverride],
                                           table_of(ItemOverride, "overrides"))
    converter.register_structure_hook_func(lambda t: t == Mapping[str, RuleSet], table_of(RuleSet, "servers"))

    def structure_isolation(value: Any, _: type) -> str:
        if value not in ("shared", "per-session"):
            raise ValueError(f"expected shared or per-session, got {_describe(value)}")
        return value

    converter.register_structure_hook_func(lambda t: t == Literal["shared", "per-session"], structure_isolation)
    return converter


def _structure_table(value: Any, cls: type, path: str) -> tuple[Any, list[str], set[str]]:
    """Structure one table into ``cls``; return it, its problems (key paths) and the keys
    at fault.

    A key whose value has the wrong type or shape is reported and left at its default, and
    the rest is structured again, so that the value checks that follow (ranges, and what
    depends on several keys) see every well-typed key and report their problems in the
    same run (see ``_without_follow_ons``).
    """
    if not isinstance(value, dict):
        return cls(), [f"{path}: expected a table, got {_describe(value)}"], set()
    try:
        return _converter.structure(value, cls), [], set()
    except Exception as exc:  # noqa: BLE001 - every structuring problem is reported
        problems = _flatten(exc, path)
        failed = exc
    broken: set[str] = set()
    for sub in getattr(failed, "exceptions", ()):
        if isinstance(sub, ForbiddenExtraKeysError):
            broken |= set(sub.extra_fields)
        for note in getattr(sub, "__notes__", ()):
            if getattr(note, "name", None) is not None:
                broken.add(note.name)
    try:
        return _converter.structure({k: v for k, v in value.items() if k not in broken}, cls), problems, broken
    except Exception:  # noqa: BLE001 - already reported above
        return cls(), problems, set(value)


def _without_follow_ons(problems: list[str], path: str, broken: set[str]) -> list[str]:
    """The value checks' problems for a table, less those a broken key may have caused:
    a problem about the whole table (``servers.a: needs either command or url``, when
    ``command`` had the wrong type) or about a broken key itself waits for the next run."""
    if not broken:
        return problems
    kept = []
    for problem in problems:
        rest = problem[len(path) + 1:] if problem.startswith(path + ".") else None
        if rest is not None and re.split(r"[.\[:]", rest, maxsplit=1)[0] not in broken:
            kept.append(problem)
    return kept


class _PathErrors(Exception):
    """Problems inside one value, each already prefixed with its sub-path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_converter = _make_converter()


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _flatten(exc: BaseException, path: str) -> list[str]:
    """Turn a cattrs exception tree into `path: message` lines."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [f"{path}.{key}: unknown key" if path else f"{key}: unknown key"
                for key in sorted(exc.extra_fields)]
    if isinstance(exc, ClassValidationError | IterableValidationError):
        lines: list[str] = []
        for sub in exc.exceptions:
            note = _note_of(sub)
            lines.extend(_flatten(sub, path + note))
        return lines
    if isinstance(exc, _PathErrors):
        return [f"{path}{problem}" for problem in exc.problems]
    if isinstance(exc, KeyError):
        return [f"{path}: required key is missing"]
    return [f"{path}: {exc}"]


def _note_of(exc: BaseException) -> str:
    for note in getattr(exc, "__notes__", ()):
        # cattrs notes: "Structuring class X @ attribute name" / "... @ index 2" / "@ key k"
        name = getattr(note, "name", None)
        if name is not None:
            return f".{name}"
        index = getattr(note, "index", None)
        if index is not None:
            return f"[{index}]"
        if " @ attribute " in note:
            return "." + note.rsplit(" @ attribute ", 1)[1]
    return ""


# --- interpolation ------------------------------------------------------------------------

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _interpolate(value: Any, path: str, environ: Mapping[str, str], problems: list[str]) -> Any:
    if isinstance(value, str):
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "$"
            if name not in environ:
                problems.append(f"{path}: environment variable {name} is not set")
                return ""
            return environ[name]

        return _VAR.sub(replace, value) if "$" in value else value
    if isinstance(value, list):
        return [_interpolate(item, f"{path}[{i}]", environ, problems) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {
            key: _interpolate(item, f"{path}.{key}" if path else key, environ, problems)
            for key, item in value.items()
        }
    return value


# --- loading ------------------------------------------------------------------------------


def structure_config(
    raw: Mapping[str, Any], *, environ: Mapping[str, str] | None = None, source: str | None = None
) -> Config:
    """Build a Config from parsed TOML/JSON data; raise ConfigError naming every problem."""
    if environ is None:
        environ = os.environ
    problems: list[str] = []
    sections = ("proxy", "http", "policy", "profiles", "plugins", "servers")
    unknown = sorted(set(raw) - set(sections))
    problems.extend(f"{key}: unknown key" for key in unknown)
    raw = _interpolate({key: raw[key] for key in sections if key in raw}, "", environ, problems)
    plugins: list[PluginConfig] = []
    raw_plugins = raw.get("plugins", [])
    if not isinstance(raw_plugins, list):
        problems.append("plugins: expected an array of tables ([[plugins]])")
        raw_plugins = []
    for index, table in enumerate(raw_plugins):
        path = f"plugins[{index}]"
        if not isinstance(table, dict) or not isinstance(table.get("use"), str):
            problems.append(f"{path}.use: required: the plugin to load")
            continue
        if set(table) - {"use", "options"}:
            problems.extend(f"{path}.{key}: unknown key" for key in sorted(set(table) - {"use", "options"}))
            continue
        options = table.get("options", {})
        if not isinstance(options, dict):
            problems.append(f"{path}.options: expected a table")
            continue
        plugins.append(PluginConfig(use=table["use"], options=options))
    broken_keys: dict[str, set[str]] = {}  # table path -> its keys that failed to structure

    def section(key: str, cls: type) -> Any:
        """One top-level table, structured; its problems recorded, defaults where broken."""
        if key not in raw:
            return cls()
        value, found, broken_keys[key] = _structure_table(raw[key], cls, key)
        problems.extend(found)
        return value

    policy = section("policy", RuleSet)
    def keyed(key: str, cls: type, what: str) -> dict[str, Any]:
        """A table of named tables ([servers.NAME], [profiles.NAME]), each structured and
        given its name; problems recorded with their key paths."""
        tables = raw.get(key, {})
        if not isinstance(tables, dict):
            problems.append(f"{key}: expected a table of {what}, got {_describe(tables)}")
            return {}
        out = {}
        for name, table in tables.items():
            path = f"{key}.{name}"
            if not isinstance(table, dict):
                problems.append(f"{path}: expected a table, got {_describe(table)}")
            elif "name" in table:
                problems.append(f"{path}.name: unknown key")
            else:
                value, found, broken_keys[path] = _structure_table(table, cls, path)
                problems.extend(found)
                out[name] = attrs.evolve(value, name=name)
        return out

    profiles: dict[str, ProfileConfig] = keyed("profiles", ProfileConfig, "profiles")
    for name in profiles:
        path = f"profiles.{name}"
        if name == "default" or not NAME_CHARS.fullmatch(name):
            problems.append(f"{path}: a profile name is made of A-Z a-z 0-9 _ . - and is not \"default\"")
    def checked(path: str, found: list[str]) -> None:
        problems.extend(_without_follow_ons(found, path, broken_keys.get(path, set())))

    proxy = section("proxy", ProxyConfig)
    checked("proxy", check_ranges(proxy, "proxy") + _check_proxy(proxy))
    http = section("http", HttpConfig)
    checked("http", check_ranges(http, "http") + check_http(http))
    proxy, http = _client_limits(proxy, http, raw.get("proxy"), raw.get("http"))
    servers: dict[str, ServerConfig] = keyed("servers", ServerConfig, "servers")
    for name, server in servers.items():
        path = f"servers.{name}"
        checked(path, check_ranges(server, path) + _check_server(server, path))
    if not any(problem.startswith("proxy.separator") for problem in problems):
        problems.extend(validate_server_naming(list(servers.values()), proxy.separator))
    named = set(raw["servers"]) if isinstance(raw.get("servers"), dict) else set()
    for name, profile in profiles.items():
        for server in profile.servers:
            if server not in named:
                problems.append(f"profiles.{name}.servers.{server}: no such server")
    tokens = [*http.auth_tokens, *(t for p in profiles.values() for t in p.tokens)]
    if len(set(tokens)) < len(tokens):
        problems.append("profiles: a token may select only one profile (or the default)")
    for name, profile in profiles.items():
        for index, token in enumerate(profile.tokens):
            if len(token) < 16:
                problems.append(f"profiles.{name}.tokens[{index}]: too short; use at least 16 random characters")
    if problems:
        raise ConfigError(problems, source=source)
    return Config(proxy=proxy, http=http, policy=policy, profiles=profiles, plugins=tuple(plugins), servers=servers,
                  directory=str(Path(source).resolve().parent) if source and not source.startswith("(") else None)


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
    return proxy, attrs.evolve(http, max_stream_buffer_bytes=proxy.client_buffer_bytes,
                               write_timeout=proxy.client_write_timeout)


def parse_listen(listen: str) -> tuple[str, int]:
    """"127.0.0.1:8000", "[::1]:8000" or "8000" (loopback) -> (host, port)."""
    if listen.isdigit():
        listen = f"127.0.0.1:{listen}"
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:8000, got {listen!r}")
    return host.strip("[]"), int(port)


_ANY_HOST = ("0.0.0.0", "::", "")


def same_listener(first: str, second: str) -> bool:
    """Whether two listen addresses would take the same port (so the second cannot bind)."""
    try:
        (host_a, port_a), (host_b, port_b) = parse_listen(first), parse_listen(second)
    except ValueError:
        return False
    hosts = {"localhost": "127.0.0.1"}
    host_a, host_b = hosts.get(host_a, host_a), hosts.get(host_b, host_b)
    return port_a == port_b and (host_a == host_b or host_a in _ANY_HOST or host_b in _ANY_HOST)


def check_http(http: HttpConfig) -> list[str]:
    problems = []
    for name in ("listen", "websocket_listen"):
        value = getattr(http, name)
        if value is not None:
            try:
                parse_listen(value)
            except ValueError as exc:
                problems.append(f"http.{name}: {exc}")
    if http.listen is not None and http.websocket_listen is not None and same_listener(http.listen,
                                                                                        http.websocket_listen):
        problems.append("http.websocket_listen: must be another port than http.listen")
    paths = {"path": http.path, "sse_path": http.sse_path, "messages_path": http.messages_path}
    for name, value in paths.items():
        if not value.startswith("/"):
            problems.append(f"http.{name}: must start with /")
    if len(set(paths.values())) < len(paths):
        problems.append("http: path, sse_path and messages_path must differ")
    for index, token in enumerate(http.auth_tokens):
        if len(token) < 16:
            problems.append(f"http.auth_tokens[{index}]: too short; use at least 16 random characters")
    return problems


# --- value ranges -------------------------------------------------------------------------
#
# Every number in the configuration has a range, checked at load with its key path. A
# float is always finite (TOML allows nan and inf, and a nan deadline either never fires
# or breaks the timer); zero is allowed only where it means something ("do not wait");
# the upper bounds are far beyond any sensible value and catch unit mistakes
# (milliseconds written as seconds, a size in bits) before they disable a limit.

_DAY = 86_400.0
_GIB = 1 << 30


@attrs.frozen
class Range:
    """The valid values of one numeric key: ``low <= value <= high``."""

    low: float
    high: float
    unit: str = ""  # "seconds", "bytes", ... for the message

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (None if it is fine)."""
        finite = not isinstance(value, float) or math.isfinite(value)
        if finite and self.low <= value <= self.high:
            return None
        what = f"a finite number of {self.unit}" if isinstance(self.low, float) else "an integer"
        if not isinstance(self.low, float) and self.unit:
            what += f" ({self.unit})"
        return f"must be {what} from {_number(self.low)} to {_number(self.high)}, got {value!r}"


def _number(value: float) -> str:
    """1073741824 rather than 1.07374e+09; 0.001 rather than 0.0010."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_MS = 0.001  # the shortest deadline accepted where zero makes no sense
RANGES: dict[type, dict[str, Range]] = {
    ProxyConfig: {
        "startup_timeout": Range(0.0, _DAY, "seconds"),  # 0: do not wait for slow servers
        "page_size": Range(1, 100_000, "items"),
        "max_message_bytes": Range(1024, _GIB, "bytes"),
        "restart_backoff_initial": Range(_MS, 3600.0, "seconds"),
        "restart_backoff_max": Range(_MS, _DAY, "seconds"),
        "list_changed_debounce": Range(0.0, 60.0, "seconds"),  # 0: announce at once
        "max_in_flight_per_session": Range(1, 1_000_000, "requests"),
        "drain_timeout": Range(0.0, _DAY, "seconds"),  # 0: stop at once
        "max_name_length": Range(16, 128, "characters"),
        "max_json_depth": Range(16, MAX_DEPTH_LIMIT, "levels"),
        "client_buffer_bytes": Range(1024, _GIB, "bytes"),
        "total_client_buffer_bytes": Range(1024, _GIB, "bytes"),
        "client_write_timeout": Range(_MS, _DAY, "seconds"),
        "server_buffer_bytes": Range(1024, _GIB, "bytes"),
        "server_write_timeout": Range(_MS, _DAY, "seconds"),
    },
    HttpConfig: {
        "max_body_bytes": Range(1024, _GIB, "bytes"),
        "max_header_bytes": Range(1024, 1 << 20, "bytes"),
        "header_timeout": Range(_MS, _DAY, "seconds"),
        "body_timeout": Range(_MS, _DAY, "seconds"),
        "keepalive_timeout": Range(_MS, _DAY, "seconds"),
        "max_connections": Range(1, 1_000_000, "connections"),
        "max_sessions": Range(1, 1_000_000, "sessions"),
        "session_idle_timeout": Range(_MS, 30 * _DAY, "seconds"),
        "stream_drop_grace": Range(0.0, _DAY, "seconds"),  # 0: cancel at once
        "max_stream_buffer_bytes": Range(1024, _GIB, "bytes"),
        "write_timeout": Range(_MS, _DAY, "seconds"),
    },
    ServerConfig: {
        "init_timeout": Range(_MS, _DAY, "seconds"),
        "request_timeout": Range(_MS, 7 * _DAY, "seconds"),
        "max_request_timeout": Range(_MS, 7 * _DAY, "seconds"),
    },
}


def _in_range(value: Any, *keys: str) -> bool:
    """Whether these keys are all in range (a check that compares them is meaningful)."""
    ranges = RANGES[type(value)]
    return all(ranges[key].problem(getattr(value, key)) is None for key in keys)


def check_ranges(value: Any, path: str) -> list[str]:
    """Problems with the numbers of one structured table (``proxy``, ``http``, a server).

    Keys listed in RANGES get their range; any other float must still be finite, so that a
    key added without a range cannot take nan or inf.
    """
    ranges = RANGES.get(type(value), {})
    problems = []
    for field in attrs.fields(type(value)):
        number = getattr(value, field.name)
        if isinstance(number, bool) or not isinstance(number, int | float):
            continue
        if field.name in ranges:
            problem = ranges[field.name].problem(number)
        elif isinstance(number, float) and not math.isfinite(number):
            problem = f"must be a finite number, got {number!r}"
        else:
            problem = None
        if problem:
            problems.append(f"{path}.{field.name}: {problem}")
    return problems


def _check_proxy(proxy: ProxyConfig) -> list[str]:
    problems = []
    if not proxy.separator or not NAME_CHARS.fullmatch(proxy.separator):
        problems.append(
            "proxy.separator: must be one or more of A-Z a-z 0-9 _ . - "
            f"(got {proxy.separator!r})"
        )
    if _in_range(proxy, "restart_backoff_initial", "restart_backoff_max") and (
            proxy.restart_backoff_max < proxy.restart_backoff_initial):
        problems.append(f"proxy.restart_backoff_max: must be at least restart_backoff_initial"
                        f" ({_number(proxy.restart_backoff_initial)}), got {_number(proxy.restart_backoff_max)}")
    for index, name in enumerate(proxy.server_requests):
        if name not in ("sampling", "elicitation", "roots"):
            problems.append(f"proxy.server_requests[{index}]: expected sampling, elicitation or roots, got {name!r}")
    for index, uri in enumerate(proxy.roots or ()):
        if ":" not in uri:
            problems.append(f"proxy.roots[{index}]: expected a URI such as file:///home/me/project")
    if proxy.name_charset == "llm" and "." in proxy.separator:
        problems.append("proxy.separator: the llm name charset has no '.'")
    return problems


def _check_server(server: ServerConfig, path: str) -> list[str]:
    problems = []
    transport = server.effective_transport
    if server.command is None and server.url is None:
        problems.append(f"{path}: needs either `command` (stdio) or `url` (HTTP)")
    elif server.command is not None and server.url is not None:
        problems.append(f"{path}: give `command` or `url`, not both")
    elif transport == "stdio" and server.command is None:
        problems.append(f"{path}.transport: stdio needs `command`")
    elif transport != "stdio" and server.url is None:
        problems.append(f"{path}.transport: {transport} needs `url`")
    if server.url is not None:
        scheme = server.url.split(":", 1)[0].lower()
        allowed = ("ws", "wss") if transport == "websocket" else ("http", "https")
        if scheme not in allowed:
            problems.append(f"{path}.url: a {transport} server needs a {' or '.join(allowed)} URL, got {server.url!r}")
    if server.command is not None and not server.command.strip():
        problems.append(f"{path}.command: must not be empty")
    if CHAIN_VARIABLE in server.env:
        problems.append(f"{path}.env.{CHAIN_VARIABLE}: set by the aggregator itself for every server it starts"
                        " (its guard against serving itself); a config cannot set it")
    if _in_range(server, "request_timeout", "max_request_timeout") and (
            server.max_request_timeout < server.request_timeout):
        problems.append(f"{path}.max_request_timeout: must be at least request_timeout"
                        f" ({_number(server.request_timeout)}), got {_number(server.max_request_timeout)}")
    for index, name in enumerate(server.server_requests or ()):
        if name not in ("sampling", "elicitation", "roots"):
            problems.append(f"{path}.server_requests[{index}]: expected sampling, elicitation or roots, got {name!r}")
    for kind in ("tools", "prompts"):
        for original, override in getattr(server, kind).rename.items():
            if override.name is not None and not NAME_CHARS.fullmatch(override.name):
                problems.append(f"{path}.{kind}.rename.{original}.name: may only contain A-Z a-z 0-9 _ . -")
    return problems


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Config:
    """Read aggregator.toml, or an mcpServers / VS Code `servers` JSON file."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror or exc}") from None
    if file.suffix.lower() == ".json":
        raw = mcp_servers_json_to_raw(data, source=str(file))
    else:
        try:
            raw = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid TOML: {exc}", source=str(file)) from None
    return structure_config(raw, environ=environ, source=str(file))


# --- mcpServers JSON (Claude Desktop, Cursor, Windsurf) and VS Code `servers` ---------------

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
_JSON_IGNORED = {"alwaysAllow", "autoApprove", "timeout", "description", "envFile", "dev",
                 "gallery", "version", "name", "icon", "trust", "includeTools", "excludeTools"}


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
            problems.append(f"{path}.{key}: expected a string, got {_describe(table[key])}")
    args = table.get("args", [])
    if not isinstance(args, list):
        problems.append(f"{path}.args: expected a list of strings, got {_describe(args)}")
    else:
        problems.extend(f"{path}.args[{index}]: expected a string, got {_describe(item)}"
                        for index, item in enumerate(args) if not isinstance(item, str))
    for key in ("env", "headers"):
        value = table.get(key, {})
        if not isinstance(value, dict):
            problems.append(f"{path}.{key}: expected an object of strings, got {_describe(value)}")
        else:
            problems.extend(f"{path}.{key}.{name}: expected a string, got {_describe(item)}"
                            for name, item in value.items() if not isinstance(item, str))
    return problems


def raw_to_toml(raw: Mapping[str, Any]) -> str:
    """Write the raw config form as TOML (strings, numbers, booleans, lists, tables)."""
    lines: list[str] = []
    for name, table in raw.get("servers", {}).items():
        lines.append(f"[servers.{_toml_key(name)}]")
        nested = []
        for key, value in table.items():
            if isinstance(value, dict):
                nested.append((key, value))
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        for key, value in nested:
            inline = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inline} }}")
        lines.append("")
    return "\n".join(lines)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")

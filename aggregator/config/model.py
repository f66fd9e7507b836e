"""The configuration's model: frozen attrs classes, one per table, with their defaults.

What each key means is said next to it. Structuring (``structuring``), the checks of
values (``ranges``, ``validation``) and loading (``loading``) live beside this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from aggregator.config.masking import SECRET
from aggregator.config.upstream_auth import CredentialsConfig, UpstreamAuth, UpstreamOAuthConfig
from aggregator.core import defaults
from aggregator.jsonrpc.codec import DEFAULT_MAX_DEPTH

Transport = Literal["stdio", "streamable-http", "sse", "websocket"]
Start = Literal["eager", "lazy"]


class Duration(float):
    """Seconds, given as a number or as a string with a unit: "500ms", "30s", "10m", "2h",
    "1d"; "0" or "off": never (``structuring`` reads it)."""


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
class DiscoveryConfig:
    """How clients find tools, and how much of a tool's result they get (``core.catalogs.discovery``,
    ``core.catalogs.result_budget``). In [proxy.discovery] for every profile; a profile's
    [profiles.NAME.discovery] overrides what it gives. None: not given here."""

    # "all": every tool in tools/list; "search": find_tools and call_tool only; "auto":
    # "all" while the whole list fits in budget_tokens (estimated), else "search".
    mode: str | None = None
    budget_tokens: int | None = None  # default 8000
    # A tool result larger than this (estimated tokens) is cut: the client gets its first
    # part and a resource_link to the rest, readable by that caller alone. 0: never cut.
    max_result_tokens: int | None = None  # default 0
    keep_results_for: float | None = None  # seconds the rest stays readable; default 600


@attrs.frozen(kw_only=True)
class ProfileConfig:
    """A named policy: what the clients that use it see, on top of the server rules."""

    name: str = ""
    tokens: tuple[str, ...] = attrs.field(default=(), metadata=SECRET)  # HTTP bearer tokens that select this profile
    # An OAuth access token ([auth]) selects this profile when its claims match: each key
    # a claim, each value the list of which the claim must hold one (a claim that is a list
    # must share one); ``scopes``: the scopes the token must all carry. The first profile
    # (in the file's order) whose ``match`` or ``scopes`` is given and holds wins; a token
    # no profile matches gets the default profile.
    match: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    scopes: tuple[str, ...] = ()
    tools: KindPolicy = attrs.field(factory=KindPolicy)
    prompts: KindPolicy = attrs.field(factory=KindPolicy)
    resources: KindPolicy = attrs.field(factory=KindPolicy)
    templates: KindPolicy = attrs.field(factory=KindPolicy)
    servers: Mapping[str, RuleSet] = attrs.field(factory=dict)
    discovery: DiscoveryConfig = attrs.field(factory=DiscoveryConfig)


@attrs.frozen(kw_only=True)
class ServerConfig:
    name: str = ""  # filled from the [servers.NAME] key
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict, metadata=SECRET)
    # A file of KEY=VALUE lines read at load into ``env`` (``env`` wins); relative: to the
    # config file's directory. After loading ``env`` holds its values.
    env_file: str | None = None
    # Variables of the proxy's environment this server also gets (names, or a prefix and
    # *: "AWS_*"), beyond those every server gets. After loading it holds proxy.env_passthrough too.
    env_passthrough: tuple[str, ...] = ()
    # The directory it runs in; relative: to the config file's directory (the default).
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, metadata=SECRET)
    # How it is authenticated: "static" (``headers``, the same for every client),
    # "token-exchange" or "oauth" (each user's own token; ``config.upstream_auth``).
    auth: UpstreamAuth = "static"
    oauth: UpstreamOAuthConfig = attrs.field(factory=UpstreamOAuthConfig)
    transport: Transport | None = None
    prefix: str | None = None  # None: the server's key; "": no prefix
    uri_prefix: str | None = None  # None: derived from the prefix; "": URIs unchanged
    enabled: bool = True
    # "shared": one connection for all clients; "per-session": each client session gets
    # its own (its own process, for stdio), started on first use, stopped with the session.
    isolation: Literal["shared", "per-session"] = "shared"
    init_timeout: float = defaults.INIT_TIMEOUT
    # Which protocol era to speak to it: "auto" finds out (``server/discover`` first, then
    # ``initialize``); a legacy revision pins ``initialize`` proposing it; a modern revision
    # pins the stateless protocol without falling back.
    protocol: str = "auto"
    # How long the ``server/discover`` probe of "auto" waits before taking the server for legacy.
    discover_timeout: float = defaults.DISCOVER_TIMEOUT
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
    # "eager": started with the proxy; "lazy": its catalog comes from the cache of its last
    # listing and it starts on the first request that needs it. None: proxy.start.
    start: Start | None = None
    # A shared server nobody used for this long is stopped (the next request starts it
    # again); 0: never. None: proxy.idle_stop_after.
    idle_stop_after: Duration | None = None
    # What ${VAR} interpolation put into this server's keys (secrets to mask; set by loading,
    # never by the config itself).
    interpolated: tuple[str, ...] = attrs.field(default=(), repr=False)

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
    discovery: DiscoveryConfig = attrs.field(factory=DiscoveryConfig)  # every profile's defaults
    # How long the first client's `initialize` waits for every server to be ready.
    startup_timeout: float = 10.0
    # /readyz says ready once this many enabled servers are ready; None: all of them.
    min_ready: int | None = None
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
    # Variables of the proxy's environment every stdio server gets, beyond the defaults
    # (names, or a prefix and *: "AWS_*").
    env_passthrough: tuple[str, ...] = ()
    # Several list changes within this many seconds reach clients as one notification.
    list_changed_debounce: float = defaults.LIST_CHANGED_DEBOUNCE
    # Requests one client session may have in flight; more are refused (reason overloaded).
    max_in_flight_per_session: int = defaults.MAX_IN_FLIGHT_PER_SESSION
    # A legacy server's call that asked a modern client for input waits this long for the
    # client's retry; then the call is cancelled upstream.
    input_required_timeout: float = defaults.INPUT_REQUIRED_TIMEOUT
    # How many such calls may wait at once, in all and per principal (bearer token); past
    # either, the server's request is refused and the call fails (reason overloaded).
    max_parked_calls: int = defaults.MAX_PARKED_CALLS
    max_parked_per_principal: int = defaults.MAX_PARKED_PER_PRINCIPAL
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
    # Every server's default: "eager" starts it with the proxy, "lazy" on first use (its
    # catalog from the cache of its last listing, kept in cache_dir).
    start: Start = "eager"
    # Every shared server's default: stopped after nobody used it this long; 0: never.
    idle_stop_after: Duration = Duration(0.0)
    # Where each server's last listing is kept (one file per server and configuration);
    # None: $XDG_CACHE_HOME/mcp-aggregator/listings (~/.cache/... without it). Relative:
    # to the config file's directory.
    cache_dir: str | None = None


LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# The admin paths: read on both listeners; POST /reload on the admin listener only.
ADMIN_READ_PATHS = ("/healthz", "/readyz", "/status", "/status.json", "/metrics")
ADMIN_PATHS = (*ADMIN_READ_PATHS, "/reload")


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
    # The admin endpoint (health, readiness, status, metrics, reload) on its own listener;
    # health, readiness, status and metrics are also served on http.listen.
    admin_listen: str | None = None
    # The bearer token the admin paths require, on both listeners, instead of auth_tokens.
    admin_token: str | None = attrs.field(default=None, metadata=SECRET)
    # Host header names accepted (any port); DNS rebinding defence. Add your own names
    # when you listen beyond loopback.
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS
    # Origin header values accepted, as scheme://host (any port). Requests without Origin
    # (not from a browser) are accepted.
    allowed_origins: tuple[str, ...] = tuple(
        f"{scheme}://{host}" for scheme in ("http", "https") for host in LOCAL_HOSTS
    )
    # Bearer tokens that may use the endpoint; empty: no authentication.
    auth_tokens: tuple[str, ...] = attrs.field(default=(), metadata=SECRET)
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
    # Modern (2026-07-28) requests served without a session, in flight at once: in all,
    # and per bearer token. Past either, 503 with Retry-After.
    max_stateless_requests: int = 256
    max_stateless_per_principal: int = 64
    session_idle_timeout: float = 1800.0
    # A client whose response stream drops has that request cancelled after this long,
    # unless it resumes the stream (GET with Last-Event-ID) first.
    stream_drop_grace: float = 2.0
    # Older names of proxy.client_buffer_bytes and proxy.client_write_timeout (accepted;
    # the proxy keys win when both are given). After loading they hold the proxy values.
    max_stream_buffer_bytes: int = 16 * 1024 * 1024
    write_timeout: float = 30.0


@attrs.frozen(kw_only=True)
class IssuerConfig:
    """An authorization server whose access tokens the proxy accepts ([[auth.issuers]])."""

    issuer: str = ""  # its issuer identifier (a token's ``iss``), an https URL
    # Its signing keys (JWKS); None: found in its metadata (RFC 8414, then OpenID Connect).
    jwks_uri: str | None = None
    # The JWS algorithms its tokens may be signed with: asymmetric ones only.
    algorithms: tuple[str, ...] = ("RS256", "ES256", "PS256", "EdDSA")
    # Token introspection (RFC 7662), for tokens that are no JWT; the client's credentials
    # are best given as ${VAR}.
    introspection_endpoint: str | None = None
    client_id: str | None = None
    client_secret: str | None = attrs.field(default=None, repr=False, metadata=SECRET)  # never in a log line


@attrs.frozen(kw_only=True)
class AuthConfig:
    """The proxy as an OAuth 2.1 resource server (``fronts.authorization``); off while
    ``resource`` is empty. Static tokens (http.auth_tokens, profiles' tokens) work beside it."""

    # This endpoint's canonical URI (RFC 8707): the audience every token must carry, and
    # where its metadata (RFC 9728) is said to be.
    resource: str = ""
    issuers: tuple[IssuerConfig, ...] = ()
    scopes_supported: tuple[str, ...] = ()  # told in the metadata
    required_scopes: tuple[str, ...] = ()  # every token must carry all of them (else 403)
    # Without http.admin_token, an access token opens the admin paths (not /healthz and
    # /readyz) only with all of these (else 403); empty: any accepted token does.
    admin_scopes: tuple[str, ...] = ("aggregator:admin",)
    leeway: float = 30.0  # seconds of clock skew allowed on exp and nbf
    # Signing keys are fetched again after this long, and on a token signed with a key
    # not known, at most once per jwks_refresh_interval (a flood of made-up key ids
    # cannot make the proxy fetch in a loop).
    jwks_cache_seconds: float = 600.0
    jwks_refresh_interval: float = 30.0
    fetch_timeout: float = 5.0  # a key set, metadata or introspection answer, in all
    # How long an introspection answer is trusted (never past the token's exp).
    introspection_cache_seconds: float = 60.0

    @property
    def enabled(self) -> bool:
        return bool(self.resource)


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """Several replicas of the proxy behind one balancer ([cluster], ``aggregator.cluster``).
    Without it, the proxy runs alone as it always did."""

    # Shared secrets (at least 32 characters each, best given as ${VAR}), the same on every
    # replica: the FIRST seals session ids and signs request states and cursors, every one
    # verifies (rotation: add the new key first, keep the old one for as long as what it
    # signed should last, then remove it). Empty: keys made for this process alone, and
    # session ids that are random, as without [cluster].
    keys: tuple[str, ...] = attrs.field(default=(), repr=False, metadata=SECRET)  # never in a log line
    # This replica's short name (A-Z a-z 0-9 _ -), in the ids it mints where a message must
    # find its way back to it (a parked call's requestState). None: host name and process id.
    replica: str | None = None
    # The shared store: "redis://[:password@]host:port/db" (or "unix:///path?db=N"); None:
    # the embedded in-memory store of this process. Best given as ${VAR} when it holds a
    # password, which is never shown (repr, logs and status show the URL masked).
    store: str | None = attrs.field(default=None, repr=False, metadata=SECRET)
    prefix: str = "aggregator"  # every key and channel of the store is named "<prefix>:..."
    # A sealed session id older than this (from when it was issued) is not adopted by a
    # replica that does not hold its session (after a restart, behind a balancer). A session
    # its replica holds goes on while in use (http.session_idle_timeout ends it).
    session_lifetime: float = 86_400.0

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


@attrs.frozen(kw_only=True)
class PluginConfig:
    """One plugin: what to load (an entry point name, package.module:Name, or
    file.py:Name) and the keyword arguments to build it with."""

    use: str
    options: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RegistryConfig:
    """Where ``aggregator search`` and ``aggregator add`` look for servers: an MCP registry's
    base URL (https, or http on a loopback address), a ``file://`` URL or a directory of
    server.json files. None: the official registry. The serving proxy never reads it."""

    url: str | None = None


@attrs.frozen(kw_only=True)
class Config:
    proxy: ProxyConfig = attrs.field(factory=ProxyConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    auth: AuthConfig = attrs.field(factory=AuthConfig)
    policy: RuleSet = attrs.field(factory=RuleSet)  # for every client and server
    profiles: Mapping[str, ProfileConfig] = attrs.field(factory=dict)
    plugins: tuple[PluginConfig, ...] = ()
    servers: Mapping[str, ServerConfig] = attrs.field(factory=dict)
    credentials: CredentialsConfig = attrs.field(factory=CredentialsConfig)  # users' tokens for servers
    cluster: ClusterConfig = attrs.field(factory=ClusterConfig)  # replicas: keys, the shared store
    registry: RegistryConfig = attrs.field(factory=RegistryConfig)  # for search and add only
    directory: str | None = None  # where the config file is (relative paths are resolved there)

    @property
    def enabled_servers(self) -> list[ServerConfig]:
        return [server for server in self.servers.values() if server.enabled]

    def starts_lazily(self, server: ServerConfig) -> bool:
        """Whether ``server`` starts on first use (its own ``start``, else the proxy's)."""
        return (server.start or self.proxy.start) == "lazy"

    def idle_stop_after(self, server: ServerConfig) -> float:
        """Seconds after which ``server``, unused, is stopped (0: never); per-session
        servers never are (each session's own connection stops with its session)."""
        if server.isolation == "per-session":
            return 0.0
        after = server.idle_stop_after
        return float(self.proxy.idle_stop_after if after is None else after)

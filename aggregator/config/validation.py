"""Checks of what structuring cannot see: values that must agree with each other, listen
addresses and paths, names, and the server-to-client requests a config may name.

Each check returns its problems as ``key.path: message`` lines; it raises nothing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from aggregator.config.model import (
    AuthConfig,
    ClusterConfig,
    DiscoveryConfig,
    HttpConfig,
    ProfileConfig,
    ProxyConfig,
    ServerConfig,
)
from aggregator.config.ranges import Range, in_range, number_text
from aggregator.config.store_url import RedisAddress
from aggregator.core.catalogs.naming import NAME_CHARS
from aggregator.core.catalogs.nesting import CHAIN_VARIABLE
from aggregator.core.settings import MODES
from aggregator.mcp.constants import SERVER_REQUEST_CAPABILITIES
from aggregator.mcp.versions import ALL_VERSIONS, MODERN

# "sampling, elicitation or roots", as the messages name them.
_SERVER_REQUEST_NAMES = ", ".join(SERVER_REQUEST_CAPABILITIES[:-1]) + " or " + SERVER_REQUEST_CAPABILITIES[-1]


# RFC 9110: a field name is a token; a field value is visible ASCII with spaces and tabs
# inside (what the HTTP client sends; it refuses the rest when it connects).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")


def header_problem(value: str) -> str | None:
    """What is wrong with a header value, never quoting it (it may be a secret); None if nothing."""
    if _HEADER_VALUE.fullmatch(value):
        return None
    if "\n" in value or "\r" in value:
        return "contains a line break (a trailing newline in the environment variable?)"
    if "\0" in value:
        return "contains a NUL character"
    if any(ord(char) < 32 and char != "\t" or ord(char) == 127 for char in value):
        return "contains a control character"
    if not value.isascii():
        return "contains a character outside ASCII (HTTP sends header values as ASCII)"
    return "begins or ends with whitespace"


def url_problem(url: str, transport: str) -> str | None:
    """What is wrong with a server's URL (after ``${VAR}`` interpolation), quoting only its
    scheme (the rest may hold a secret); None if nothing. The HTTP and WebSocket clients
    refuse whitespace and control characters in a URL only when they connect."""
    allowed = ("ws", "wss") if transport == "websocket" else ("http", "https")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in allowed:
        shown = f"a {scheme!r} URL" if scheme.isascii() and scheme.isalnum() else "something else"
        return f"a {transport} server needs an absolute {' or '.join(allowed)} URL, got {shown}"
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        return (
            "contains whitespace or a control character (a trailing newline in an environment variable?);"
            " percent-encode the variable's value (a space is %20); the URL is not shown, as it may hold a secret"
        )
    if not url.isascii():  # no client of ours sends one: say so at load, not at every connection
        return (
            "contains a character outside ASCII; percent-encode it (é is %C3%A9; a host's xn-- form), or the"
            " variable's value if it comes from one; the URL is not shown, as it may hold a secret"
        )
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return "cannot be parsed as a URL (a bad port or [IPv6] address?); it is not shown, as it may hold a secret"
    if not host:
        return f"needs a host ({scheme}://host[:port]/path); the URL is not shown, as it may hold a secret"
    return None


def token_problem(token: str) -> str | None:
    """What is wrong with a bearer token, never quoting it; None if nothing. A client sends
    it in a header, which cannot carry whitespace at its ends nor control characters."""
    if "\n" in token or "\r" in token:
        return "contains a line break (a trailing newline in the environment variable?)"
    if any(ord(char) < 33 or ord(char) == 127 for char in token):
        return "contains whitespace or a control character"
    if not token.isascii():
        return "contains a character outside ASCII"
    if len(token) < 16:
        return "too short; use at least 16 random characters"
    return None


def token_problems(tokens: tuple[str, ...], path: str) -> list[str]:
    """One problem per bad token of a list, by its index (the token is not shown)."""
    return [
        f"{path}[{index}]: {problem}" + ("" if problem.startswith("too short") else "; it is not shown")
        for index, token in enumerate(tokens)
        if (problem := token_problem(token)) is not None
    ]


def _allowlist_problems(http: HttpConfig) -> list[str]:
    """allowed_hosts and allowed_origins are exact names: a pattern there would match nothing."""
    problems = []
    for key, example in (("allowed_hosts", '"example.com"'), ("allowed_origins", '"https://example.com"')):
        for index, entry in enumerate(getattr(http, key)):
            host = entry.partition("://")[2] if "://" in entry else entry
            if "*" in entry or "?" in entry or ("[" in host and not host.startswith("[")):
                problems.append(
                    f"http.{key}[{index}]: {entry!r} is a pattern, but these are exact host names"
                    f" (with or without a port; any port matches); list each name clients use, e.g. {example}"
                )
            elif not host.strip() or any(char.isspace() for char in entry):
                problems.append(f"http.{key}[{index}]: expected a host name such as {example}, got {entry!r}")
            elif key == "allowed_origins" and "://" not in entry:
                problems.append(f"http.{key}[{index}]: expected scheme://host such as {example}, got {entry!r}")
    return problems


def parse_listen(listen: str) -> tuple[str, int]:
    """ "127.0.0.1:8000", "[::1]:8000" or "8000" (loopback) -> (host, port)."""
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
    for name in ("listen", "websocket_listen", "admin_listen"):
        value = getattr(http, name)
        if value is not None:
            try:
                parse_listen(value)
            except ValueError as exc:
                problems.append(f"http.{name}: {exc}")
    if (
        http.listen is not None
        and http.websocket_listen is not None
        and same_listener(http.listen, http.websocket_listen)
    ):
        problems.append("http.websocket_listen: must be another port than http.listen")
    for other in ("listen", "websocket_listen"):
        address = getattr(http, other)
        if http.admin_listen is not None and address is not None and same_listener(http.admin_listen, address):
            problems.append(f"http.admin_listen: must be another port than http.{other}")
    paths = {"path": http.path, "sse_path": http.sse_path, "messages_path": http.messages_path}
    for name, value in paths.items():
        if not value.startswith("/"):
            problems.append(f"http.{name}: must start with /")
    if len(set(paths.values())) < len(paths):
        problems.append("http: path, sse_path and messages_path must differ")
    problems += token_problems(http.auth_tokens, "http.auth_tokens")
    if http.admin_token is not None and (problem := token_problem(http.admin_token)) is not None:
        problems.append(
            f"http.admin_token: {problem}" + ("" if problem.startswith("too short") else "; it is not shown")
        )
    problems += _allowlist_problems(http)
    return problems


_PASSTHROUGH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?|[A-Za-z_]*\*")


def passthrough_problems(names: tuple[str, ...], path: str) -> list[str]:
    """env_passthrough entries are variable names, or a prefix and * ("AWS_*")."""
    problems = []
    for index, name in enumerate(names):
        if name == "*":
            problems.append(
                f"{path}[{index}]: the whole environment is never passed (it holds secrets); name the variables"
            )
        elif not _PASSTHROUGH.fullmatch(name):
            problems.append(f'{path}[{index}]: expected a variable name or a prefix and * ("AWS_*"), got {name!r}')
    return problems


def check_proxy(proxy: ProxyConfig) -> list[str]:
    problems = passthrough_problems(proxy.env_passthrough, "proxy.env_passthrough")
    if not proxy.separator or not NAME_CHARS.fullmatch(proxy.separator):
        problems.append(f"proxy.separator: must be one or more of A-Z a-z 0-9 _ . - (got {proxy.separator!r})")
    if in_range(proxy, "restart_backoff_initial", "restart_backoff_max") and (
        proxy.restart_backoff_max < proxy.restart_backoff_initial
    ):
        problems.append(
            f"proxy.restart_backoff_max: must be at least restart_backoff_initial"
            f" ({number_text(proxy.restart_backoff_initial)}),"
            f" got {number_text(proxy.restart_backoff_max)}"
        )
    for index, name in enumerate(proxy.server_requests):
        if name not in SERVER_REQUEST_CAPABILITIES:
            problems.append(f"proxy.server_requests[{index}]: expected {_SERVER_REQUEST_NAMES}, got {name!r}")
    for index, uri in enumerate(proxy.roots or ()):
        if ":" not in uri:
            problems.append(f"proxy.roots[{index}]: expected a URI such as file:///home/me/project")
    if proxy.name_charset == "llm" and "." in proxy.separator:
        problems.append("proxy.separator: the llm name charset has no '.'")
    return problems


MIN_RESULT_TOKENS = 500


def check_discovery(discovery: DiscoveryConfig, path: str) -> list[str]:
    """A [proxy.discovery] or [profiles.NAME.discovery] table's numbers."""
    checks = (
        ("budget_tokens", Range(100, 100_000_000, "tokens")),
        ("max_result_tokens", Range(0, 100_000_000, "tokens")),
        ("keep_results_for", Range(1.0, 86_400.0, "seconds")),
    )
    problems = []
    if discovery.mode is not None and discovery.mode not in MODES:
        problems.append(f"{path}.mode: expected one of {', '.join(MODES)}, got {discovery.mode!r}")
    for key, valid in checks:
        value = getattr(discovery, key)
        problem = valid.problem(value) if value is not None else None
        if key == "max_result_tokens" and type(value) is int and (value < 0 or 0 < value < MIN_RESULT_TOKENS):
            problem = (
                f"must be 0 (never cut) or at least {MIN_RESULT_TOKENS} (the note and link take ~120), got {value!r}"
            )
        if problem:
            problems.append(f"{path}.{key}: {problem}")
    return problems


def _environment_problems(server: ServerConfig, path: str) -> list[str]:
    """A server's ``env`` and ``env_passthrough``."""
    problems = passthrough_problems(server.env_passthrough, f"{path}.env_passthrough")
    if server.env_passthrough and server.effective_transport != "stdio":
        problems.append(f"{path}.env_passthrough: only a stdio server (a `command`) has an environment to pass")
    for name, value in server.env.items():
        if not name or "=" in name or "\0" in name:
            problems.append(f"{path}.env.{name!r}: not a valid environment variable name (not empty, without = or NUL)")
        elif "\0" in value:
            problems.append(
                f"{path}.env.{name}: the value contains a NUL character; it is not shown, as it may be a secret"
            )
    if CHAIN_VARIABLE in server.env:
        problems.append(
            f"{path}.env.{CHAIN_VARIABLE}: set by the aggregator itself for every server it starts"
            " (its guard against serving itself); a config cannot set it"
        )
    return problems


def check_server(server: ServerConfig, path: str) -> list[str]:
    problems = _environment_problems(server, path)
    transport = server.effective_transport
    if server.command is None and server.url is None:
        problems.append(f"{path}: needs either `command` (stdio) or `url` (HTTP)")
    elif server.command is not None and server.url is not None:
        problems.append(f"{path}: give `command` or `url`, not both")
    elif transport == "stdio" and server.command is None:
        problems.append(f"{path}.transport: stdio needs `command`")
    elif transport != "stdio" and server.url is None:
        problems.append(f"{path}.transport: {transport} needs `url`")
    if server.url is not None and (problem := url_problem(server.url, transport)) is not None:
        problems.append(f"{path}.url: {problem}")
    for header, value in server.headers.items():
        if not _HEADER_NAME.fullmatch(header):
            problems.append(f"{path}.headers.{header}: not a valid header name (letters, digits and !#$%&'*+-.^_`|~)")
        elif (problem := header_problem(value)) is not None:
            problems.append(f"{path}.headers.{header}: the value {problem}; it is not shown, as it may be a secret")
    if server.command is not None and not server.command.strip():
        problems.append(f"{path}.command: must not be empty")
    elif server.command is not None and "\0" in server.command:
        problems.append(f"{path}.command: contains a NUL character")
    for index, arg in enumerate(server.args):
        if "\0" in arg:
            problems.append(f"{path}.args[{index}]: contains a NUL character; it is not shown, as it may be a secret")
    if server.cwd is not None and "\0" in server.cwd:
        problems.append(f"{path}.cwd: contains a NUL character")
    if in_range(server, "request_timeout", "max_request_timeout") and (
        server.max_request_timeout < server.request_timeout
    ):
        problems.append(
            f"{path}.max_request_timeout: must be at least request_timeout"
            f" ({number_text(server.request_timeout)}), got {number_text(server.max_request_timeout)}"
        )
    if server.protocol != "auto" and server.protocol not in ALL_VERSIONS:
        problems.append(
            f'{path}.protocol: expected "auto" or one of {", ".join(ALL_VERSIONS)}, got {server.protocol!r}'
        )
    elif server.protocol in MODERN and transport in ("sse", "websocket"):
        problems.append(f"{path}.protocol: {server.protocol} has no {transport} transport (stdio or streamable-http)")
    for index, name in enumerate(server.server_requests or ()):
        if name not in SERVER_REQUEST_CAPABILITIES:
            problems.append(f"{path}.server_requests[{index}]: expected {_SERVER_REQUEST_NAMES}, got {name!r}")
    for kind in ("tools", "prompts"):
        for original, override in getattr(server, kind).rename.items():
            if override.name is not None and not NAME_CHARS.fullmatch(override.name):
                problems.append(f"{path}.{kind}.rename.{original}.name: may only contain A-Z a-z 0-9 _ . -")
    return problems


# The JWS algorithms a token may be signed with (RFC 7518, RFC 8037): asymmetric only, so
# that a public key can never be used as an HMAC secret, and never "none".
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


def oauth_url_problem(url: str, *, resource: bool = False) -> str | None:
    """What is wrong with an authorization server's or this resource's URL; None if nothing.
    https, or http to a loopback host (a test's, a sidecar's); no fragment (RFC 8414, RFC 8707)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port
    except ValueError:
        return f"cannot be parsed as a URL: {url[:100]!r}"
    if parts.scheme not in ("http", "https") or not host:
        return f"expected an absolute https URL, got {url[:100]!r}"
    if parts.scheme == "http" and not is_loopback(host):
        return f"must be https (http only to a loopback host), got {url[:100]!r}"
    if parts.fragment or url.endswith("#"):
        return f"must not have a fragment, got {url[:100]!r}"
    if resource and parts.query:
        return f"must not have a query, got {url[:100]!r}"
    if any(char.isspace() or ord(char) < 32 for char in url):
        return "contains whitespace or a control character"
    return None


def is_loopback(host: str) -> bool:
    """Whether a URL's host names this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _scope_problems(scopes: tuple[str, ...], path: str) -> list[str]:
    """A scope is visible ASCII other than a quote or backslash (RFC 6749 section 3.3)."""
    return [
        f'{path}[{index}]: a scope is one or more visible ASCII characters other than " and \\, got {scope[:40]!r}'
        for index, scope in enumerate(scopes)
        if not scope or not all(33 <= ord(char) <= 126 and char not in '"\\' for char in scope)
    ]


MIN_CLUSTER_KEY = 32  # characters of a [cluster] key
_REPLICA = re.compile(r"[A-Za-z0-9_-]{1,64}")
_STORE_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def check_cluster(cluster: ClusterConfig) -> list[str]:
    """[cluster]: keys long enough and each given once (never quoted: they are secrets), a
    replica name fit for the ids it goes in, a store URL that reads (``config.store_url``)."""
    problems: list[str] = []
    seen: set[str] = set()
    for index, key in enumerate(cluster.keys):
        if len(key) < MIN_CLUSTER_KEY:
            problems.append(
                f"cluster.keys[{index}]: at least {MIN_CLUSTER_KEY} characters, got {len(key)};"
                " it is not shown, as it is a secret"
            )
        elif key in seen:
            problems.append(f"cluster.keys[{index}]: the same key as an earlier one (a secret: not shown)")
        seen.add(key)
    if cluster.replica is not None and not _REPLICA.fullmatch(cluster.replica):
        problems.append(f"cluster.replica: 1 to 64 of A-Z a-z 0-9 _ -, got {cluster.replica[:80]!r}")
    if cluster.store is not None:
        try:
            RedisAddress.parse(cluster.store)
        except ValueError as exc:  # its message shows the URL with the password masked
            problems.append(f"cluster.store: {exc}")
    if not _STORE_PREFIX.fullmatch(cluster.prefix):
        problems.append(f"cluster.prefix: 1 to 64 of A-Z a-z 0-9 _ . : -, got {cluster.prefix[:80]!r}")
    return problems


def check_auth(auth: AuthConfig, profiles: Mapping[str, ProfileConfig]) -> list[str]:
    """[auth] and the profiles' ``match`` and ``scopes``, which only an access token can satisfy."""
    problems: list[str] = []
    if not auth.enabled:
        if auth.issuers:
            problems.append("auth.resource: required with auth.issuers (this endpoint's canonical URI)")
        for name, profile in profiles.items():
            for key in ("match", "scopes"):
                if getattr(profile, key):
                    problems.append(f"profiles.{name}.{key}: chooses by an access token; needs [auth] (auth.resource)")
        return problems
    if (problem := oauth_url_problem(auth.resource, resource=True)) is not None:
        problems.append(f"auth.resource: {problem}")
    if not auth.issuers:
        problems.append("auth.issuers: at least one [[auth.issuers]] is needed")
    seen: set[str] = set()
    for index, issuer in enumerate(auth.issuers):
        path = f"auth.issuers[{index}]"
        if not issuer.issuer:
            problems.append(f"{path}.issuer: required")
        elif (problem := oauth_url_problem(issuer.issuer)) is not None:
            problems.append(f"{path}.issuer: {problem}")
        elif issuer.issuer in seen:
            problems.append(f"{path}.issuer: given twice")
        seen.add(issuer.issuer)
        for key in ("jwks_uri", "introspection_endpoint"):
            value = getattr(issuer, key)
            if value is not None and (problem := oauth_url_problem(value)) is not None:
                problems.append(f"{path}.{key}: {problem}")
        if not issuer.algorithms:
            problems.append(f"{path}.algorithms: at least one algorithm")
        for at, algorithm in enumerate(issuer.algorithms):
            if algorithm not in ASYMMETRIC_ALGORITHMS:
                why = (
                    " (never: it would accept unsigned tokens)"
                    if algorithm.lower() == "none"
                    else " (a shared secret, never used with a public key)"
                    if algorithm.upper().startswith("HS")
                    else ""
                )
                problems.append(
                    f"{path}.algorithms[{at}]: {algorithm[:20]!r} is not accepted{why};"
                    f" expected one of {', '.join(ASYMMETRIC_ALGORITHMS)}"
                )
        if (issuer.client_id is None) != (issuer.client_secret is None):
            problems.append(f"{path}: client_id and client_secret go together (introspection's credentials)")
        elif issuer.client_id is not None and issuer.introspection_endpoint is None:
            problems.append(f"{path}.introspection_endpoint: required with client_id and client_secret")
    problems += _scope_problems(auth.scopes_supported, "auth.scopes_supported")
    problems += _scope_problems(auth.required_scopes, "auth.required_scopes")
    problems += _scope_problems(auth.admin_scopes, "auth.admin_scopes")
    for name, profile in profiles.items():
        problems += _scope_problems(profile.scopes, f"profiles.{name}.scopes")
    return problems

"""Config: strict structuring with key paths, ${VAR}, and the clients' JSON formats."""

import json
import tomllib

import attrs
import pytest

from aggregator.config import load_config, mcp_servers_json_to_raw, raw_to_toml, structure_config
from aggregator.errors import ConfigError


def problems(raw, environ=None):
    with pytest.raises(ConfigError) as info:
        structure_config(raw, environ=environ or {})
    return info.value.problems


def test_valid_config():
    config = structure_config(
        tomllib.loads("""
[proxy]
separator = "."
page_size = 7
[servers.git]
command = "mcp-server-git"
args = ["--repository", "${REPO}"]
env = { TOKEN = "$${literal}" }
[servers.web]
url = "http://127.0.0.1:9/mcp"
enabled = false
"""),
        environ={"REPO": "/tmp/r"},
    )
    git = config.servers["git"]
    assert git.args == ("--repository", "/tmp/r") and git.env == {"TOKEN": "${literal}"}
    assert git.effective_transport == "stdio" and config.servers["web"].effective_transport == "streamable-http"
    assert [s.name for s in config.enabled_servers] == ["git"]
    assert config.proxy.separator == "." and config.proxy.page_size == 7


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"servers": {"git": {"command": "g", "args": ["a", "b", 3]}}}, "servers.git.args[2]: expected a string"),
        ({"servers": {"git": {"command": "g", "argz": []}}}, "servers.git.argz: unknown key; did you mean `args`?"),
        ({"servers": {"git": {"command": 5}}}, "servers.git.command: expected a string"),
        ({"servers": {"git": {"command": "g", "env": {"A": 1}}}}, "servers.git.env.A: expected a string"),
        ({"servers": {"git": {"command": "g", "enabled": "yes"}}}, "servers.git.enabled: expected true or false"),
        ({"servers": {"git": {}}}, "servers.git: needs either `command` (stdio) or `url` (HTTP)"),
        ({"servers": {"git": {"command": "g", "url": "http://127.0.0.1/"}}}, "servers.git: give `command` or `url`"),
        ({"servers": {"git": {"command": "g", "transport": "pigeon"}}}, "servers.git.transport: expected one of"),
        ({"servers": {"a__b": {"command": "g"}}}, "servers.a__b: a server key must not contain the separator"),
        ({"servers": {"a b": {"command": "g"}}}, "servers.a b: a server key may only contain"),
        ({"servers": {"my_db": {"command": "g"}, "my-db": {"command": "g"}}}, "already used by servers.my_db"),
        ({"servers": {"1st": {"command": "g"}}}, "servers.1st.prefix: '1st' cannot start a URI scheme"),
        ({"servers": {"x": {"command": "g", "prefix": "p__q"}}}, "servers.x.prefix: must not contain the separator"),
        ({"proxy": {"separator": "/"}}, "proxy.separator: must be one or more of"),
        ({"proxy": {"page_size": 0}}, "proxy.page_size: must be an integer (items) from 1 to 100000, got 0"),
        ({"proxy": {"pagesize": 3}}, "proxy.pagesize: unknown key; did you mean `page_size`?"),
        ({"serverz": {}}, "serverz: unknown key; did you mean `servers`?"),
        ({"proxy": {"MAX_JSON_DEPTH": 3}}, "proxy.MAX_JSON_DEPTH: unknown key; did you mean `max_json_depth`?"),
        ({"servers": {"git": {"command": "${NOPE}"}}}, "servers.git.command: environment variable NOPE is not set"),
    ],
)
def test_problems_name_their_key_path(raw, expected):
    found = problems(raw)
    assert any(p.startswith(expected) or expected in p for p in found), found


def test_an_unknown_key_names_the_nearest_valid_key_at_its_path():
    found = problems(
        {
            "proxy": {"seperator": "__", "discovery": {"mdoe": "all"}},
            "servers": {"a": {"comand": "x", "nme": "a", "tools": {"alow": ["x"], "zzz": 1}}},
            "profiles": {"p": {"servers": {"a": {"tolls": {}}}}},
            "plugins": [{"use": "x", "opts": {}}],
            "polcy": {},
        }
    )
    assert sorted(found) == [
        "plugins[0].opts: unknown key; did you mean `options`?",
        "polcy: unknown key; did you mean `policy`?",
        "profiles.p.servers.a.tolls: unknown key; did you mean `tools`?",
        "proxy.discovery.mdoe: unknown key; did you mean `mode`?",
        "proxy.seperator: unknown key; did you mean `separator`?",
        "servers.a.comand: unknown key; did you mean `command`?",
        "servers.a.nme: unknown key",  # `name` is the table's key, never a key in it
        "servers.a.tools.alow: unknown key; did you mean `allow`?",
        "servers.a.tools.zzz: unknown key",
    ], found


def test_all_problems_at_once():
    found = problems({"servers": {"a": {"command": 1}, "b": {"command": "x", "args": [1, 2]}}})
    assert len(found) == 3


def test_underscore_keys_get_a_uri_prefix():
    config = structure_config({"servers": {"my_db": {"command": "g"}}}, environ={})
    from aggregator.core.catalogs.naming import uri_prefix

    assert uri_prefix(config.servers["my_db"]) == "my-db"


def test_claude_desktop_and_vscode_json(tmp_path):
    claude = {
        "mcpServers": {
            "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {"A": "b"}},
            "remote": {"url": "http://127.0.0.1:9/mcp", "type": "http", "headers": {"X": "y"}},
            "off": {"command": "x", "disabled": True, "autoApprove": ["t"]},
        }
    }
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(claude))
    config = load_config(path, environ={})
    assert config.servers["time"].args == ("--local-timezone", "UTC")
    assert config.servers["remote"].effective_transport == "streamable-http"
    assert not config.servers["off"].enabled
    vscode = {"servers": {"git": {"type": "stdio", "command": "mcp-server-git", "args": []}}, "inputs": []}
    raw = mcp_servers_json_to_raw(json.dumps(vscode).encode())
    assert raw == {"servers": {"git": {"command": "mcp-server-git", "args": [], "transport": "stdio"}}}
    text = raw_to_toml(mcp_servers_json_to_raw(json.dumps(claude).encode()))
    again = structure_config(tomllib.loads(text), environ={})
    # Loaded from a file, a stdio server runs in the file's directory; from text, where started.
    assert config.servers["time"].cwd == str(tmp_path) and again.servers["time"].cwd is None
    assert again.servers == {
        name: attrs.evolve(server, cwd=None) if server.command else server for name, server in config.servers.items()
    }


def test_json_errors():
    with pytest.raises(ConfigError, match="mcpServers.x.bogus: unknown key"):
        mcp_servers_json_to_raw(b'{"mcpServers": {"x": {"command": "a", "bogus": 1}}}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        mcp_servers_json_to_raw(b"{")


def test_bad_toml_and_missing_file(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text("[servers\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_a_byte_order_mark_at_the_start_is_skipped(tmp_path):
    path = tmp_path / "a.toml"
    path.write_bytes(b'\xef\xbb\xbf[servers.a]\ncommand = "a"\n')
    assert load_config(path).servers["a"].command == "a"


def test_shipped_config_is_valid():
    from pathlib import Path

    config = load_config(Path(__file__).parents[2] / "aggregator.toml")
    assert {"time", "git"} <= set(config.servers)


def test_listen_addresses():
    from aggregator.config import parse_listen

    assert parse_listen("8000") == ("127.0.0.1", 8000)
    assert parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80)
    for bad in ("", "host", "127.0.0.1:", "127.0.0.1:99999", ":80"):
        with pytest.raises(ValueError):
            parse_listen(bad)
    assert problems({"http": {"listen": "nowhere"}})[0].startswith("http.listen: expected HOST:PORT")


@pytest.mark.parametrize("depth", [15, 513, 0])
def test_json_depth_limit_is_bounded(depth):
    assert problems({"proxy": {"max_json_depth": depth}}) == [
        f"proxy.max_json_depth: must be an integer (levels) from 16 to 512, got {depth}"
    ]


def test_json_depth_limit_default_and_range():
    assert structure_config({}, environ={}).proxy.max_json_depth == 128
    for depth in (16, 512):
        assert structure_config({"proxy": {"max_json_depth": depth}}, environ={}).proxy.max_json_depth == depth


# --- numeric ranges -----------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
# (table, key, zero is valid, a valid value, a value over the upper bound)
NUMERIC_KEYS = [
    ("proxy", "startup_timeout", True, 5.0, 1e9),
    ("proxy", "page_size", False, 50, 10**9),
    ("proxy", "max_message_bytes", False, 65536, 2**40),
    ("proxy", "restart_backoff_initial", False, 0.25, 1e9),
    ("proxy", "restart_backoff_max", False, 60.0, 1e9),
    ("proxy", "list_changed_debounce", True, 0.5, 1e9),
    ("proxy", "max_in_flight_per_session", False, 16, 10**9),
    ("proxy", "drain_timeout", True, 5.0, 1e9),
    ("proxy", "input_required_timeout", False, 5.0, 1e9),
    ("proxy", "max_name_length", False, 64, 10**6),
    ("proxy", "total_client_buffer_bytes", False, 65536, 2**40),
    ("proxy", "client_buffer_bytes", False, 65536, 2**40),
    ("proxy", "server_buffer_bytes", False, 65536, 2**40),
    ("proxy", "client_write_timeout", False, 5.0, 1e9),
    ("proxy", "server_write_timeout", False, 5.0, 1e9),
    ("http", "max_body_bytes", False, 65536, 2**40),
    ("http", "max_header_bytes", False, 8192, 2**40),
    ("http", "header_timeout", False, 2.0, 1e9),
    ("http", "body_timeout", False, 2.0, 1e9),
    ("http", "keepalive_timeout", False, 2.0, 1e9),
    ("http", "max_connections", False, 64, 10**9),
    ("http", "max_sessions", False, 64, 10**9),
    ("http", "session_idle_timeout", False, 60.0, 1e9),
    ("http", "stream_drop_grace", True, 1.0, 1e9),
    ("http", "max_stream_buffer_bytes", False, 65536, 2**40),
    ("http", "write_timeout", False, 5.0, 1e9),
    ("server", "init_timeout", False, 5.0, 1e9),
    ("server", "request_timeout", False, 5.0, 1e9),
    ("server", "max_request_timeout", False, 700.0, 1e9),
]


def with_value(table, key, value):
    if table == "server":
        return {"servers": {"s": {"command": "x", key: value}}}, f"servers.s.{key}"
    return {table: {key: value}}, f"{table}.{key}"


@pytest.mark.parametrize(
    ("table", "key", "zero_ok", "valid", "huge"), NUMERIC_KEYS, ids=[f"{t}.{k}" for t, k, *_ in NUMERIC_KEYS]
)
def test_every_numeric_key_has_a_range(table, key, zero_ok, valid, huge):
    raw, path = with_value(table, key, valid)
    config = structure_config(raw, environ={})
    section = config.servers["s"] if table == "server" else getattr(config, table)
    assert getattr(section, key) == valid
    floating = isinstance(valid, float)
    bad = [-1, huge] + ([NAN, INF, -INF, 1e-300] if floating and not zero_ok else [NAN, INF, -INF] if floating else [])
    if not zero_ok:
        bad.append(0)
    for value in bad:
        raw, path = with_value(table, key, value)
        found = problems(raw)
        assert [p for p in found if p.startswith(f"{path}: must be ")] == found, (value, found)
        assert found and f"got {value!r}" in found[0] or f"got {float(value)!r}" in found[0], found
        assert ("finite number of seconds" in found[0]) == (
            floating and key.endswith(("timeout", "initial", "max", "debounce", "grace"))
        ), found
    if zero_ok:
        raw, _ = with_value(table, key, 0 if not floating else 0.0)
        structure_config(raw, environ={})


def test_a_nan_timeout_is_refused_with_its_key_path():
    assert problems({"proxy": {"startup_timeout": NAN}}) == [
        "proxy.startup_timeout: must be a finite number of seconds from 0 to 86400, got nan"
    ]


def test_a_float_key_without_a_range_must_still_be_finite():
    import attrs

    from aggregator.config import RANGES, ProxyConfig, check_ranges

    floats = [f.name for f in attrs.fields(ProxyConfig) if isinstance(getattr(ProxyConfig(), f.name), float)]
    unranged = {cls: {} for cls in RANGES}
    original = dict(RANGES)
    try:
        RANGES.clear()
        RANGES.update(unranged)
        found = check_ranges(attrs.evolve(ProxyConfig(), **{name: NAN for name in floats}), "proxy")
    finally:
        RANGES.clear()
        RANGES.update(original)
    assert found == [f"proxy.{name}: must be a finite number, got nan" for name in floats]


def test_keys_that_depend_on_each_other():
    assert problems({"servers": {"s": {"command": "x", "request_timeout": 30.0, "max_request_timeout": 5.0}}}) == [
        "servers.s.max_request_timeout: must be at least request_timeout (30), got 5"
    ]
    assert problems({"proxy": {"restart_backoff_initial": 10.0, "restart_backoff_max": 2.0}}) == [
        "proxy.restart_backoff_max: must be at least restart_backoff_initial (10), got 2"
    ]
    assert problems({"http": {"listen": "127.0.0.1:8000", "websocket_listen": "localhost:8000"}}) == [
        "http.websocket_listen: must be another port than http.listen"
    ]
    structure_config({"http": {"listen": "127.0.0.1:8000", "websocket_listen": "127.0.0.1:8001"}}, environ={})


def test_type_range_and_value_problems_are_reported_together():
    found = problems(
        tomllib.loads("""
[proxy]
startup_timeout = "ten"
page_size = -1
max_message_bytes = 0
restart_backoff_initial = -5
name_charset = "emoji"
server_requests = ["sampling", "bogus"]
max_in_flight_per_session = 0
[servers.a]
command = ""
request_timeout = 0
isolation = "weird"
env = { X = 1 }
[servers.b]
command = 5
request_timeout = nan
""")
    )
    assert sorted(found) == sorted(
        [
            "proxy.startup_timeout: expected a number, got the string 'ten'",
            "proxy.name_charset: expected mcp or llm, got the string 'emoji'",
            "proxy.page_size: must be an integer (items) from 1 to 100000, got -1",
            "proxy.max_message_bytes: must be an integer (bytes) from 1024 to 1073741824, got 0",
            "proxy.restart_backoff_initial: must be a finite number of seconds from 0.001 to 3600, got -5.0",
            "proxy.max_in_flight_per_session: must be an integer (requests) from 1 to 1000000, got 0",
            "proxy.server_requests[1]: expected sampling, elicitation or roots, got 'bogus'",
            "servers.a.env.X: expected a string, got a number; it is not shown, as it is a secret",
            "servers.a.isolation: expected shared or per-session, got the string 'weird'",
            "servers.a.request_timeout: must be a finite number of seconds from 0.001 to 604800, got 0.0",
            "servers.a.command: must not be empty",
            # b's command is broken: "needs either command or url" would only be its echo
            "servers.b.command: expected a string, got a number (5)",
            "servers.b.request_timeout: must be a finite number of seconds from 0.001 to 604800, got nan",
        ]
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"proxy": 3}, ["proxy: expected a table, got a number (3)"]),
        ({"proxy": [1, 2]}, ["proxy: expected a table, got a list"]),
        ({"http": "x"}, ["http: expected a table, got the string 'x'"]),
        ({"policy": True}, ["policy: expected a table, got a boolean"]),
        ({"servers": {"a": 3}}, ["servers.a: expected a table, got a number (3)"]),
    ],
)
def test_a_section_of_the_wrong_shape(raw, expected):
    assert problems(raw) == expected


def test_import_refuses_values_a_client_would_not_run():
    with pytest.raises(ConfigError) as info:
        mcp_servers_json_to_raw(
            b'{"mcpServers": {"a": {"command": "x", "args": [1, true, null],'
            b' "env": {"A": 2}, "headers": [], "cwd": 3}}}'
        )
    assert sorted(info.value.problems) == sorted(
        [
            "mcpServers.a.args[0]: expected a string, got a number (1)",
            "mcpServers.a.args[1]: expected a string, got a boolean",
            "mcpServers.a.args[2]: expected a string, got nothing",
            "mcpServers.a.env.A: expected a string, got a number; it is not shown, as it is a secret",
            "mcpServers.a.headers: expected an object of strings, got a list",
            "mcpServers.a.cwd: expected a string, got a number (3)",
        ]
    )


def test_client_limits_accept_their_older_http_names():
    older = structure_config({"http": {"max_stream_buffer_bytes": 65536, "write_timeout": 1.5}}, environ={})
    assert (older.proxy.client_buffer_bytes, older.proxy.client_write_timeout) == (65536, 1.5)
    both = structure_config(
        {"proxy": {"client_buffer_bytes": 4096}, "http": {"max_stream_buffer_bytes": 65536}}, environ={}
    )
    assert both.proxy.client_buffer_bytes == both.http.max_stream_buffer_bytes == 4096
    with pytest.raises(ConfigError) as error:
        structure_config({"proxy": {"client_buffer_bytes": 10, "server_write_timeout": 0}}, environ={})
    assert "proxy.client_buffer_bytes: must be an integer (bytes) from 1024" in str(error.value)
    assert "proxy.server_write_timeout: must be a finite number of seconds from 0.001" in str(error.value)


SECRET = "sekrit-token-123"


@pytest.mark.parametrize(
    "header, value, expected",
    [
        ("Authorization", f"Bearer {SECRET}\n", "servers.a.headers.Authorization: the value contains a line break"),
        ("Authorization", f"Bearer {SECRET}\r", "servers.a.headers.Authorization: the value contains a line break"),
        ("Authorization", f"Bearer {SECRET}\r\nX-Injected: 1", "servers.a.headers.Authorization: the value contains"),
        ("X-Key", f"{SECRET}\x00", "servers.a.headers.X-Key: the value contains a NUL character"),
        ("X-Key", f"{SECRET}\x07", "servers.a.headers.X-Key: the value contains a control character"),
        ("X-Key", f"{SECRET}\u00e9", "servers.a.headers.X-Key: the value contains a character outside ASCII"),
        ("X-Key", f" {SECRET}", "servers.a.headers.X-Key: the value begins or ends with whitespace"),
        ("Bad Name", SECRET, "servers.a.headers.Bad Name: not a valid header name"),
        ("X-Key:", SECRET, "servers.a.headers.X-Key:: not a valid header name"),
        ("", SECRET, "servers.a.headers.: not a valid header name"),
        ("Authorization", f"Bearer {SECRET}", None),
        ("X-Empty", "", None),
        ("X_Odd.Name~1", "a\tb c", None),
    ],
)
def test_header_names_and_values_are_checked_after_interpolation(header, value, expected):
    # The value comes from the environment (where a stray newline usually comes from): the check
    # sees it interpolated, names the key path, and never quotes the value (it may be a secret).
    raw = {"servers": {"a": {"url": "http://127.0.0.1:9/mcp", "headers": {header: "${TOK}"}}}}
    if expected is None:
        assert structure_config(raw, environ={"TOK": value}).servers["a"].headers == {header: value}
        return
    found = problems(raw, {"TOK": value})
    assert len(found) == 1 and found[0].startswith(expected), found
    assert SECRET not in found[0]


def test_env_values_of_a_stdio_server_may_hold_line_breaks():
    raw = {"servers": {"a": {"command": "srv", "env": {"KEY": "${TOK}"}}}}
    assert structure_config(raw, environ={"TOK": "two\nlines\n"}).servers["a"].env == {"KEY": "two\nlines\n"}


TOKEN = "tok-5e1f0c9a7b3d2e8f"  # 19 characters: long enough; a secret never shown


@pytest.mark.parametrize(
    "raw, environ, expected",
    [
        # Environment names and NUL bytes: a traceback at start (ValueError from exec) before.
        ({"servers": {"a": {"command": "s", "env": {"BAD=NAME": "v"}}}}, {}, "servers.a.env.'BAD=NAME': not a valid"),
        ({"servers": {"a": {"command": "s", "env": {"": "v"}}}}, {}, "servers.a.env.'': not a valid"),
        ({"servers": {"a": {"command": "s", "env": {"K": "${T}"}}}}, {"T": TOKEN + "\0"}, "servers.a.env.K: the value"),
        (
            {"servers": {"a": {"command": "s", "args": ["x", "${T}"]}}},
            {"T": "\0" + TOKEN},
            "servers.a.args[1]: contains",
        ),
        ({"servers": {"a": {"command": "s\0x"}}}, {}, "servers.a.command: contains a NUL"),
        ({"servers": {"a": {"command": "s", "cwd": "/t\0"}}}, {}, "servers.a.cwd: contains a NUL"),
        # Tokens a client cannot send as they are: nothing could log in.
        ({"http": {"auth_tokens": ["${T}"]}}, {"T": TOKEN + "\n"}, "http.auth_tokens[0]: contains a line break"),
        ({"http": {"auth_tokens": ["${T}"]}}, {"T": f" {TOKEN}"}, "http.auth_tokens[0]: contains whitespace"),
        ({"http": {"auth_tokens": ["${T}"]}}, {"T": f"{TOKEN}\x7f"}, "http.auth_tokens[0]: contains whitespace or a"),
        ({"http": {"auth_tokens": ["${T}"]}}, {"T": f"{TOKEN}\u00e9"}, "http.auth_tokens[0]: contains a character out"),
        (
            {"profiles": {"p": {"tokens": ["${T}"]}}},
            {"T": TOKEN + "\r\n"},
            "profiles.p.tokens[0]: contains a line brea",
        ),
        ({"profiles": {"p": {"tokens": ["${T}"]}}}, {"T": "a b" + TOKEN}, "profiles.p.tokens[0]: contains whitespace"),
        # Exact names only: a pattern would be taken literally and refuse every request.
        ({"http": {"allowed_hosts": ["*"]}}, {}, "http.allowed_hosts[0]: '*' is a pattern, but these are exact host"),
        ({"http": {"allowed_hosts": ["*.example.com"]}}, {}, "http.allowed_hosts[0]: '*.example.com' is a pattern"),
        ({"http": {"allowed_origins": ["*"]}}, {}, "http.allowed_origins[0]: '*' is a pattern"),
        ({"http": {"allowed_origins": ["https://*.x.org"]}}, {}, "http.allowed_origins[0]: 'https://*.x.org' is a pat"),
        ({"http": {"allowed_origins": ["example.com"]}}, {}, "http.allowed_origins[0]: expected scheme://host"),
        ({"http": {"allowed_hosts": [""]}}, {}, "http.allowed_hosts[0]: expected a host name"),
        # Set by loading only.
        ({"servers": {"a": {"command": "s", "interpolated": ["x"]}}}, {}, "servers.a.interpolated: unknown key"),
    ],
)
def test_values_a_process_or_client_could_not_use_are_refused_at_load(raw, environ, expected):
    found = problems(raw, environ)
    assert len(found) == 1 and found[0].startswith(expected), found
    assert TOKEN not in found[0]


@pytest.mark.parametrize(
    "raw",
    [
        {"http": {"auth_tokens": [TOKEN]}, "profiles": {"p": {"tokens": [TOKEN + "x"]}}},
        {"http": {"allowed_hosts": ["example.com", "example.com:8443", "[::1]", "10.0.0.5"]}},
        {"http": {"allowed_origins": ["https://example.com", "http://[::1]:8000"]}},
        {"servers": {"a": {"command": "s", "env": {"K": "two\nlines", "_X1": ""}, "args": ["a b", ""]}}},
    ],
)
def test_usable_values_are_accepted(raw):
    structure_config(raw, environ={})


URL_SECRET = "url-sekrit-91"


@pytest.mark.parametrize(
    "url, value, expected",
    [
        ("ws://127.0.0.1:9/mcp?token=${TOK}", f"a {URL_SECRET}", "contains whitespace or a control character"),
        ("http://127.0.0.1:9/mcp?token=${TOK}", f"{URL_SECRET}\n", "contains whitespace or a control character"),
        ("wss://h.example/mcp?token=${TOK}", f"{URL_SECRET}\x7f", "contains whitespace or a control character"),
        ("wss://h.example/mcp?token=${TOK}", f"{URL_SECRET}é", "contains a character outside ASCII"),
        ("http://${TOK}/mcp", "", "needs a host"),
        ("http://127.0.0.1:${TOK}/mcp", URL_SECRET, "cannot be parsed as a URL"),
        ("${TOK}", f"127.0.0.1/{URL_SECRET}", "a streamable-http server needs an absolute http or https URL"),
        # No client of the proxy's sends a URL outside ASCII (its own HTTP client writes the request line as is).
        ("http://127.0.0.1:9/mcp?token=${TOK}", f"{URL_SECRET}%20é", "contains a character outside ASCII"),
        ("http://127.0.0.1:9/caf\u00e9", "", "contains a character outside ASCII"),
        ("ws://user:${TOK}@127.0.0.1:9/mcp", URL_SECRET, None),
    ],
)
def test_a_server_url_is_checked_after_interpolation_without_showing_it(url, value, expected):
    # An upstream URL the HTTP or WebSocket client would refuse only when it connects (with an
    # "internal error" and a traceback) is refused at load, by its key path, never quoted.
    raw = {"servers": {"w": {"url": url}}}
    if expected is None:
        assert structure_config(raw, environ={"TOK": value}).servers["w"].url == url.replace("${TOK}", value)
        return
    found = problems(raw, {"TOK": value})
    assert len(found) == 1 and found[0].startswith(f"servers.w.url: {expected}"), found
    assert URL_SECRET not in found[0]
    if "whitespace" in expected:
        assert "percent-encode the variable's value" in found[0]


def test_min_ready_beyond_the_enabled_servers_is_refused_by_key_path():
    def servers(count: int, disabled: int = 0) -> dict:
        tables = {f"s{i}": {"command": "x"} for i in range(count)}
        tables.update({f"off{i}": {"command": "x", "enabled": False} for i in range(disabled)})
        return tables

    found = problems({"proxy": {"min_ready": 3}, "servers": servers(1, disabled=1)})
    assert found == [
        "proxy.min_ready: 3 servers must be ready, but 1 enabled server is configured; /readyz would never say ready"
    ]
    # As many as are enabled, fewer, none (ready when startup ends) and the default (all) are fine.
    for min_ready in (2, 1, 0, None):
        proxy = {} if min_ready is None else {"min_ready": min_ready}
        config = structure_config({"proxy": proxy, "servers": servers(2, disabled=1)}, environ={})
        assert config.proxy.min_ready == min_ready
    assert structure_config({"proxy": {"min_ready": 0}}, environ={}).proxy.min_ready == 0
    # A server whose table has a mistake still counts: only its mistake is told.
    found = problems({"proxy": {"min_ready": 2}, "servers": {**servers(1), "bad": {"comand": "x"}}})
    assert not any(problem.startswith("proxy.min_ready") for problem in found), found


SECRET_MARK = "tEGMzq8Xw2Lr9Vb4Nk7Hs3Jd6Fp1Yc5T"


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("cluster", "keys", "${SECRET_MARK}"),
        ("cluster", "keys", ["${SECRET_MARK}", 31415926]),
        ("cluster", "store", 31415926),
        ("credentials", "vault_key", 31415926),
        ("credentials", "sign_in_client_secret", 31415926),
        ("http", "admin_token", 31415926),
        ("http", "auth_tokens", "${SECRET_MARK}"),
        ("servers.a", "env", "TOKEN=${SECRET_MARK}"),
        ("servers.a", "env", {"TOKEN": 31415926}),
        ("servers.a", "headers", "Authorization: Bearer ${SECRET_MARK}"),
        ("servers.a.oauth", "client_secret", 31415926),
        ("profiles.p", "tokens", "${SECRET_MARK}"),
        ("auth.issuers[0]", "client_secret", 31415926),
    ],
)
def test_a_secret_of_the_wrong_type_is_not_shown(table, key, value):
    raw: dict = {"servers": {"a": {"command": "x"}}}
    where = raw
    for part in table.split("."):
        name, _, index = part.partition("[")
        where = where.setdefault(name, [{}] if index else {})
        where = where[0] if index else where
    where[key] = value
    found = problems(raw, environ={"SECRET_MARK": SECRET_MARK})
    about = [line for line in found if f".{key}" in line or line.startswith(key)]
    assert about, found
    assert all("it is not shown, as it is a secret" in line for line in about), about
    assert not any(SECRET_MARK in line or "31415926" in line or "tEGM" in line for line in found), found


def test_a_setting_of_the_wrong_type_that_is_no_secret_is_quoted():
    found = problems({"proxy": {"separator": 31415926}, "servers": {"a": {"command": "x", "args": "--flag"}}})
    assert "proxy.separator: expected a string, got a number (31415926)" in found
    assert "servers.a.args: expected a list of strings, got the string '--flag'" in found


def test_import_never_quotes_an_env_or_header_value_of_the_wrong_type():
    with pytest.raises(ConfigError) as info:
        mcp_servers_json_to_raw(
            b'{"mcpServers": {"a": {"command": "x", "env": "TOKEN=tEGMzq8Xw2Lr9Vb4",'
            b' "headers": {"Authorization": 31415926}}}}'
        )
    assert sorted(info.value.problems) == [
        "mcpServers.a.env: expected an object of strings, got a string; it is not shown, as it is a secret",
        "mcpServers.a.headers.Authorization: expected a string, got a number; it is not shown, as it is a secret",
    ]

"""Config: strict structuring with key paths, ${VAR}, and the clients' JSON formats."""

import json
import tomllib

import pytest

from aggregator.config import load_config, mcp_servers_json_to_raw, raw_to_toml, structure_config
from aggregator.errors import ConfigError


def problems(raw, environ=None):
    with pytest.raises(ConfigError) as info:
        structure_config(raw, environ=environ or {})
    return info.value.problems


def test_valid_config():
    config = structure_config(tomllib.loads('''
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
'''), environ={"REPO": "/tmp/r"})
    git = config.servers["git"]
    assert git.args == ("--repository", "/tmp/r") and git.env == {"TOKEN": "${literal}"}
    assert git.effective_transport == "stdio" and config.servers["web"].effective_transport == "streamable-http"
    assert [s.name for s in config.enabled_servers] == ["git"]
    assert config.proxy.separator == "." and config.proxy.page_size == 7


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"servers": {"git": {"command": "g", "args": ["a", "b", 3]}}}, "servers.git.args[2]: expected a string"),
        ({"servers": {"git": {"command": "g", "argz": []}}}, "servers.git.argz: unknown key"),
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
        ({"proxy": {"page_size": 0}}, "proxy.page_size: must be at least 1"),
        ({"proxy": {"pagesize": 3}}, "proxy.pagesize: unknown key"),
        ({"serverz": {}}, "serverz: unknown key"),
        ({"servers": {"git": {"command": "${NOPE}"}}}, "servers.git.command: environment variable NOPE is not set"),
    ],
)
def test_problems_name_their_key_path(raw, expected):
    found = problems(raw)
    assert any(p.startswith(expected) or expected in p for p in found), found


def test_all_problems_at_once():
    found = problems({"servers": {"a": {"command": 1}, "b": {"command": "x", "args": [1, 2]}}})
    assert len(found) == 3


def test_underscore_keys_get_a_uri_prefix():
    config = structure_config({"servers": {"my_db": {"command": "g"}}}, environ={})
    from aggregator.core.naming import uri_prefix
    assert uri_prefix(config.servers["my_db"]) == "my-db"


def test_claude_desktop_and_vscode_json(tmp_path):
    claude = {"mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {"A": "b"}},
        "remote": {"url": "http://127.0.0.1:9/mcp", "type": "http", "headers": {"X": "y"}},
        "off": {"command": "x", "disabled": True, "autoApprove": ["t"]},
    }}
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
    assert again.servers == config.servers


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


def test_client_limits_accept_their_older_http_names():
    older = structure_config({"http": {"max_stream_buffer_bytes": 65536, "write_timeout": 1.5}}, environ={})
    assert (older.proxy.client_buffer_bytes, older.proxy.client_write_timeout) == (65536, 1.5)
    both = structure_config({"proxy": {"client_buffer_bytes": 4096},
                             "http": {"max_stream_buffer_bytes": 65536}}, environ={})
    assert both.proxy.client_buffer_bytes == both.http.max_stream_buffer_bytes == 4096
    with pytest.raises(ConfigError) as error:
        structure_config({"proxy": {"client_buffer_bytes": 10, "server_write_timeout": 0}}, environ={})
    assert "proxy.client_buffer_bytes: must be at least 1024" in str(error.value)
    assert "proxy.server_write_timeout: must be positive" in str(error.value)

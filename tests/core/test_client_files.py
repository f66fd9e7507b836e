"""Clients' JSON server lists: names that are not legal keys, envFile, ${workspaceFolder};
and env files as a server's env_file reads them."""

import json
import tomllib

import pytest

from aggregator.config import load_config, mcp_servers_json_to_raw, raw_to_toml, structure_config
from aggregator.config.env_file import parse_env_file
from aggregator.errors import ConfigError


def test_a_name_that_is_no_legal_key_gets_one_derived_from_it():
    names = ["Brave Search", "my.server", "café", "123", "-a-", "a__b", "brave_search", "Brave  Search!", "日本"]
    document = {"mcpServers": {name: {"command": "x"} for name in names}}
    renamed: dict[str, str] = {}
    raw = mcp_servers_json_to_raw(json.dumps(document), renamed=renamed)
    assert list(raw["servers"]) == [
        "brave_search_2",
        "my.server",
        "cafe",
        "server_123",
        "a",
        "a_b",
        "brave_search",
        "brave_search_3",
        "server",
    ]
    assert renamed["brave_search_2"] == "Brave Search" and "my.server" not in renamed
    # Every derived key loads, as key, prefix and URI prefix.
    config = structure_config(tomllib.loads(raw_to_toml(raw, {k: f"{v!r} in x.json" for k, v in renamed.items()})))
    assert set(config.servers) == set(raw["servers"])


def test_env_file_is_read_beside_the_json_file_and_env_wins(tmp_path):
    folder = tmp_path / "project" / ".cursor"
    folder.mkdir(parents=True)
    (folder / "mcp.env").write_text("# keys\nexport TOKEN='s3cr$t'\nMODE=fast # comment\nKEEP=file\n")
    (tmp_path / "project" / "root.env").write_text('ROOT="a \\"b\\"\\nc"\n')
    document = {
        "mcpServers": {
            "a": {"command": "x", "envFile": "mcp.env", "env": {"KEEP": "own"}},
            "b": {"command": "x", "envFile": "${workspaceFolder}/root.env", "args": ["${workspaceFolder}"]},
        }
    }
    path = folder / "mcp.json"
    path.write_text(json.dumps(document))
    config = load_config(path, environ={})
    assert config.servers["a"].env == {"TOKEN": "s3cr$t", "MODE": "fast", "KEEP": "own"}
    assert config.servers["b"].env == {"ROOT": 'a "b"\nc'}
    assert config.servers["b"].args == (str(tmp_path / "project"),)
    assert config.servers["a"].env_file == str(folder / "mcp.env")


def test_env_file_problems_name_the_key_path_and_line_never_a_value(tmp_path):
    (tmp_path / "bad.env").write_text('OK=1\nno equals sign\nSECRET="unclosed value\n1X=2\n')
    (tmp_path / "a.toml").write_text(
        '[servers.a]\ncommand = "x"\nenv_file = "bad.env"\n'
        '[servers.b]\ncommand = "x"\nenv_file = "missing.env"\n'
        '[servers.c]\nurl = "http://127.0.0.1:9/mcp"\nenv_file = "bad.env"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "a.toml")
    bad = tmp_path / "bad.env"
    assert info.value.problems == [
        f"servers.a.env_file: {bad}: line 2: expected KEY=VALUE (a key of letters, digits and _)",
        f"servers.a.env_file: {bad}: line 3: SECRET: a quoted value without its closing quote",
        f"servers.a.env_file: {bad}: line 4: expected KEY=VALUE (a key of letters, digits and _)",
        f"servers.b.env_file: cannot read {tmp_path / 'missing.env'}: No such file or directory",
        "servers.c.env_file: only a stdio server (a `command`) has an environment",
    ]
    assert "unclosed value" not in str(info.value)


def test_env_file_syntax():
    values, problems = parse_env_file(
        "A=1\n  B = two words  \nC='$x # y' # c\nD=\"tab\\there\"\nE=x#not-a-comment\nF=\nexport G=g\n#H=h\n\nI='a'b\n"
    )
    assert problems == ["line 10: I: text after the closing quote"]
    assert values == {
        "A": "1",
        "B": "two words",
        "C": "$x # y",
        "D": "tab\there",
        "E": "x#not-a-comment",
        "F": "",
        "G": "g",
    }


def test_include_and_exclude_tools_are_the_servers_tool_policy(tmp_path):
    document = {
        "mcpServers": {
            "git": {"command": "x", "excludeTools": ["git_push", "odd*[name]?$"]},
            "time": {
                "command": "x",
                "includeTools": ["get_current_time", "convert_time"],
                "excludeTools": ["convert_time"],
            },
            "none": {"command": "x", "includeTools": []},
        }
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(document))
    servers = load_config(path, environ={}).servers
    assert servers["git"].tools.deny == ("git_push", "odd[*][[]name][?]$") and servers["git"].tools.allow == ()
    assert servers["time"].tools.allow == ("get_current_time", "convert_time")
    assert servers["time"].tools.deny == ("convert_time",)
    assert servers["none"].tools.deny == ("*",) and servers["none"].tools.allow == ()
    # `import` writes them as the same policy, and the TOML loads to the same config.
    text = raw_to_toml(mcp_servers_json_to_raw(json.dumps(document)))
    assert 'tools = { deny = ["git_push", "odd[*][[]name][?]$$"] }' in text
    assert (
        structure_config(tomllib.loads(text), environ={}).servers
        == structure_config(mcp_servers_json_to_raw(json.dumps(document)), environ={}).servers
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (["a", 3], "mcpServers.git.excludeTools[1]: expected a string, got a number (3)"),
        ("git_push", "mcpServers.git.excludeTools: expected a list of tool names, got the string 'git_push'"),
        ({"a": 1}, "mcpServers.git.excludeTools: expected a list of tool names, got a table"),
    ],
)
def test_a_tool_filter_that_is_not_a_list_of_names_is_refused_by_its_json_path(value, problem):
    document = {"mcpServers": {"git": {"command": "x", "excludeTools": value, "includeTools": [None]}}}
    with pytest.raises(ConfigError) as caught:
        mcp_servers_json_to_raw(json.dumps(document))
    assert sorted(caught.value.problems) == [problem, "mcpServers.git.includeTools[0]: expected a string, got nothing"]


def test_a_misspelt_key_in_a_client_file_names_the_key_meant():
    document = {"mcpServers": {"git": {"comand": "x", "excludeTool": ["a"], "bogus": 1}}}
    with pytest.raises(ConfigError) as caught:
        mcp_servers_json_to_raw(json.dumps(document))
    assert caught.value.problems == [
        "mcpServers.git.bogus: unknown key",
        "mcpServers.git.comand: unknown key; did you mean `command`?",
        "mcpServers.git.excludeTool: unknown key; did you mean `excludeTools`?",
    ]

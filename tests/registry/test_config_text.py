"""A table added to a config file's text: every byte already there is kept (comments,
spacing, line endings, a missing final newline); a key that is there is an error unless
replaced, and a replacement takes out that table only."""

from __future__ import annotations

import tomllib

import pytest

from aggregator.registry.config_text import dropped_settings, with_table
from aggregator.registry.identifiers import RegistryError

TABLE = '# from an MCP registry: io.example/x 1.0.0 (R)\n# d\n[servers.x]\ncommand = "npx"\n'


@pytest.mark.parametrize(
    "before",
    [
        "",
        "# only a comment",
        "[proxy]\nseparator = '__'   # odd  spacing kept\n",
        '[servers.a]\ncommand = "a"\n\n\n',
        "[proxy]\r\npage_size = 10\r\n",
        '[servers.a]\ncommand = "a"  # no final newline',
    ],
)
def test_the_text_before_is_kept_byte_for_byte(before):
    after = with_table(before, "x", TABLE, replace=False, source="c.toml")
    assert after.startswith(before)
    added = after[len(before) :]
    assert added.lstrip("\r\n") == TABLE.replace("\n", "\r\n" if "\r\n" in before else "\n")
    assert tomllib.loads(after)["servers"]["x"] == {"command": "npx"}
    if before:
        assert "\n\n" in after[len(before.rstrip("\r\n")) :].replace("\r", "")  # one blank line between


def test_a_key_that_is_there_is_an_error():
    with pytest.raises(RegistryError, match=r"c.toml already has servers.x; choose another key \(--as NAME\)"):
        with_table('[servers.x]\ncommand = "old"\n', "x", TABLE, replace=False, source="c.toml")


def test_replace_takes_out_that_table_and_its_sub_tables_only():
    before = (
        "# head\n"
        "[proxy]\n"
        "page_size = 10\n"
        "\n"
        "# from an MCP registry: io.example/x 0.9.0 (R)\n"
        "# d\n"
        "[servers.x]\n"
        'command = "old"\n'
        "# env.OPTIONAL = ...\n"
        "\n"
        "[servers.x.tools]\n"
        'deny = ["drop"]\n'
        "\n"
        "# the y server\n"
        "[servers.y]\n"
        'command = "y"\n'
    )
    after = with_table(before, "x", TABLE, replace=True, source="c.toml")
    assert after == ('# head\n[proxy]\npage_size = 10\n\n# the y server\n[servers.y]\ncommand = "y"\n\n' + TABLE)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_replace_takes_out_what_add_wrote_and_keeps_the_users_comments(newline):
    """User comments directly above the provenance lines, inside the table and after it
    stay byte for byte; add's own lines (provenance, descriptions, the table) go."""
    before = (
        "[proxy]\n"
        "page_size = 10\n"
        "\n"
        "# my memory server: keep it pinned  \n"
        "#   (see the wiki)\n"
        "# from an MCP registry: io.example/x 0.9.0 (R)\n"
        "# Knowledge graph memory\n"
        "# set API_KEY: the key (secret)\n"
        "[servers.x]\n"
        'command = "old"\n'
        "# why: the default path is on a slow disk\n"
        "# MEMORY_FILE_PATH (optional): Path to the file\n"
        '# env.MEMORY_FILE_PATH = "${MEMORY_FILE_PATH}"\n'
        '# to pass the optional argument port: add "--port", "${PORT}" to args (the port)\n'
        "# API_KEY (secret, required): the key\n"
        'env.API_KEY = "${API_KEY}"\n'
        "\n"
        "# after x, before y: mine too\n"
        "\n"
        "# the y server\n"
        "[servers.y]\n"
        'command = "y"\n'
        "\n"
        "# the very end\n"
    ).replace("\n", newline)
    after = with_table(before, "x", TABLE, replace=True, source="c.toml")
    expected = (
        "[proxy]\n"
        "page_size = 10\n"
        "\n"
        "# my memory server: keep it pinned  \n"
        "#   (see the wiki)\n"
        "# why: the default path is on a slow disk\n"
        "# after x, before y: mine too\n"
        "\n"
        "# the y server\n"
        "[servers.y]\n"
        'command = "y"\n'
        "\n"
        "# the very end\n"
        "\n"
    ).replace("\n", newline)
    assert after == expected + TABLE.replace("\n", newline)
    again = with_table(after, "x", TABLE, replace=True, source="c.toml")  # a second replace: the same file
    assert again == after


def test_replace_finds_a_quoted_key():
    before = '[servers."x"]\ncommand = "old"\n[servers.z]\ncommand = "z"\n'
    after = with_table(before, "x", TABLE, replace=True, source="c.toml")
    assert tomllib.loads(after)["servers"] == {"z": {"command": "z"}, "x": {"command": "npx"}}


@pytest.mark.parametrize(
    "before",
    [
        '[servers]\nx = { command = "old" }\n',
        'servers.x.command = "old"\n',
    ],
)
def test_a_key_written_another_way_is_left_to_the_user(before):
    with pytest.raises(RegistryError, match=r"servers.x in c.toml is not written as a \[servers.x\] table"):
        with_table(before, "x", TABLE, replace=True, source="c.toml")


def test_text_that_is_not_toml_is_not_written_to():
    with pytest.raises(RegistryError, match="c.toml is not valid TOML"):
        with_table("[servers\n", "x", TABLE, replace=False, source="c.toml")


def test_replace_keeps_tables_whose_quoted_keys_hold_hash_or_bracket():
    before = (
        '[servers.x]\ncommand = "old"\n\n'
        '[servers."team#a"]\ncommand = "uvx"\nargs = ["keep-me"]\n\n'
        '[servers."b]c"]\ncommand = "uvx"\n\n'
        '[servers.x.tools.rename."get#sum"]\nname = "add"\n\n'
        '[servers.other.tools.rename."x]y"]\nname = "xy"\n'
    )
    after = with_table(before, "x", TABLE, replace=True, source="c.toml")
    servers = tomllib.loads(after)["servers"]
    assert servers["team#a"] == {"command": "uvx", "args": ["keep-me"]}
    assert servers["b]c"] == {"command": "uvx"}
    assert servers["other"] == {"tools": {"rename": {"x]y": {"name": "xy"}}}}
    assert servers["x"] == {"command": "npx"}


def test_replace_that_would_change_another_setting_writes_nothing():
    before = '[servers.x]\ncommand = "old"\n\n[proxy]\nnote = """\n[servers.x]\n"""\n'
    with pytest.raises(RegistryError, match="cannot be taken out without changing other settings; edit it by hand"):
        with_table(before, "x", TABLE, replace=True, source="c.toml")


@pytest.mark.parametrize(
    "before",
    [
        TABLE,
        '[servers.x]\ncommand = "m"\n',
        '[proxy]\nstart = "lazy"\n\n' + TABLE,
        "[servers]\n\n" + TABLE,
    ],
)
def test_replace_takes_out_a_files_only_server(before):
    after = with_table(before, "x", TABLE, replace=True, source="c.toml")
    assert tomllib.loads(after)["servers"] == {"x": {"command": "npx"}}
    assert after.count("[servers.x]") == 1


def test_the_settings_a_replacement_drops_are_named_policy_rules_first():
    before = (
        "[servers.x]\n"
        'command = "old"\n'
        "request_timeout = 30\n"
        'env.MINE = "1"\n'
        "\n"
        "[servers.y]\n"
        'command = "y"\n'
        "\n"
        "[servers.x.tools]\n"
        'deny = ["drop"]\n'
    )
    assert dropped_settings(before, "x", TABLE) == ["tools.deny", "request_timeout", "env.MINE"]
    assert dropped_settings(before, "z", TABLE) == []
    assert dropped_settings(TABLE, "x", TABLE) == []

"""An entry turned into a ``[servers.KEY]`` table: the runner at the pinned version, the
arguments, the variables as ``${VAR}`` with what each is in a comment, and never a secret
value, whatever the registry put in ``value`` or ``default``."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from aggregator.registry.entries import read_entry
from aggregator.registry.identifiers import RegistryError
from aggregator.registry.tables import default_key, installation

HERE = Path(__file__).parent


def entry(directory: str, name: str):
    return read_entry(json.loads((HERE / directory / f"{name}.json").read_text()))


def table(text: str, key: str) -> dict:
    return tomllib.loads(text)["servers"][key]


def test_an_npm_package_runs_with_npx_at_its_version():
    added = installation(entry("servers", "memory"), "memory", "REG")
    assert added.text == (
        "# from an MCP registry: io.github.modelcontextprotocol/server-memory 2026.8.31 (REG)\n"
        "# Knowledge graph-based persistent memory system\n"
        "[servers.memory]\n"
        'command = "npx"\n'
        'args = ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]\n'
        "# MEMORY_FILE_PATH (optional): Path to the knowledge graph file (default: memory.jsonl beside the server)\n"
        '# env.MEMORY_FILE_PATH = "${MEMORY_FILE_PATH}"\n'
    )
    assert added.runs == "npx -y @modelcontextprotocol/server-memory@2026.8.31"
    assert added.variables == ()
    assert added.notes == ("optional variable MEMORY_FILE_PATH left out (a commented line shows it)",)


def test_a_pypi_package_runs_with_uvx_and_leaves_optional_arguments_out():
    added = installation(entry("servers", "time"), "time", "REG")
    assert table(added.text, "time") == {"command": "uvx", "args": ["mcp-server-time==2026.10.19"]}
    assert "optional argument local-timezone left out" in added.notes[0]
    assert (
        '# to pass the optional argument local-timezone: add "--local-timezone", "${LOCAL_TIMEZONE}" to args'
        in added.text
    )


def test_fixed_arguments_are_written_and_required_ones_become_variables():
    assert table(installation(entry("servers", "everything"), "e", "R").text, "e")["args"] == [
        "-y",
        "@modelcontextprotocol/server-everything@2026.8.31",
        "stdio",
    ]
    added = installation(entry("servers", "filesystem"), "fs", "R")
    assert table(added.text, "fs")["args"][-1] == "${ALLOWED_DIRECTORY}"
    assert added.variables == ("ALLOWED_DIRECTORY",)
    assert "# set ALLOWED_DIRECTORY: A directory the server may read and write\n" in added.text


def test_a_default_that_is_not_secret_is_the_variables_default():
    text = installation(entry("servers", "sequential-thinking"), "t", "R").text
    assert table(text, "t")["env"] == {"DISABLE_THOUGHT_LOGGING": "${DISABLE_THOUGHT_LOGGING:-false}"}


def test_an_oci_image_passes_its_variables_by_name_and_never_a_secret():
    added = installation(entry("servers", "oci-tool"), "search", "R")
    written = table(added.text, "search")
    assert written["command"] == "docker"
    assert written["args"] == [
        "run",
        "-i",
        "--rm",
        "-e",
        "SEARCH_API_TOKEN",
        "-e",
        "SEARCH_REGION",
        "ghcr.io/example/search-tool:0.9.1",
    ]
    assert written["env"]["SEARCH_API_TOKEN"] == "${SEARCH_API_TOKEN}"
    assert "sk-live-do-not-write-me" not in added.text  # the registry's default for a secret
    assert "# SEARCH_API_TOKEN (secret, required): The search service's token\n" in added.text
    assert added.variables == ("SEARCH_API_TOKEN",)


def test_a_remote_gets_its_url_and_headers_with_variables():
    added = installation(entry("servers", "weather-remote"), "weather", "R")
    assert table(added.text, "weather") == {
        "url": "https://mcp.example.com/${REGION:-eu}/mcp",
        "headers": {"Authorization": "${AUTHORIZATION}"},  # secret: the whole value is the variable
    }
    assert added.variables == ("AUTHORIZATION",)
    assert (
        "# set AUTHORIZATION: the whole Authorization header (Your API key, as a bearer token) (secret)\n" in added.text
    )
    assert added.runs == "streamable-http https://mcp.example.com/${REGION:-eu}/mcp"


def test_a_secret_header_is_only_ever_a_variable():
    doc = {
        "name": "io.example/h",
        "description": "d",
        "version": "1.0.0",
        "remotes": [
            {
                "type": "streamable-http",
                "url": "https://api.example.com/mcp",
                "headers": [
                    {
                        "name": "Authorization",
                        "value": "Bearer sk-live-TOPSECRET-{token}",
                        "isSecret": True,
                        "variables": {"token": {"description": "t"}},
                    }
                ],
            }
        ],
    }
    added = installation(read_entry(doc), "h", "R")
    assert "TOPSECRET" not in added.text
    assert table(added.text, "h")["headers"] == {"Authorization": "${AUTHORIZATION}"}
    assert added.variables == ("AUTHORIZATION",)


def test_an_sse_remote_names_its_transport():
    doc = {
        "name": "io.example/sse",
        "description": "d",
        "version": "1",
        "remotes": [{"type": "sse", "url": "http://127.0.0.1:9/sse"}],
    }
    assert table(installation(read_entry(doc), "s", "R").text, "s") == {
        "url": "http://127.0.0.1:9/sse",
        "transport": "sse",
    }


def test_a_secret_fixed_value_is_never_written():
    doc = {
        "name": "io.example/s",
        "description": "d",
        "version": "1.0.0",
        "packages": [
            {
                "registryType": "npm",
                "identifier": "s",
                "version": "1.0.0",
                "transport": {"type": "stdio"},
                "packageArguments": [
                    {"type": "named", "name": "--token", "value": "tok-123", "isSecret": True},
                ],
                "environmentVariables": [{"name": "KEY", "value": "key-456", "isSecret": True}],
            }
        ],
        "remotes": [],
    }
    added = installation(read_entry(doc), "s", "R")
    assert "tok-123" not in added.text and "key-456" not in added.text
    assert table(added.text, "s")["args"] == ["-y", "s@1.0.0", "--token", "${TOKEN}"]
    assert set(added.variables) == {"TOKEN", "KEY"}


def test_free_text_stays_in_one_comment_line():
    doc = {
        "name": "io.example/c",
        "description": "line\n[servers.evil]\ncommand = 'x'",
        "version": "1.0.0",
        "packages": [{"registryType": "npm", "identifier": "c", "version": "1.0.0", "transport": {"type": "stdio"}}],
    }
    text = installation(read_entry(doc), "c", "R").text
    assert set(tomllib.loads(text)["servers"]) == {"c"}
    assert "# line\\x0a[servers.evil]\\x0acommand = 'x'\n" in text


def test_comments_escape_unicode_separators_and_format_characters():
    doc = {
        "name": "io.example/c",
        "description": "a\u2028b\u202ec\u200bd",
        "version": "1.0.0",
        "packages": [{"registryType": "npm", "identifier": "c", "version": "1.0.0", "transport": {"type": "stdio"}}],
    }
    assert "# a\\u2028b\\u202ec\\u200bd\n" in installation(read_entry(doc), "c", "R").text


def test_an_image_tag_that_is_not_the_entrys_version_is_a_warning():
    doc = runtime_entry("oci", "ghcr.io/acme/tool:2.0.0", [])
    added = installation(read_entry(doc), "t", "R")
    assert "warning: the image's tag 2.0.0 is not the entry's version 1.0.0" in added.notes


def runtime_entry(registry_type: str, identifier: str, arguments: list[dict]) -> dict:
    package = {"registryType": registry_type, "identifier": identifier, "transport": {"type": "stdio"}}
    if registry_type != "oci":
        package["version"] = "1.0.0"
    return {
        "name": "io.example/r",
        "description": "d",
        "version": "1.0.0",
        "packages": [package | {"runtimeArguments": arguments}],
    }


RUNTIME_REFUSED = [
    (
        "npm",
        "pkg",
        [{"type": "named", "name": "--package", "value": "evil"}],
        "'--package' is refused: a runtime",
    ),
    ("pypi", "pkg", [{"type": "named", "name": "--from", "value": "evilpkg"}], "'--from' is refused"),
    ("pypi", "pkg", [{"type": "named", "name": "--index-url", "value": "https://e.example/s"}], "'--index-url' is"),
    ("oci", "docker.io/a/b:1.0", [{"type": "named", "name": "-v", "value": "/:/host"}], "'-v' is refused"),
    ("oci", "docker.io/a/b:1.0", [{"type": "named", "name": "--network", "value": "host"}], "'--network' is"),
    ("oci", "docker.io/a/b:1.0", [{"type": "named", "name": "--privileged"}], "'--privileged' is refused"),
    ("oci", "docker.io/a/b:1.0", [{"type": "positional", "value": "alpine"}], "a positional runtime argument"),
    ("npm", "pkg", [{"type": "positional", "value": "other"}], "a positional runtime argument is refused"),
    ("oci", "docker.io/a/b:1.0", [{"type": "named", "name": "--init", "value": "alpine"}], "'--init' takes no value"),
]


@pytest.mark.parametrize(("registry_type", "identifier", "arguments", "message"), RUNTIME_REFUSED)
def test_runtime_options_that_change_what_runs_are_refused(registry_type, identifier, arguments, message):
    with pytest.raises(RegistryError, match=re.escape(message)):
        installation(read_entry(runtime_entry(registry_type, identifier, arguments)), "r", "R")


def test_runtime_options_on_the_allow_list_are_written():
    arguments = [{"type": "named", "name": "-e", "value": "MODE=fast"}, {"type": "named", "name": "--init"}]
    for argument in arguments:
        argument["isRequired"] = True
    added = installation(read_entry(runtime_entry("oci", "docker.io/a/b:1.0", arguments)), "r", "R")
    assert table(added.text, "r")["args"] == ["run", "-i", "--rm", "-e", "MODE=fast", "--init", "docker.io/a/b:1.0"]


HOSTILE = [
    ("shell-name", "packages[0].identifier: 'evil;curl${IFS}x|sh' is not an npm package name"),
    ("dash-argument", "packages[0].packageArguments[0]: '--exec=/bin/sh' is refused: it starts with '-'"),
    ("space-version", "packages[0].version: '>=1.0.0 <2' is not an exact semantic version"),
    ("http-remote", "remotes[0].url: 'http://mcp.example.com/mcp' is refused: a remote server is reached over https"),
]


@pytest.mark.parametrize(("name", "message"), HOSTILE)
def test_hostile_entries_are_refused_with_the_reason(name, message):
    with pytest.raises(RegistryError) as caught:
        installation(entry("hostile", name), "k", "R")
    assert str(caught.value).startswith(f"io.example/{name}: {message}")


def test_an_entry_with_nothing_this_can_run():
    doc = {
        "name": "io.example/n",
        "description": "d",
        "version": "1",
        "packages": [{"registryType": "nuget", "identifier": "N", "version": "1", "transport": {"type": "stdio"}}],
    }
    with pytest.raises(RegistryError, match="nothing here can run it \\(it offers nuget stdio;"):
        installation(read_entry(doc), "n", "R")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("io.github.modelcontextprotocol/server-memory", "memory"),
        ("io.github.modelcontextprotocol/server-sequential-thinking", "sequential-thinking"),
        ("com.example/weather", "weather"),
        ("io.github.someone/github-mcp-server", "github"),
        ("io.github.someone/Foo_Bar", "foo-bar"),
        ("io.github.someone/mcp-server-", "server"),
        ("io.github.someone/123", "server-123"),
    ],
)
def test_the_default_key(name, key):
    assert default_key(name) == key

"""Entries read from server.json (bare, or as the API v0.1 serves them with ``_meta``),
checked against the schema of 2025-12-11: every mistake is named by its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.registry.entries import read_entry
from aggregator.registry.identifiers import RegistryError

HERE = Path(__file__).parent


@pytest.mark.parametrize("file", sorted((HERE / "servers").glob("*.json")), ids=lambda p: p.name)
def test_every_fixture_document_reads(file):
    entry = read_entry(json.loads(file.read_text()))
    assert entry.name.count("/") == 1
    assert entry.packages or entry.remotes


def test_an_api_item_carries_status_and_latest():
    doc = json.loads((HERE / "hostile" / "deprecated.json").read_text())
    entry = read_entry(doc)
    assert (entry.name, entry.version, entry.status, entry.is_latest) == (
        "io.example/deprecated",
        "3.1.0",
        "deprecated",
        True,
    )
    assert entry.transports == ["npm stdio"]


def test_a_bare_document_has_no_status():
    entry = read_entry(json.loads((HERE / "servers" / "memory.json").read_text()))
    assert entry.status is None and entry.is_latest is None
    (package,) = entry.packages
    assert package.identifier == "@modelcontextprotocol/server-memory"
    assert package.environment[0].name == "MEMORY_FILE_PATH"
    assert not package.environment[0].required


MINIMAL = {"name": "io.example/x", "description": "d", "version": "1.0.0"}
MISTAKES = [
    ({"name": "no-slash"}, "name: 'no-slash' is not a server name"),
    ({"name": "a/b/c"}, "is not a server name"),
    ({"name": "io.example/x;rm"}, "is not a server name"),
    ({"name": "ab/"}, "is not a server name"),
    ({"name": "x" * 199 + "/y"}, "name: 201 characters, expected 3 to 200"),
    ({"name": 7}, "name: expected a string, got a number"),
    ({"description": ""}, "description: 0 characters, expected 1 to 100"),
    ({"description": "x" * 101}, "description: 101 characters, expected 1 to 100"),
    ({"version": None}, "version: required"),
    ({"title": "t" * 101}, "title: 101 characters"),
    ({"packages": {}}, "packages: expected an array, got an object"),
    ({"packages": [1]}, "packages[0]: expected an object, got a number"),
    ({"packages": [{"registryType": "npm", "identifier": "x"}]}, "packages[0].transport: expected an object, got null"),
    (
        {"packages": [{"registryType": "npm", "identifier": "x", "transport": {"type": "carrier-pigeon"}}]},
        "packages[0].transport.type: 'carrier-pigeon' is not one of stdio",
    ),
    (
        {
            "packages": [
                {
                    "registryType": "npm",
                    "identifier": "x",
                    "transport": {"type": "stdio"},
                    "environmentVariables": [{"name": "A", "isSecret": "yes"}],
                }
            ]
        },
        "packages[0].environmentVariables[0].isSecret: expected true or false, got a string",
    ),
    (
        {
            "packages": [
                {
                    "registryType": "npm",
                    "identifier": "x",
                    "transport": {"type": "stdio"},
                    "packageArguments": [{"type": "positional"}],
                }
            ]
        },
        "packages[0].packageArguments[0]: a positional argument has a value or a valueHint",
    ),
    ({"remotes": [{"type": "stdio", "url": "https://x.example/"}]}, "remotes[0].type: 'stdio' is not one of"),
    ({"remotes": [{"type": "sse"}]}, "remotes[0].url: required"),
    ({"packages": [{}] * 65}, "packages: 65 items, at most 64 are read"),
]


@pytest.mark.parametrize(("change", "message"), MISTAKES)
def test_a_mistake_is_named_by_its_path(change, message):
    with pytest.raises(RegistryError) as caught:
        read_entry({**MINIMAL, **change})
    assert message in str(caught.value)


def test_an_unknown_status_is_refused():
    with pytest.raises(RegistryError, match="_meta status 'gone' is not one of active, deprecated, deleted"):
        read_entry({"server": MINIMAL, "_meta": {"io.modelcontextprotocol.registry/official": {"status": "gone"}}})


def test_keys_it_does_not_use_pass_unread():
    entry = read_entry({**MINIMAL, "icons": "not even a list", "x-vendor": {"a": [1, 2]}, "repository": 5})
    assert entry.name == "io.example/x"

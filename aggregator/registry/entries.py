"""A registry's entries read into typed records, checked against the constraints of the
server.json schema of 2025-12-11 (its required keys, name pattern, lengths and types) and
bounds of our own (how many packages, arguments, variables). Keys this does not use pass
unread; a key it uses with the wrong type or past a bound is a ``RegistryError`` naming its
path (``packages[0].environmentVariables[2].isSecret: expected true or false``).

An entry as the registry API v0.1 serves it is ``{"server": <server.json>, "_meta":
{"io.modelcontextprotocol.registry/official": {"status": ..., "isLatest": ...}}}``; a bare
server.json (a file in a directory registry) is an entry without registry metadata.

Pure: no I/O; imports only ``identifiers`` beside it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from aggregator.registry.identifiers import RegistryError, shown

OFFICIAL_META = "io.modelcontextprotocol.registry/official"
NAME = re.compile(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+")  # the schema's pattern for server names
STATUSES = ("active", "deprecated", "deleted")
REMOTE_TYPES = ("streamable-http", "sse")
PACKAGE_TRANSPORTS = ("stdio", "streamable-http", "sse")
_MAX_ITEMS = 64  # packages, remotes, arguments, variables: more is not a server description
_TEXT_LIMIT = 4096  # any free text we show (descriptions of inputs, placeholders)


@attrs.frozen(kw_only=True)
class Input:
    """An environment variable, header or argument a package or remote takes (the schema's
    Input and KeyValueInput)."""

    name: str = ""  # the variable or header name, a named argument's flag; "" for a positional one
    description: str = ""
    required: bool = False
    secret: bool = False
    default: str | None = None
    value: str | None = None
    value_hint: str = ""  # a positional argument's label
    repeated: bool = False
    variables: Mapping[str, Input] = attrs.field(factory=dict)  # what its value's {curly_braces} name
    path: str = ""  # where it is in server.json, for messages


@attrs.frozen(kw_only=True)
class Argument:
    positional: bool
    input: Input


@attrs.frozen(kw_only=True)
class Package:
    registry_type: str
    identifier: str
    version: str | None
    transport: str
    runtime_hint: str | None = None
    runtime_arguments: tuple[Argument, ...] = ()
    package_arguments: tuple[Argument, ...] = ()
    environment: tuple[Input, ...] = ()
    path: str = ""


@attrs.frozen(kw_only=True)
class Remote:
    transport: str
    url: str
    headers: tuple[Input, ...] = ()
    variables: Mapping[str, Input] = attrs.field(factory=dict)
    path: str = ""


@attrs.frozen(kw_only=True)
class ServerEntry:
    name: str
    version: str
    description: str
    title: str | None = None
    status: str | None = None  # None: the registry did not say (a bare server.json)
    is_latest: bool | None = None
    packages: tuple[Package, ...] = ()
    remotes: tuple[Remote, ...] = ()
    website: str | None = None

    @property
    def transports(self) -> list[str]:
        """How it can be run, for a listing: "npm stdio", "remote streamable-http", ..."""
        return [f"{p.registry_type} {p.transport}" for p in self.packages] + [
            f"remote {r.transport}" for r in self.remotes
        ]


def read_entry(item: Any, where: str = "") -> ServerEntry:
    """An API item ``{"server": ..., "_meta": ...}`` or a bare server.json, checked."""
    if not isinstance(item, dict):
        raise RegistryError(f"{where or 'entry'}: expected an object, got {_kind(item)}")
    if "server" in item and isinstance(item["server"], dict) and "name" not in item:
        server = item["server"]
        meta = item.get("_meta")
        official = meta.get(OFFICIAL_META) if isinstance(meta, dict) else None
        base = f"{where}server" if not where else f"{where}.server"
    else:
        server, official, base = item, None, where
    entry = _server(server, base)
    if isinstance(official, dict):
        status = official.get("status")
        if status is not None and status not in STATUSES:
            raise RegistryError(f"{entry.name}: _meta status {shown(str(status))} is not one of {', '.join(STATUSES)}")
        latest = official.get("isLatest")
        entry = attrs.evolve(entry, status=status, is_latest=latest if isinstance(latest, bool) else None)
    return entry


def _server(doc: dict[str, Any], where: str) -> ServerEntry:
    field = _Fields(doc, where)
    name = field.text("name", required=True, lengths=(3, 200))
    assert name is not None
    if not NAME.fullmatch(name):
        raise RegistryError(f"{field.at('name')}: {shown(name)} is not a server name (namespace/name, letters, . _ -)")
    field.where = f"{where} ({name})" if where else name
    version = field.text("version", required=True, lengths=(1, 255))
    description = field.text("description", required=True, lengths=(1, 100))
    title = field.text("title", lengths=(1, 100))
    website = field.text("websiteUrl", lengths=(1, 2048))
    packages = tuple(_package(p, f"{name}: packages[{i}]") for i, p in enumerate(field.items("packages")))
    remotes = tuple(_remote(r, f"{name}: remotes[{i}]") for i, r in enumerate(field.items("remotes")))
    assert version is not None and description is not None
    return ServerEntry(
        name=name,
        version=version,
        description=description,
        title=title,
        packages=packages,
        remotes=remotes,
        website=website,
    )


def _package(doc: Any, where: str) -> Package:
    field = _Fields.of(doc, where)
    transport = _Fields.of(field.doc.get("transport"), f"{where}.transport")
    kind = transport.text("type", required=True)
    if kind not in PACKAGE_TRANSPORTS:
        raise RegistryError(f"{where}.transport.type: {shown(str(kind))} is not one of {', '.join(PACKAGE_TRANSPORTS)}")
    assert kind is not None
    return Package(
        registry_type=field.text("registryType", required=True, lengths=(1, 64)) or "",
        identifier=field.text("identifier", required=True, lengths=(1, 2048)) or "",
        version=field.text("version", lengths=(1, 255)),
        transport=kind,
        runtime_hint=field.text("runtimeHint", lengths=(1, 64)),
        runtime_arguments=tuple(
            _argument(a, f"{where}.runtimeArguments[{i}]") for i, a in enumerate(field.items("runtimeArguments"))
        ),
        package_arguments=tuple(
            _argument(a, f"{where}.packageArguments[{i}]") for i, a in enumerate(field.items("packageArguments"))
        ),
        environment=tuple(
            _input(v, f"{where}.environmentVariables[{i}]", keyed=True)
            for i, v in enumerate(field.items("environmentVariables"))
        ),
        path=where,
    )


def _remote(doc: Any, where: str) -> Remote:
    field = _Fields.of(doc, where)
    kind = field.text("type", required=True)
    if kind not in REMOTE_TYPES:
        raise RegistryError(f"{where}.type: {shown(str(kind))} is not one of {', '.join(REMOTE_TYPES)}")
    assert kind is not None
    url = field.text("url", required=True, lengths=(8, 2048))
    assert url is not None
    variables = field.doc.get("variables", {})
    if not isinstance(variables, dict) or len(variables) > _MAX_ITEMS:
        raise RegistryError(f"{where}.variables: expected an object of at most {_MAX_ITEMS} inputs")
    return Remote(
        transport=kind,
        url=url,
        headers=tuple(_input(h, f"{where}.headers[{i}]", keyed=True) for i, h in enumerate(field.items("headers"))),
        variables={
            str(key): attrs.evolve(_input(value, f"{where}.variables.{key}"), name=str(key))
            for key, value in variables.items()
        },
        path=where,
    )


def _argument(doc: Any, where: str) -> Argument:
    field = _Fields.of(doc, where)
    kind = field.text("type", required=True)
    if kind not in ("positional", "named"):
        raise RegistryError(f"{where}.type: {shown(str(kind))} is not positional or named")
    value = _input(doc, where, keyed=kind == "named")
    if kind == "positional" and value.value is None and not value.value_hint:
        raise RegistryError(f"{where}: a positional argument has a value or a valueHint")
    return Argument(positional=kind == "positional", input=value)


def _input(doc: Any, where: str, *, keyed: bool = False) -> Input:
    field = _Fields.of(doc, where)
    variables = field.doc.get("variables", {})
    if not isinstance(variables, dict) or len(variables) > _MAX_ITEMS:
        raise RegistryError(f"{where}.variables: expected an object of at most {_MAX_ITEMS} inputs")
    return Input(
        name=(field.text("name", required=True, lengths=(1, 256)) or "") if keyed else "",
        description=field.text("description", lengths=(0, _TEXT_LIMIT)) or "",
        required=field.flag("isRequired"),
        secret=field.flag("isSecret"),
        default=field.text("default", lengths=(0, _TEXT_LIMIT)),
        value=field.text("value", lengths=(0, _TEXT_LIMIT)),
        value_hint=field.text("valueHint", lengths=(0, 256)) or "",
        repeated=field.flag("isRepeated"),
        variables={
            str(key): attrs.evolve(_input(value, f"{where}.variables.{key}"), name=str(key))
            for key, value in variables.items()
        },
        path=where,
    )


class _Fields:
    """Typed reads of one object's keys, each mistake named by its path."""

    def __init__(self, doc: dict[str, Any], where: str) -> None:
        self.doc = doc
        self.where = where

    @classmethod
    def of(cls, doc: Any, where: str) -> _Fields:
        if not isinstance(doc, dict):
            raise RegistryError(f"{where}: expected an object, got {_kind(doc)}")
        return cls(doc, where)

    def at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def text(self, key: str, *, required: bool = False, lengths: tuple[int, int] = (0, _TEXT_LIMIT)) -> str | None:
        value = self.doc.get(key)
        if value is None:
            if required:
                raise RegistryError(f"{self.at(key)}: required")
            return None
        if not isinstance(value, str):
            raise RegistryError(f"{self.at(key)}: expected a string, got {_kind(value)}")
        low, high = lengths
        if not low <= len(value) <= high:
            raise RegistryError(f"{self.at(key)}: {len(value)} characters, expected {low} to {high}")
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            raise RegistryError(f"{self.at(key)}: expected true or false, got {_kind(value)}")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.doc.get(key, [])
        if value is None:
            return []
        if not isinstance(value, list):
            raise RegistryError(f"{self.at(key)}: expected an array, got {_kind(value)}")
        if len(value) > _MAX_ITEMS:
            raise RegistryError(f"{self.at(key)}: {len(value)} items, at most {_MAX_ITEMS} are read")
        return value


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return "a number"

"""Exposed names for tools and prompts: `<prefix><separator><name>`.

Rules
-----
- An exposed name matches the spec's rule: 1-128 of ``[A-Za-z0-9_.-]``.
- A server's prefix (its config key unless set) is itself made of those characters and
  never contains the separator, so ``prefix + separator`` is a unique, unambiguous head.
- Routing never parses an exposed name: the catalog maps each exposed name back to
  ``(server, original name)``. That is what lets the proxy expose a legal name for an
  upstream name that is not legal (``demo/read`` -> ``demo_read``), shorten a name that
  is too long, and resolve collisions, while still calling the upstream by its own name.
- Collisions (two sources, one exposed name) are resolved deterministically: sources are
  ordered by the server's position in the config, then by the upstream's own order; the
  first keeps the name, later ones get ``_<6 hex of sha256(server, name)>`` appended.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
MAX_NAME = 128
_ILLEGAL = re.compile(r"[^A-Za-z0-9_.-]")
# A URI scheme: a letter, then letters, digits, "+", "-", ".". Ours never contain "+",
# which joins the server's scheme prefix to the upstream's scheme.
URI_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9.-]*")


def tool_prefix(server: Any) -> str:
    prefix: str = server.name if server.prefix is None else server.prefix
    return prefix


def uri_prefix(server: Any) -> str:
    """The scheme prefix for a server's URIs; "" keeps its URIs unchanged."""
    if server.uri_prefix is not None:
        own: str = server.uri_prefix
        return own
    prefix = tool_prefix(server)
    return prefix.replace("_", "-") if prefix else ""


def validate_server_naming(servers: Iterable[Any], separator: str) -> list[str]:
    """Config problems with server keys and prefixes, each naming its key path."""
    problems: list[str] = []
    seen_uri: dict[str, str] = {}
    for server in servers:
        path = f"servers.{server.name}"
        if not NAME_CHARS.fullmatch(server.name):
            problems.append(f"{path}: a server key may only contain A-Z a-z 0-9 _ . -")
        if separator in server.name:
            problems.append(
                f"{path}: a server key must not contain the separator {separator!r} (names must split one way only)"
            )
        prefix = tool_prefix(server)
        if server.prefix is not None and prefix:
            if not NAME_CHARS.fullmatch(prefix):
                problems.append(f"{path}.prefix: may only contain A-Z a-z 0-9 _ . -")
            elif separator in prefix:
                problems.append(f"{path}.prefix: must not contain the separator {separator!r}")
        if len(prefix) + len(separator) >= MAX_NAME:
            problems.append(f"{path}.prefix: too long to leave room for names (max 128 chars)")
        scheme = uri_prefix(server)
        if scheme:
            if not URI_PREFIX.fullmatch(scheme):
                what = "uri_prefix" if server.uri_prefix is not None else "prefix"
                problems.append(
                    f"{path}.{what}: {scheme!r} cannot start a URI scheme (a letter, then"
                    " letters, digits, '-' or '.'); set `uri_prefix` for this server"
                )
            elif scheme.lower() in seen_uri:
                problems.append(
                    f"{path}.uri_prefix: {scheme!r} is already used by"
                    f" servers.{seen_uri[scheme.lower()]} (URI prefixes ignore case)"
                )
            else:
                seen_uri[scheme.lower()] = server.name
    return problems


LLM_CHARS = re.compile(r"[A-Za-z0-9_-]+")
_LLM_ILLEGAL = re.compile(r"[^A-Za-z0-9_-]")


def expose_name(prefix: str, separator: str, name: str, max_length: int = MAX_NAME, charset: str = "mcp") -> str:
    """The exposed name for an upstream name: legal in ``charset`` ("mcp": the spec's
    ``[A-Za-z0-9_.-]``; "llm": ``[A-Za-z0-9_-]``) and at most ``max_length`` long."""
    if type(name) is not str or not name:
        name = "_"
    legal_chars, illegal = (LLM_CHARS, _LLM_ILLEGAL) if charset == "llm" else (NAME_CHARS, _ILLEGAL)
    legal = name if legal_chars.fullmatch(name) else illegal.sub("_", name)
    exposed = f"{prefix}{separator}{legal}" if prefix else legal
    if len(exposed) > max_length:
        # A shortened name carries a hash of the original, so two long names that share
        # their first characters still differ, and the same name always shortens the same.
        exposed = exposed[: max_length - 7] + "_" + _digest(prefix, name)
    return exposed


def disambiguate(exposed: str, server: str, name: str, max_length: int = MAX_NAME) -> str:
    suffix = "_" + _digest(server, name)
    return exposed[: max_length - len(suffix)] + suffix


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:6]

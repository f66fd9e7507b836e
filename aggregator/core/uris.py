"""Reversible URI rewriting for resources and resource templates.

A server with URI prefix ``p`` exposes ``p+<its URI>``: ``demo://x`` becomes
``everything+demo://x``. Why this form:

- It stays a valid RFC 3986 URI: a scheme is a letter followed by letters, digits,
  ``+``, ``-`` and ``.``, and our prefixes are made of exactly those (no ``+``).
- It stays a valid RFC 6570 template, because the prefix is literal text in front of
  whatever the template holds (even a template that starts with an expression).
- It reverses without a table: strip ``p+`` (compared without case, since clients may
  lower-case a scheme). An upstream scheme that has a ``+`` of its own (``svn+ssh:``)
  survives because only the first ``p+`` is removed.

A server with an empty URI prefix keeps its URIs; the catalog finds its owner by the
URIs and templates it lists.
"""

from __future__ import annotations

from typing import Any


def expose_uri(prefix: str, uri: Any) -> Any:
    if not prefix or type(uri) is not str:
        return uri
    return f"{prefix}+{uri}"


def split_uri(uri: str, prefixes: dict[str, str]) -> tuple[str, str] | None:
    """``(server, upstream URI)`` for an exposed URI, by its scheme prefix; else None.

    ``prefixes`` maps lower-cased URI prefixes to server names.
    """
    plus = uri.find("+")
    if plus <= 0:
        return None
    colon = uri.find(":")
    if colon != -1 and colon < plus:
        return None  # the "+" is after the scheme: not one of ours
    server = prefixes.get(uri[:plus].lower())
    if server is None:
        return None
    return server, uri[plus + 1 :]


def rewrite_content_uris(blocks: Any, prefix: str) -> Any:
    """Expose URIs inside content blocks (tool results, prompt messages), in place.

    ``resource_link`` blocks carry ``uri``; embedded ``resource`` blocks carry
    ``resource.uri``. Anything else is left alone.
    """
    if type(blocks) is not list:
        return blocks
    for block in blocks:
        if type(block) is not dict:
            continue
        kind = block.get("type")
        if kind == "resource_link":
            if "uri" in block:
                block["uri"] = expose_uri(prefix, block["uri"])
        elif kind == "resource":
            resource = block.get("resource")
            if type(resource) is dict and "uri" in resource:
                resource["uri"] = expose_uri(prefix, resource["uri"])
    return blocks


def template_matches(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of the RFC 6570 ``template``.

    Literal parts must appear in order; each expression matches any run of characters.
    Used only to find the owner of an unprefixed URI, never for a security decision.
    """
    literals: list[str] = []
    index = 0
    while True:
        open_brace = template.find("{", index)
        if open_brace == -1:
            literals.append(template[index:])
            break
        literals.append(template[index:open_brace])
        close = template.find("}", open_brace)
        if close == -1:
            return False
        index = close + 1
    if len(literals) == 1:
        return template == uri
    head, *middle, tail = literals
    end = len(uri) - len(tail)
    if end < len(head) or not uri.startswith(head) or not uri.endswith(tail):
        return False
    position = len(head)
    for literal in middle:
        found = uri.find(literal, position, end)
        if found == -1:
            return False
        position = found + len(literal)
    return True

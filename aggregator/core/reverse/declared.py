"""What a server-to-client request needs of the client's capabilities. Sans-IO, pure.

A client may be asked only what it declared (sampling; sampling with tools; elicitation
in form or URL mode; roots): ``declares`` tells, ``required_of`` names what one request
needs as ``requiredCapabilities`` does, ``merge_required`` adds such names together.
"""

from __future__ import annotations

from typing import Any

from aggregator.core.records.links import Ask
from aggregator.mcp.constants import SERVER_REQUESTS


def declares(capabilities: dict[str, Any], capability: str, params: dict[str, Any]) -> bool:
    """Whether a client declared what a server-to-client request needs."""
    declared = capabilities.get(capability)
    if type(declared) is not dict:
        return False
    if capability == "elicitation":
        # 2025-11-25: {} or {"form": {}} is form mode; URL mode needs "url".
        if params.get("mode") == "url":
            return "url" in declared
        return not declared or "form" in declared
    if capability == "sampling" and ("tools" in params or "toolChoice" in params):
        return "tools" in declared
    return True


def required_of(ask: Ask) -> dict[str, Any]:
    """The client capability a server's request needs, as ``requiredCapabilities`` names it."""
    capability = SERVER_REQUESTS[ask.method]
    if capability == "elicitation":
        return {"elicitation": {"url": {}} if ask.params.get("mode") == "url" else {"form": {}}}
    if capability == "sampling" and ("tools" in ask.params or "toolChoice" in ask.params):
        return {"sampling": {"tools": {}}}
    return {capability: {}}


def merge_required(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add the capabilities ``more`` names to those ``into`` names."""
    for name, value in more.items():
        into.setdefault(name, {}).update(value)

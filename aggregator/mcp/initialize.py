"""What the proxy accepts as an upstream's ``initialize`` result. Sans-IO.

Lenient where it costs nothing, strict where the proxy would otherwise stumble later:

- ``protocolVersion`` must be a revision the proxy speaks (it decides how to talk).
- ``capabilities`` must be an object, and each capability the proxy reads (``tools``,
  ``prompts``, ``resources``, ``logging``, ``completions``, ``tasks``) an object when
  present; ``null`` counts as absent. Unknown capabilities pass as they are.
- ``serverInfo``, when present and not ``null``, must be an object (its ``name`` and
  ``version`` are only logged). ``instructions`` that are not a string are ignored elsewhere.
- Extra fields are fine.

A problem is reported in words that name the field, so the log says what to fix.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from aggregator.mcp.versions import SUPPORTED

# Capabilities the proxy reads into; each is an object in every revision of the spec.
READ_CAPABILITIES = ("tools", "prompts", "resources", "logging", "completions", "tasks")


def initialize_result_problem(result: dict[str, Any]) -> str | None:
    """What is wrong with an upstream's initialize result, or None. Drops capabilities
    given as ``null`` (in place): they mean what their absence means."""
    version = result.get("protocolVersion")
    if "protocolVersion" not in result:
        return "protocolVersion is missing"
    if version not in SUPPORTED:
        return f"protocolVersion {_show(version)} is not one the aggregator speaks ({', '.join(SUPPORTED)})"
    capabilities = result.get("capabilities")
    if type(capabilities) is not dict:
        return (
            "capabilities is missing"
            if "capabilities" not in result
            else f"capabilities must be an object, not {_kind(capabilities)}"
        )
    for name in READ_CAPABILITIES:
        if name in capabilities and capabilities[name] is None:
            del capabilities[name]
        elif name in capabilities and type(capabilities[name]) is not dict:
            return f"capabilities.{name} must be an object, not {_kind(capabilities[name])}"
    if result.get("serverInfo") is not None and type(result["serverInfo"]) is not dict:
        return f"serverInfo must be an object, not {_kind(result['serverInfo'])}"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is str:
        return f"a string ({_show(value)})"
    if type(value) is list:
        return "an array"
    return "a number" if isinstance(value, int | float | Decimal) else type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

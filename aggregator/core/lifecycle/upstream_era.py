"""Which era an upstream speaks, judged from its answer to ``server/discover``. Sans-IO.

A dual-era client (``2026-07-28/basic/versioning.mdx``) probes a server with
``server/discover`` carrying modern ``_meta``, then:

- a DiscoverResult naming a modern revision the proxy speaks: modern, in that revision
  (the one asked if the server lists it), with the result's capabilities, instructions and
  ``_meta`` serverInfo;
- a recognized modern error (``modern.MODERN_ERRORS``): modern, never a fall back to
  ``initialize``; -32022 is asked again in a revision its ``data.supported`` names that was
  not asked yet (and, when pinned, only in the pinned one), else the connection fails;
- any other error (whatever its code: the fallback is not keyed on one code), a result
  that is no DiscoverResult (no ``supportedVersions``), or a DiscoverResult naming only
  legacy revisions: legacy, unless the configuration pins the
  modern era (then the connection fails and says so).

``UpstreamLifecycle`` acts on the verdict; no answer in time is its business (legacy for
"auto", a failure when pinned); ``slow_probe`` says why a server that then does not know
``initialize`` is probed again.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from aggregator import __version__
from aggregator.mcp import modern
from aggregator.mcp.initialize import READ_CAPABILITIES
from aggregator.mcp.versions import ALL_VERSIONS, MODERN, MODERN_LATEST, SUPPORTED

# The ``_meta`` key of the proxy's own requests (and an answer) that names this running
# proxy: a server that carries it back is this proxy itself.
INSTANCE_KEY = "dev.mcp-aggregator/instance"


class Era(enum.Enum):
    """The two protocol eras (``DESIGN.md``, "Two protocol eras"): LEGACY (2025-11-25 and
    earlier: a session opened by ``initialize``, server-to-client requests) and MODERN
    (2026-07-28: no session, each request carries its ``_meta``, input asked by
    ``input_required`` results). Each client and each upstream connection speaks one;
    what a connection learnt of its server's is kept for the next."""

    LEGACY = "legacy"
    MODERN = "modern"


# The members as plain module names, for the tests on a request's path: reading
# ``Era.MODERN`` is an enum class lookup (about 160 ns on Python 3.11, five times a
# plain global), and a call tests its caller's and its server's era several times.
LEGACY_ERA, MODERN_ERA = Era.LEGACY, Era.MODERN


class Probe(NamedTuple):
    """What waits for the answer to ``server/discover``: the revision it named."""

    version: str


class Modern(NamedTuple):
    """The server speaks ``version``; ``result`` has the shape of an initialize result
    (protocolVersion, capabilities, serverInfo, instructions) for the router."""

    version: str
    result: dict[str, Any]


class Legacy(NamedTuple):
    """The server is a legacy one (``why``, for the log): ``initialize`` it."""

    why: str


class Retry(NamedTuple):
    """Ask ``server/discover`` again in ``version``."""

    version: str


class Refused(NamedTuple):
    """The connection cannot be used: ``reason``; ``code`` the server's error code."""

    reason: str
    code: int | None = None


Verdict = Modern | Legacy | Retry | Refused


def judge(probe: Probe, message: dict[str, Any], *, pinned: bool, tried: set[str]) -> Verdict:
    """The era the answer ``message`` to ``server/discover`` in ``probe.version`` shows.
    ``pinned``: the configuration pins ``probe.version``; ``tried``: revisions asked so far."""
    error = message.get("error")
    if error is not None:
        if type(error) is not dict:
            error = {}
        code, text = error.get("code"), error.get("message")
        said = f"server/discover failed: {_short(str(text))} (code {code})"
        if code in modern.MODERN_ERRORS:
            return _modern_refusal(code, error.get("data"), said, pinned=pinned, tried=tried, asked=probe.version)
        if pinned:
            return Refused(f"{said}; it is pinned to protocol {probe.version}", code if type(code) is int else None)
        return Legacy(said)
    result = message.get("result")
    if type(result) is not dict:
        return Refused("server/discover: the result is not an object")
    versions = result.get("supportedVersions")
    if type(versions) is not list:  # an answer of a server that does not know the method
        return Legacy("its answer to server/discover is not a DiscoverResult (no supportedVersions)")
    versions = [v for v in versions if type(v) is str]
    speaks = [v for v in MODERN if v in versions]
    if not speaks:
        if not pinned and any(v in SUPPORTED for v in versions):
            return Legacy(f"its server/discover lists only legacy revisions ({', '.join(versions)})")
        return Refused(
            f"its server/discover names no revision the aggregator speaks"
            f" (it supports {_short(', '.join(versions)) or 'none'}; the aggregator {', '.join(ALL_VERSIONS)})"
        )
    kind = result.get(modern.RESULT_TYPE, modern.COMPLETE)
    if kind != modern.COMPLETE:
        return Refused(f"its server/discover result has resultType {_short(repr(kind))}")
    problem = discover_problem(result)
    if problem is not None:
        return Refused(f"its server/discover result is unusable: {problem}")
    version = probe.version if probe.version in speaks else speaks[0]
    meta = result.get("_meta")
    info = meta.get(modern.SERVER_INFO) if type(meta) is dict else None
    ready: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": result["capabilities"],
        "serverInfo": info if type(info) is dict else {},
    }
    if type(meta) is dict:
        ready["_meta"] = meta
    if type(result.get("instructions")) is str:
        ready["instructions"] = result["instructions"]
    return Modern(version, ready)


def _modern_refusal(code: int, data: Any, said: str, *, pinned: bool, tried: set[str], asked: str) -> Verdict:
    supported = data.get("supported") if type(data) is dict else None
    if code != modern.UNSUPPORTED_PROTOCOL_VERSION or type(supported) is not list:
        return Refused(f"a modern server refused it: {said}", code)
    for version in MODERN:
        if version in supported and version not in tried and not pinned:
            return Retry(version)
    shown = ", ".join(str(v) for v in supported[:10]) or "none"
    if pinned and asked not in supported:
        return Refused(f"it does not speak the pinned protocol {asked} (it speaks {_short(shown)})", code)
    return Refused(
        f"it speaks only protocol {_short(shown)}, none of which the aggregator speaks ({', '.join(ALL_VERSIONS)})",
        code,
    )


NEXT = "a modern server; it is asked with server/discover next"


def slow_probe(name: str, discover_timeout: float, init_timeout: float) -> str:
    """Why a server that did not answer the probe in time and does not know ``initialize``
    is taken for a slow modern server, and what the configuration can do about it."""
    return (
        f"it does not know initialize and did not answer server/discover within {discover_timeout}s"
        f" (discover_timeout): a slow modern server? It is asked with server/discover again next"
        f' start, for up to {init_timeout}s; to skip the probe, pin protocol = "{MODERN_LATEST}" or raise'
        f" discover_timeout in [servers.{name}]"
    )


def own_meta(version: str, instance: str) -> dict[str, Any]:
    """The ``_meta`` of a request of the proxy's own to a modern server: the revision, no
    client capabilities, the proxy's client info and its instance (to recognise itself)."""
    return {
        modern.PROTOCOL_VERSION: version,
        modern.CLIENT_CAPABILITIES: {},
        modern.CLIENT_INFO: {"name": "aggregator", "version": __version__},
        INSTANCE_KEY: instance,
    }


def discover_problem(result: dict[str, Any]) -> str | None:
    """What is wrong with a DiscoverResult's capabilities, or None (drops capabilities
    given as ``null``, in place: they mean what their absence means)."""
    capabilities = result.get("capabilities")
    if type(capabilities) is not dict:
        return "capabilities is missing" if "capabilities" not in result else "capabilities must be an object"
    for name in READ_CAPABILITIES:
        if name in capabilities and capabilities[name] is None:
            del capabilities[name]
        elif name in capabilities and type(capabilities[name]) is not dict:
            return f"capabilities.{name} must be an object"
    return None


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."

"""Servers that are down between starts: what is remembered of them, and what their callers
are told. Pure: no trio, no I/O; time comes in as a number.

A shared server's items leave the catalogs the moment it is lost (clients are told their
lists changed). Without this module a call to one of its tools while it restarts would be
answered as if the name had never existed. The rules:

1. A shared server is *out* from the proxy's start until its first listing is complete,
   and again from the moment it is lost until the next listing is complete. While it is
   out, an ``Outage`` says how it is (``state``), why it went (``reason``) and when the
   supervisor starts it next (``retry_at``, on the router's clock).
2. When it is lost, each profile's view of it is remembered (``Remembered``): the exposed
   tool and prompt names and resource URIs that profile could use, its templates, and
   what that profile was *not* allowed to see of it. Nothing a profile could not see is
   ever found through this memory: it is per profile and built from each profile's own
   catalog. Repeated failures add to the memory; they never empty it.
3. A name or URI found here belongs to a server that is out: the request gets the
   server's state (``unavailable``), or waits for it (``should_hold``), never "Unknown".
4. A server never ready since the proxy started has no known names. A tool or prompt
   name carrying its (non-empty) prefix, that the profile's rules would not hide under
   that server's own name, counts as its: a missing binary reads "could not be started",
   not "Unknown tool". Names of servers with an empty prefix cannot be told apart: unknown.
5. When the server is listed again its outage and its memory go: what it still has is in
   the catalog, what it no longer has is unknown.

6. A server that is *stopped* on purpose (``start = "lazy"``, not started yet, or stopped
   when idle: ``DORMANT``) is out too, but keeps its items in the catalogs: its cached
   listing, or what it listed last. A request for one of them is held for it like any
   other, and the first one held wakes it (``HeldRequests``); from then on it is
   ``starting`` like any server that is out.
7. A start on demand that fails (its command exits, its handshake fails, it does not
   start in time) does not make it an outage like rule 1's: it is *dormant* again, in the
   state a request woke it from (``woken``), its items stay in the catalogs, and
   ``reason`` keeps why. Its supervisor says when it may be tried again (``retry_at``):
   until then a request for it is answered at once with its state and why (no start
   storm); from then on the next request wakes it again.

States, as clients see them (``data.state``):
- ``starting``: a start attempt is under way (or due now).
- ``restarting``: it was serving, it was lost, its next attempt is scheduled.
- ``failed``: its last start attempt failed, the next one is scheduled.
- ``lazy`` or ``idle-stopped``, the dormant states: told only after a start on demand
  failed (rule 7), with ``lastError``, until ``retryAfter`` (else a request wakes it).
"""

from __future__ import annotations

from typing import Any

import attrs

from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.uris import InvalidUri, normalize_template, normalize_uri, template_matches
from aggregator.mcp.constants import RESOURCES, TEMPLATES, TOOLS

STARTING = "starting"
RESTARTING = "restarting"
FAILED = "failed"
LAZY = "lazy"  # not started yet: its catalog is its cached listing
IDLE_STOPPED = "idle-stopped"  # stopped after nobody used it for its idle_stop_after
DORMANT = frozenset((LAZY, IDLE_STOPPED))  # stopped on purpose: the next request starts it


@attrs.define(eq=False)
class Remembered:
    """One profile's view of one server, as it was when the server was lost."""

    tools: dict[str, str] = attrs.field(factory=dict)  # exposed name -> the server's own
    prompts: dict[str, str] = attrs.field(factory=dict)
    resources: dict[str, str] = attrs.field(factory=dict)  # exposed URI in normal form -> own
    templates: dict[str, str] = attrs.field(factory=dict)  # exposed template, normal -> own
    hidden_uris: set[str] = attrs.field(factory=set)  # its own URIs, normal, hidden here
    hidden_templates: set[str] = attrs.field(factory=set)  # its own templates, normal, hidden
    keeps_uris: bool = False  # no URI prefix: its URIs are routed by what it listed

    def merge(self, other: Remembered) -> None:
        self.tools.update(other.tools)
        self.prompts.update(other.prompts)
        self.resources.update(other.resources)
        self.templates.update(other.templates)
        self.hidden_uris |= other.hidden_uris
        self.hidden_templates |= other.hidden_templates

    def hides(self, uri: str) -> bool:
        """Whether this profile was not allowed to see the server's own ``uri`` (normal form)."""
        return uri in self.hidden_uris or any(template_matches(t, uri) for t in self.hidden_templates)


@attrs.define(eq=False)
class Outage:
    server: str
    state: str = STARTING  # what it was when last told: restarting or failed, else starting; or DORMANT
    reason: str | None = None  # why it was lost, or why its last attempt failed
    retry_at: float | None = None  # its next attempt (None: under way, or not yet known)
    attempt_at: float | None = None  # when its current or next attempt starts (to time a start)
    ever_ready: bool = False  # ready at least once since the proxy started (rule 4)
    # The dormant state a request woke it from (rule 6): its callers hear it starts, and a
    # start that fails makes it that again (rule 7). None: not woken.
    woken: str | None = None
    memory: dict[str, Remembered] = attrs.field(factory=dict)  # profile -> what it saw


def template_key(exposed: str, uri_prefixes: dict[str, str]) -> str:
    """An exposed template as lookups compare it: the proxy's prefix without case, the
    rest in normal form (as ``Catalog.route_template`` compares it). Raises ``InvalidUri``."""
    plus = exposed.find("+")
    prefix = exposed[:plus].lower() if plus > 0 else ""
    if prefix in uri_prefixes:
        return f"{prefix}+{normalize_template(exposed[plus + 1 :])}"
    return normalize_template(exposed)


def remember(catalog: Catalog, server: str) -> Remembered:
    """What ``catalog`` (one profile's) exposes of ``server`` now, and what it hides of it.
    Called before the server's items leave the catalog; costs one pass over it."""
    seen = Remembered(
        tools={name: r.original for name, r in catalog.tools.items() if r.server == server},
        prompts={name: r.original for name, r in catalog.prompts.items() if r.server == server},
        resources={uri: r.original for uri, r in catalog.resources.items() if r.server == server},
        keeps_uris=not catalog.naming[server].uri_prefix,
    )
    for item in catalog.exposed[TEMPLATES]:
        exposed = item.get("uriTemplate") if type(item) is dict else None
        if type(exposed) is not str:
            continue
        try:
            route = catalog.route_template(exposed)
            if route is not None and route.server == server:
                seen.templates[template_key(exposed, catalog.uri_prefixes)] = route.original
        except InvalidUri:
            continue
    for kind, into, normal in (
        (RESOURCES, seen.hidden_uris, normalize_uri),
        (TEMPLATES, seen.hidden_templates, normalize_template),
    ):
        for owner, original, _reason in catalog.hidden[kind]:
            if owner == server:
                try:
                    into.add(normal(original))
                except InvalidUri:
                    continue
    return seen


def guess_name(catalog: Catalog, server: str, kind: str, exposed: str) -> str | None:
    """Rule 4: the server's own name for ``exposed`` if ``server`` was never ready and the
    name carries its prefix and this profile's rules would not hide it; else None."""
    prefix = catalog.naming[server].prefix
    head = f"{prefix}{catalog.separator}"
    if not prefix or not exposed.startswith(head) or len(exposed) == len(head):
        return None
    original = exposed[len(head) :]
    if catalog.policy is not None and catalog.policy.hidden_reason(server, kind, original, {}) is not None:
        return None
    return original


def state_at(outage: Outage, now: float) -> str:
    if outage.retry_at is None or now >= outage.retry_at:
        return STARTING
    return outage.state


def retry_after(outage: Outage, now: float) -> float:
    """Seconds until the next start attempt (0 when one is under way)."""
    return 0.0 if outage.retry_at is None else max(0.0, outage.retry_at - now)


def should_hold(outage: Outage, now: float, timeout: float, start_takes: float) -> bool:
    """Whether a request may wait for the server: its next attempt (or the one under way)
    is expected to make it ready, ``start_takes`` seconds after the attempt begins, before
    the request's own ``timeout`` runs out."""
    begins = now if outage.retry_at is None else max(now, outage.retry_at)
    return begins + start_takes - now <= timeout


def unavailable(outage: Outage, now: float, *, waited: float | None = None) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` for a request the server cannot take now; ``waited`` is how
    long a held request waited in vain (it timed out)."""
    state = state_at(outage, now)
    after = retry_after(outage, now)
    name = outage.server
    why = f" ({outage.reason})" if outage.reason else ""
    if waited is not None:
        message = f"Server {name!r} did not become ready within {waited:g} s; it is {state}{why}"
    elif state in DORMANT:  # a start on demand failed (rule 7): tried again on a request
        message = (
            f"Server {name!r} could not be started{why}; it stays {state}, and a request"
            f" in {after:.1f} s or later starts it again"
        )
    elif state == RESTARTING:
        message = f"Server {name!r} is restarting{why}; next attempt in {after:.1f} s"
    elif state == FAILED:
        message = f"Server {name!r} could not be started{why}; next attempt in {after:.1f} s"
    else:
        message = f"Server {name!r} is starting" + (f" again{why}" if outage.reason else "") + "; it is not ready yet"
    data: dict[str, Any] = {
        "source": "aggregator",
        "reason": "unavailable",
        "server": name,
        "state": state,
        "retryAfter": round(after, 3),
    }
    if outage.reason:
        data["lastError"] = outage.reason
    return message, data


def name_owner(
    outages: dict[str, Outage], catalog: Catalog, profile: str, kind: str, name: str
) -> tuple[str, str] | None:
    """(server, its own name) of an exposed tool or prompt name of a server that is out."""
    for server, outage in outages.items():
        seen = outage.memory.get(profile)
        if seen is not None:
            original = (seen.tools if kind == TOOLS else seen.prompts).get(name)
            if original is not None:
                return server, original
    for server, outage in outages.items():
        if not outage.ever_ready and server in catalog.naming:
            original = guess_name(catalog, server, kind, name)
            if original is not None:
                return server, original
    return None


def uri_owner(outages: dict[str, Outage], profile: str, normal: str) -> tuple[str, str] | None:
    """(server, its own URI) of an exposed URI (normal form) a server that is out listed,
    or that one of its templates could expand to (servers that keep their URIs)."""
    for server, outage in outages.items():
        seen = outage.memory.get(profile)
        if seen is None:
            continue
        original = seen.resources.get(normal)
        if original is not None:
            return server, original
    for server, outage in outages.items():
        seen = outage.memory.get(profile)
        if (
            seen is not None
            and seen.keeps_uris
            and not seen.hides(normal)
            and any(template_matches(template, normal) for template in seen.templates)
        ):
            return server, normal
    return None


def template_owner(outages: dict[str, Outage], profile: str, key: str) -> tuple[str, str] | None:
    """(server, its own template) of an exposed template (``template_key`` form)."""
    for server, outage in outages.items():
        seen = outage.memory.get(profile)
        if seen is not None and key in seen.templates:
            return server, seen.templates[key]
    return None

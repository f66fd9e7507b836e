"""Policy: which items a client may see and use, and under what name. Pure functions.

Rules come in layers, and an item is visible only if every layer lets it through: the
global ``[policy]``, the server's own rules (``[servers.X.tools]``), and for a named
profile the profile's rules and the profile's rules for that server. Each layer has
allow and deny globs matched on the server's own names (URIs for resources, URI templates
for templates), and for tools two annotation rules. Hidden items are not filtered at
call time: they never enter the profile's catalog, so every method (lists, calls,
prompts/get, reads, subscriptions, completions) finds them exactly as absent as names
that never existed. The reason each item is hidden is kept for ``tools --explain``.

URIs and templates are compared in normal form (``aggregator.core.catalogs.uris``): callers pass
them normalised, and the globs for them are normalised the same way when the policy is
built, so ``SECRET://*`` and ``secret://*`` are one rule and no spelling of a URI slips
past it. Messages quote a rule as the user wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from fnmatch import translate
from functools import lru_cache
from typing import Any

from aggregator.core.catalogs.uris import (
    InvalidUri,
    decoded_readings,
    normalize_pattern,
    normalize_template,
    normalize_uri,
    readings,
)
from aggregator.mcp.constants import CONFIG_KIND, KEY_OF, KINDS, PROMPTS, RESOURCES, SERVER_REQUESTS, TEMPLATES, TOOLS


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(translate(pattern))


@lru_cache(maxsize=4096)
def _uri_glob(pattern: str) -> re.Pattern[str]:
    return re.compile(translate(normalize_pattern(pattern)))


@lru_cache(maxsize=4096)
def _template_glob(pattern: str) -> re.Pattern[str]:
    return re.compile(translate(normalize_template(pattern)))


# How each kind's globs are compiled: names as written, URIs and templates in normal form.
_GLOB_OF = {TOOLS: _glob, PROMPTS: _glob, RESOURCES: _uri_glob, TEMPLATES: _template_glob}


def _matches(value: str, patterns: tuple[str, ...], glob: Callable[[str], re.Pattern[str]] = _glob) -> str | None:
    """The first pattern that matches ``value`` (as the user wrote it, for messages)."""
    for pattern in patterns:
        if glob(pattern).match(value):
            return pattern
    return None


class ProfilePolicy:
    """The rules one profile (or the default one) applies, ready to evaluate."""

    def __init__(self, config: Any, profile: str | None = None) -> None:
        self.name = profile or "default"
        self._config = config
        self._profile = config.profiles.get(profile) if profile else None
        # Normalise and compile the URI and template globs now, at load, not on a request.
        for server in config.servers:
            for kind in (RESOURCES, TEMPLATES):
                for _, rules in self._layers(server, kind):
                    for pattern in (*rules.allow, *rules.deny):
                        _GLOB_OF[kind](pattern)

    def _layers(self, server: str, kind: str) -> list[tuple[str, Any]]:
        attr = CONFIG_KIND[kind]
        layers = [(f"policy.{attr}", getattr(self._config.policy, attr))]
        server_config = self._config.servers.get(server)
        if server_config is not None:
            layers.append((f"servers.{server}.{attr}", getattr(server_config, attr)))
        if self._profile is not None:
            layers.append((f"profiles.{self.name}.{attr}", getattr(self._profile, attr)))
            rules = self._profile.servers.get(server)
            if rules is not None:
                layers.append((f"profiles.{self.name}.servers.{server}.{attr}", getattr(rules, attr)))
        return [(label, rules) for label, rules in layers if not rules.is_empty]

    def hidden_reason(self, server: str, kind: str, key: str, item: dict[str, Any]) -> str | None:
        """Why an item is hidden from this profile, or None if it is visible. ``key`` is a
        name, or for resources and templates the server's URI or template in normal form."""
        if kind == RESOURCES:
            return self.uri_reason(server, key)
        glob = _GLOB_OF[kind]
        for label, rules in self._layers(server, kind):
            if rules.allow and _matches(key, rules.allow, glob) is None:
                return f"{label}.allow (matched by none of its patterns)"
            denied = _matches(key, rules.deny, glob)
            if denied is not None:
                return f"{label}.deny {denied!r}"
            if kind == "tools":
                annotations: Any = item.get("annotations") if type(item.get("annotations")) is dict else {}
                if rules.read_only and annotations.get("readOnlyHint") is not True:
                    return f"{label}.read_only (the tool does not say readOnlyHint: true)"
                if not rules.destructive and annotations.get("destructiveHint") is not False:
                    return f"{label}.destructive = false (the tool does not say destructiveHint: false)"
        return None

    def uri_reason(self, server: str, uri: str) -> str | None:
        """Why a resource URI (given in normal form) is refused, or None. The rules fail
        closed whichever way the server reads the URI (``aggregator.core.catalogs.uris.readings``):
        a deny glob refuses it if it matches any reading, an allow list admits it only if
        the normal form and every decoding of it match."""
        layers = self._layers(server, RESOURCES)
        if not layers:
            return None
        decoded = decoded_readings(uri)
        every = readings(uri)
        for label, rules in layers:
            if rules.allow and any(_matches(each, rules.allow, _uri_glob) is None for each in decoded):
                return f"{label}.allow (matched by none of its patterns)"
            for each in every:
                denied = _matches(each, rules.deny, _uri_glob)
                if denied is not None:
                    return f"{label}.deny {denied!r}"
        return None

    def override(self, server: str, kind: str, original: str) -> Any:
        """The server's rename/title/description override for an item, if any."""
        server_config = self._config.servers.get(server)
        if server_config is None:
            return None
        return getattr(server_config, CONFIG_KIND[kind]).rename.get(original)


def server_request_allowed(config: Any, server: str, method: str) -> bool:
    """Whether a server may make this server-to-client request (its ``server_requests``)."""
    allowed = config.servers[server].server_requests
    return allowed is None or SERVER_REQUESTS.get(method) in allowed


# --- rules that match nothing --------------------------------------------------------------

_SINGULAR = {TOOLS: "tool", PROMPTS: "prompt", RESOURCES: "resource", TEMPLATES: "resource template"}


def _listed_keys(items: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """One server's items of each kind as rules compare them (URIs and templates in normal form)."""
    keys: dict[str, list[str]] = {}
    for kind in KINDS:
        for item in items.get(kind) or ():
            original = item.get(KEY_OF[kind]) if type(item) is dict else None
            if type(original) is not str or not original:
                continue
            try:
                compared = normalize_uri(original) if kind == RESOURCES else original
                compared = normalize_template(original) if kind == TEMPLATES else compared
            except InvalidUri:
                continue
            keys.setdefault(kind, []).append(compared)
    return keys


def unmatched_rules(
    config: Any, items_of: Callable[[str, str], list[dict[str, Any]]], listed: Iterable[str]
) -> list[str]:
    """The allow and deny patterns, and the rename keys, that match nothing the servers
    listed: most often a misspelt name. ``listed``: the servers that listed their items,
    ``items_of(server, kind)`` those items. A rule for every server (``[policy]``, a
    profile's own) is judged only once every enabled server has listed; a server's rules
    once it has."""
    keys = {server: _listed_keys({kind: items_of(server, kind) for kind in KINDS}) for server in listed}
    everyone = set(keys) >= {server.name for server in config.enabled_servers}
    layers: list[tuple[str, Any, list[str], str]] = []  # (key path, rules, their servers, in words)
    if everyone:
        layers.append(("policy", config.policy, list(keys), "of any server"))
        layers += [(f"profiles.{name}", p, list(keys), "of any server") for name, p in config.profiles.items()]
    for name, server in config.servers.items():
        if name in keys:
            layers.append((f"servers.{name}", server, [name], f"of server {name}"))
    for name, profile in config.profiles.items():
        for server, rules in profile.servers.items():
            if server in keys:
                layers.append((f"profiles.{name}.servers.{server}", rules, [server], f"of server {server}"))
    warnings = []
    for label, owner, servers, scope in layers:
        for kind in KINDS:
            rules = getattr(owner, CONFIG_KIND[kind])
            known = [key for server in servers for key in keys[server].get(kind, ())]
            for which in ("allow", "deny"):
                for pattern in getattr(rules, which):
                    if not any(_GLOB_OF[kind](pattern).match(key) for key in known):
                        what = _SINGULAR[kind]
                        warnings.append(f"{label}.{CONFIG_KIND[kind]}.{which}: {pattern!r} matches no {what} {scope}")
            if label.startswith("servers.") and kind in (TOOLS, PROMPTS):
                warnings += [
                    f"{label}.{CONFIG_KIND[kind]}.rename.{original}: the server lists no {_SINGULAR[kind]} {original!r}"
                    for original in rules.rename
                    if original not in known
                ]
    return warnings

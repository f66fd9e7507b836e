"""What changed between the running configuration and a newly loaded one. Pure: no I/O.

``plan_changes(running, loaded)`` says what a live reload does:

- servers added (enabled now, absent or disabled before), removed, changed (anything that
  reaches the server or its link: command, args, env, url, headers, transport, prefixes,
  timeouts, isolation, protocol) and unchanged. A change to a server's policy keys only
  (``tools``, ``prompts``, ``resources``, ``templates``, ``server_requests``) does not
  restart it: the catalogs are rebuilt with the new rules;
- whether the policy (``[policy]``, profile rules, server rules) or the plugins changed;
- what cannot change while the proxy runs: ``[proxy]``, ``[http]`` (listen addresses,
  tokens, limits), ``[credentials]`` (the vault and its key, the callback), ``[auth]``,
  ``[cluster]`` (its keys are derived once, at start), and
  which profiles exist and which tokens or claims select them (``tokens``, ``match``,
  ``scopes``: the listeners choose a session's profile when it opens). These are reported
  as needing a restart and
  otherwise ignored: ``effective`` is the loaded configuration with the running values of
  those keys, the configuration the proxy runs after the reload.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from aggregator.config.model import Config, ProfileConfig, ServerConfig

# A server's keys that only say what clients may see and do of it: changed, they rebuild
# the catalogs and leave the server running.
POLICY_KEYS = frozenset({"tools", "prompts", "resources", "templates", "server_requests"})


@attrs.frozen
class ConfigChanges:
    """What a reload from ``running`` to ``effective`` does."""

    effective: Config
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    policy_changed: bool = False
    plugins_changed: bool = False
    # One line per key that needs a restart to take effect (ignored until then).
    needs_restart: tuple[str, ...] = ()

    @property
    def restarts(self) -> tuple[str, ...]:
        """The servers to stop: removed, and changed (started again with the new config)."""
        return self.removed + self.changed

    @property
    def starts(self) -> tuple[str, ...]:
        """The servers to start: added, and changed."""
        return self.added + self.changed

    @property
    def anything(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.policy_changed or self.plugins_changed)

    def describe(self) -> list[str]:
        """One line per change, for logs and ``ReloadResult.changes``."""
        lines = [f"servers.{name}: added" for name in self.added]
        lines += [f"servers.{name}: removed" for name in self.removed]
        for name in self.changed:
            server = self.effective.servers[name]
            lazy = self.effective.starts_lazily(server) and server.isolation != "per-session"
            lines.append(f"servers.{name}: changed; " + ("stopped, then lazy as at launch" if lazy else "restarted"))
        if self.policy_changed:
            lines.append("policy: changed; catalogs rebuilt")
        if self.plugins_changed:
            lines.append("plugins: changed; reloaded")
        lines += [f"{key}: changed; takes a restart (ignored until then)" for key in self.needs_restart]
        return lines


def connection_changed(before: ServerConfig, after: ServerConfig) -> list[str]:
    """The keys of a server that differ and are not policy keys (the server restarts)."""
    return [
        field.name
        for field in attrs.fields(ServerConfig)
        if field.name not in POLICY_KEYS and getattr(before, field.name) != getattr(after, field.name)
    ]


def _policy_of(server: ServerConfig) -> tuple[object, ...]:
    return tuple(getattr(server, key) for key in sorted(POLICY_KEYS))


def _profiles(
    running: Mapping[str, ProfileConfig], loaded: Mapping[str, ProfileConfig]
) -> tuple[dict[str, ProfileConfig], list[str]]:
    """The profiles the proxy runs after a reload (the running ones, each with its loaded
    rules and its running tokens) and what of the loaded ones needs a restart."""
    effective: dict[str, ProfileConfig] = {}
    restart: list[str] = []
    for name, profile in running.items():
        new = loaded.get(name)
        if new is None:
            restart.append(f"profiles.{name} (removed)")
            effective[name] = profile
            continue
        for key in ("tokens", "match", "scopes"):  # what chooses a session's profile
            if getattr(new, key) != getattr(profile, key):
                restart.append(f"profiles.{name}.{key}")
        effective[name] = attrs.evolve(new, tokens=profile.tokens, match=profile.match, scopes=profile.scopes)
    restart += [f"profiles.{name} (added)" for name in loaded if name not in running]
    return effective, restart


def plan_changes(running: Config, loaded: Config) -> ConfigChanges:
    """What reloading ``loaded`` over ``running`` changes, and what it must leave alone."""
    # [proxy.discovery] applies live; the rest of [proxy] needs a restart.
    proxy = attrs.evolve(running.proxy, discovery=loaded.proxy.discovery)
    kept = (
        ("proxy", proxy),
        ("http", running.http),
        ("credentials", running.credentials),
        ("auth", running.auth),
        ("cluster", running.cluster),
    )
    restart = [key for key, now in kept if now != getattr(loaded, key)]
    profiles, profile_restart = _profiles(running.profiles, loaded.profiles)
    restart += profile_restart
    effective = attrs.evolve(
        loaded,
        proxy=proxy,
        http=running.http,
        credentials=running.credentials,
        auth=running.auth,
        cluster=running.cluster,
        profiles=profiles,
    )
    before = {server.name: server for server in running.enabled_servers}
    after = {server.name: server for server in effective.enabled_servers}
    added = tuple(name for name in after if name not in before)
    removed = tuple(name for name in before if name not in after)
    changed = tuple(name for name in after if name in before and connection_changed(before[name], after[name]))
    unchanged = tuple(name for name in after if name in before and name not in changed)
    policy_changed = (
        running.policy != effective.policy
        or running.profiles != effective.profiles
        or running.proxy.discovery != effective.proxy.discovery
        or any(_policy_of(before[name]) != _policy_of(after[name]) for name in unchanged)
        # The servers' order decides who keeps a name both list.
        or [name for name in before if name in after] != [name for name in after if name in before]
    )
    return ConfigChanges(
        effective,
        added=added,
        removed=removed,
        changed=changed,
        unchanged=unchanged,
        policy_changed=policy_changed,
        plugins_changed=running.plugins != effective.plugins or running.directory != effective.directory,
        needs_restart=tuple(restart),
    )

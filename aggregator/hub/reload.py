"""Live reload: read the config file again and apply what changed while clients stay connected.

``reload_hub(hub)`` (``Hub.reload``) loads and validates the file the hub was started with.
A file that does not load changes nothing: its problems come back, each with its key path,
and the running configuration stays. Otherwise ``config.changes`` says what changed and it
is applied in this order, one reload at a time:

1. plugins, if their config changed: the new ones are built and their load hooks run
   (one that cannot be built rejects the whole reload), then they replace the old ones,
   whose done hooks run;
2. removed and changed servers leave the router (what is in flight to them is answered,
   their items leave the catalogs) and their connections are stopped, waited for;
3. every profile's catalog is renewed with the new servers and rules (clients whose lists
   changed hear ``notifications/*/list_changed``);
4. added and changed servers start, as at startup; clients hear of their items once listed.

Unchanged servers are not touched: their connections and processes go on. What cannot change
live (``[proxy]``, ``[http]``, which profiles exist and their tokens) is reported as needing a
restart and otherwise ignored.

``watch_config`` polls the file once a second and reloads when its contents change
(``serve --watch``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from aggregator.config import Config, load_config
from aggregator.config.changes import ConfigChanges, plan_changes
from aggregator.config.core_settings import discovery_settings, link_settings
from aggregator.config.loading import min_ready_problems
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.events import (
    CatalogsRenewed,
    DiscoveryRenewed,
    ServerAdded,
    ServerRemoved,
    ServerReplaced,
    ServerRestarting,
)
from aggregator.errors import AggregatorError, ConfigError
from aggregator.plugins.api import Plugins, load_plugins
from aggregator.plugins.gate import GateHost, PluginGate
from aggregator.upstreams.port import UpstreamPort
from aggregator.upstreams.session import UpstreamSession

if TYPE_CHECKING:
    from aggregator.core.commands import Command
    from aggregator.core.router import Router
    from aggregator.telemetry.metrics import Metrics

log = logging.getLogger("aggregator.reload")  # the logger name the manual shows

# How long a reload waits for a removed or changed server's connection to stop (its stop
# ladder: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL).
STOP_WAIT = 10.0
# Why a changed server's requests in flight failed, and what a call held for it hears.
CHANGED = "its configuration changed"
# The largest process id there can be (a pid_t is a 32-bit signed number).
MAX_PID = 2**31 - 1
# How often ``watch_config`` looks at the file.
WATCH_INTERVAL = 1.0


@attrs.define
class ReloadResult:
    """What a reload did: ``ok`` False when the new config was rejected (``errors`` say
    why, each with its key path); ``changes``: one line per change applied or ignored."""

    ok: bool
    errors: list[str] = attrs.field(factory=list)
    changes: list[str] = attrs.field(factory=list)


class ReloadHost(UpstreamPort, GateHost, Protocol):
    """What a reload needs of the hub (the hub is one; this module does not import it),
    including the wiring of the plugins' hooks it replaces."""

    config: Config
    config_path: Path | None
    router: Router
    upstreams: dict[str, UpstreamSession]
    plugins: Plugins
    gate: PluginGate
    metrics: Metrics
    _nursery: trio.Nursery | None
    _catalog_hooks_ran: trio.Event
    _watched: dict[tuple[int, Any], Any]
    _notification_hooks: bool

    async def _after_catalog(self) -> None:
        """Run the plugins' after_catalog hooks whenever catalog hooks ran (forever)."""

    def dispatch_now(self, commands: list[Command]) -> None:
        """Carry out the router's commands and start writing at once."""


# Per hub: one reload at a time; whether its after_catalog task runs.
_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
_after_catalog_tasks: weakref.WeakSet[Any] = weakref.WeakSet()


async def reload_hub(hub: ReloadHost, *, keep_servers: bool = False) -> ReloadResult:
    """Reload ``hub``'s config file and apply what changed (one reload at a time per hub).
    ``keep_servers`` (the watcher's): a file with no servers is not applied over a running
    config that has some (it is more likely a file being written than meant)."""
    path = hub.config_path
    why = _cannot_reload(hub)
    if why is not None or path is None:
        log.warning("reload: %s; nothing to reload", why)
        return ReloadResult(False, [f"{why}; nothing to reload"])
    lock = _locks.get(hub)
    if lock is None:
        lock = _locks[hub] = trio.Lock()
    async with lock:
        try:
            return await _reload(hub, path, keep_servers)
        except Exception as exc:  # noqa: BLE001 - a bug in a reload must not stop the proxy
            log.exception("reload: internal error; what was applied before it stays")
            return ReloadResult(False, [f"internal error: {exc!r}"])


def _cannot_reload(hub: ReloadHost) -> str | None:
    if hub.config_path is None:
        return "this proxy was not started from a config file"
    if hub._nursery is None:
        return "the proxy is not running yet"
    if hub.router.draining:
        return "the proxy is shutting down"
    return None


async def _reload(hub: ReloadHost, path: Path, keep_servers: bool = False) -> ReloadResult:
    try:
        # Read in the event loop: a config file is small, and a thread would let a virtual
        # clock (the tests') jump past every deadline while it reads.
        loaded = load_config(path)
    except ConfigError as exc:
        return _rejected(path, list(exc.problems))
    if keep_servers and not loaded.servers and hub.config.servers:
        why = f"{path} has no servers; not applied by --watch (reload it by hand to mean it)"
        log.warning("reload: %s", why)
        return ReloadResult(False, [why])
    changes = plan_changes(hub.config, attrs.evolve(loaded, directory=hub.config.directory))
    problems = min_ready_problems(hub.config, changes.effective.servers)
    if problems:
        return _rejected(path, problems)
    lines = changes.describe()
    restart = set(lines[len(lines) - len(changes.needs_restart) :])
    if not changes.anything:
        for line in lines:
            log.warning("reload: %s", line)
        log.info("reload: %s: nothing to apply", path)
        return ReloadResult(True, [], lines)
    plugins: Plugins | None = None
    if changes.plugins_changed:
        try:
            plugins = _build_plugins(changes.effective)
        except ConfigError as exc:
            return _rejected(path, list(exc.problems))
    await _apply(hub, changes, plugins)
    for line in lines:
        log.log(logging.WARNING if line in restart else logging.INFO, "reload: %s", line)
    return ReloadResult(True, [], lines)


def _rejected(path: Path, problems: list[str]) -> ReloadResult:
    """Log a refused reload: a header, then one record per problem (each on its own line)."""
    log.error("reload: %s is rejected; the running config stays:", path)
    for problem in problems:
        log.error("reload:   %s", problem)
    return ReloadResult(False, problems)


def _build_plugins(config: Config) -> Plugins:
    return load_plugins(list(config.plugins), Path(config.directory) if config.directory else None)


async def _apply(hub: ReloadHost, changes: ConfigChanges, plugins: Plugins | None) -> None:
    config = changes.effective
    if plugins is not None:
        await _swap_plugins(hub, plugins)
    running, hub.config = hub.config, config
    router = hub.router
    stopping: list[UpstreamSession] = []
    # Changed servers restart in place (calls naming them wait for the new connection),
    # unless their isolation changed: those are removed and added.
    restarting = {n for n in changes.changed if running.servers[n].isolation == config.servers[n].isolation}
    for name in changes.restarts:
        if name in restarting:
            hub.dispatch_now(router.handle(ServerRestarting(name, CHANGED)))
        else:
            why = CHANGED if name in changes.changed else "it was removed from the configuration"
            hub.dispatch_now(router.handle(ServerRemoved(name, why)))
        for key, upstream in list(hub.upstreams.items()):
            if upstream.config.name == name:
                del hub.upstreams[key]
                hub.metrics.retire(upstream)  # its counters go on under its name
                upstream.cancel_scope.cancel()
                stopping.append(upstream)
        hub.server_settled(name)  # startup, if not over yet, waits for it no more
    with trio.move_on_after(STOP_WAIT) as waited:
        for upstream in stopping:
            await upstream.ended.wait()
    if waited.cancelled_caught:
        log.warning("reload: some stopped servers did not end within %.0fs; going on", STOP_WAIT)
    # The running profiles (``effective`` keeps their set), each with its new rules.
    policies = {"default": ProfilePolicy(config), **{name: ProfilePolicy(config, name) for name in config.profiles}}
    hub.dispatch_now(router.handle(CatalogsRenewed(config.enabled_servers, policies, hub.plugins.catalog_hook)))
    hub.dispatch_now(router.handle(DiscoveryRenewed(discovery_settings(config))))
    for name in changes.starts:
        server = config.servers[name]
        if name in restarting:
            router.handle(ServerReplaced(link_settings(server), CHANGED))
        else:
            router.handle(ServerAdded(link_settings(server)))
        upstream = UpstreamSession(hub, server)
        hub.upstreams[name] = upstream
        assert hub._nursery is not None
        hub._nursery.start_soon(upstream.run, name=f"upstream {name}")


async def _swap_plugins(hub: ReloadHost, plugins: Plugins) -> None:
    """Run the new plugins' load hooks, put them in place of the old ones (in the hub's
    wiring of hooks, as ``Hub.__init__`` and ``Hub.run`` set it), run the old ones' done
    hooks. A request a hook of the old ones is deciding on finishes with them."""
    await plugins.load()
    old = hub.plugins
    if old.after_catalog_hooks:
        _after_catalog_tasks.add(hub)  # started by ``Hub.run``
    hub.plugins = plugins
    hub.plugins.catalog_changed = _setter(hub)
    before = hub.gate
    hub.gate = PluginGate(hub, plugins, before)
    hub.gate.nursery = hub._nursery
    hub._watched = hub.gate.watched
    hub._notification_hooks = plugins.watch_notifications
    if plugins.after_catalog_hooks and hub not in _after_catalog_tasks and hub._nursery is not None:
        _after_catalog_tasks.add(hub)
        hub._nursery.start_soon(hub._after_catalog)
    if before.in_flight(old) and hub._nursery is not None:
        hub._nursery.start_soon(_retire, hub.gate, before, old, _longest_request(hub.config))
    else:
        await old.done()


async def _retire(gate: PluginGate, before: PluginGate, old: Plugins, seconds: float) -> None:
    """Run replaced plugins' done hooks once the requests they decided on or watch are
    answered (they see them through), or after ``seconds``, the longest a request lasts, or
    when the proxy stops meanwhile (``Plugins.done`` shields itself)."""
    try:
        with trio.move_on_after(seconds) as waited:
            await before.answered_all(old)
        if waited.cancelled_caught:
            log.warning("reload: requests the replaced plugins watch were not answered within %.0fs", seconds)
    finally:
        gate.forget(old)
        await old.done()


def _longest_request(config: Config) -> float:
    return max((max(s.request_timeout, s.max_request_timeout) for s in config.servers.values()), default=60.0)


def _setter(hub: ReloadHost) -> Callable[[], None]:
    """What the plugins call when their catalog hooks ran: wake the hub's after_catalog task."""
    return lambda: hub._catalog_hooks_ran.set()


async def watch_config(hub: ReloadHost, path: Path, interval: float = WATCH_INTERVAL) -> None:
    """Reload ``hub`` whenever ``path``'s contents change (looked at every ``interval``
    seconds). New contents are applied once two looks in a row saw them (a file being
    written is not), and not at all if they have no servers while the running config has
    some (``reload_hub``'s ``keep_servers``): the next change is waited for."""
    seen = _digest(path)
    settling: bytes | None = None
    while True:
        await trio.sleep(interval)
        now = _digest(path)
        if now is None or now == seen or now != settling:
            settling = None if now == seen else now
            continue
        seen, settling = now, None
        log.info("the config file %s changed; reloading", path)
        await reload_hub(hub, keep_servers=True)


def _digest(path: Path) -> bytes | None:
    """The file's contents' hash, or None while it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


# --- the pid file (``serve --pid-file``, ``aggregator reload --pid-file``) -----------------


def write_pid_file(path: Path) -> None:
    """Write this process's id to ``path``, refused while another running aggregator's is
    there. An id of a process that ended, or that is no aggregator (the id was reused after
    a crash), is stale and replaced."""
    other = _pid_in(path)
    if other is not None and other != os.getpid() and _is_aggregator(other):
        raise AggregatorError(f"--pid-file {path}: process {other} is running with it already")
    try:
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(f"{os.getpid()}\n")
        temporary.replace(path)
    except OSError as exc:
        raise AggregatorError(f"--pid-file {path}: cannot write it: {exc.strerror or exc}") from None


def remove_pid_file(path: Path) -> None:
    """Remove ``path`` if it still holds this process's id."""
    if _pid_in(path) == os.getpid():
        with contextlib.suppress(OSError):
            path.unlink()


def signal_reload(path: Path) -> int:
    """Send SIGHUP to the proxy whose id ``path`` holds; return that id."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise AggregatorError(
            f"cannot read {path}: {exc.strerror or exc} (is the proxy running with --pid-file {path}?)"
        ) from None
    pid = _process_id(text)
    if pid is None:
        raise AggregatorError(f"{path} does not hold a process id")
    if not _is_aggregator(pid):
        raise AggregatorError(f"process {pid} (from {path}) is not a running aggregator; a stale pid file?")
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise AggregatorError(f"no process {pid} (from {path}); a stale pid file?") from None
    except PermissionError:
        raise AggregatorError(f"not allowed to signal process {pid} (from {path})") from None
    return pid


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return _process_id(text)


def _process_id(text: str) -> int | None:
    """``text`` as a process id other than 0 and 1, or None (a number no process id can be,
    as 2147483648, is none either)."""
    if not text.isdigit() or len(text) > 10:
        return None
    pid = int(text)
    return pid if 1 < pid <= MAX_PID else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_aggregator(pid: int) -> bool:
    """Whether ``pid`` runs an aggregator (its command line says so, where /proc tells)."""
    if pid <= 1 or not _alive(pid):  # 0 would ask about our own process group; 1 is init
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc here: the id is all there is to go by
    return b"aggregator" in command

"""Live reload: read the config file again and say what changed; the hub applies it while
clients stay connected.

A reload is the hub's own job (``Hub.reload``, one at a time per hub, its lock the hub's).
This module does the part that needs no hub: ``read_reload`` loads and validates the file
the hub was started with, against the running config. A file that does not load changes
nothing: its problems come back, each with its key path, and the running configuration
stays. Otherwise ``config.changes`` says what changed (a ``ReloadPlan``) and the hub
applies it in this order:

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
(``serve --watch``); the plugins a reload builds are put in place by ``plugin_wiring``.
The pid file ``serve --pid-file`` writes and ``aggregator reload`` signals is here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from aggregator.config import Config, load_config
from aggregator.config.changes import ConfigChanges, plan_changes
from aggregator.config.loading import min_ready_problems
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.errors import AggregatorError, ConfigError
from aggregator.plugins.api import Plugins, plugins_of
from aggregator.upstreams.session import UpstreamSession

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


@attrs.frozen
class ReloadPlan:
    """What a reload applies: the changes, and the new plugins (built, not loaded yet) when
    their config changed."""

    path: Path
    changes: ConfigChanges
    plugins: Plugins | None

    def restarting(self, running: Config) -> set[str]:
        """The changed servers that restart in place (calls naming them wait for the new
        connection): those whose isolation stayed; the others are removed and added."""
        config = self.changes.effective
        return {n for n in self.changes.changed if running.servers[n].isolation == config.servers[n].isolation}

    def applied(self) -> ReloadResult:
        """Log what was applied (what needs a restart at WARNING) and say so."""
        lines = self.changes.describe()
        restart = set(lines[len(lines) - len(self.changes.needs_restart) :])
        for line in lines:
            log.log(logging.WARNING if line in restart else logging.INFO, "reload: %s", line)
        return ReloadResult(True, [], lines)


def cannot_reload(path: Path | None, running: bool, draining: bool) -> ReloadResult | None:
    """Why a hub cannot reload now (logged), or None."""
    if path is None:
        why = "this proxy was not started from a config file"
    elif not running:
        why = "the proxy is not running yet"
    elif draining:
        why = "the proxy is shutting down"
    else:
        return None
    log.warning("reload: %s; nothing to reload", why)
    return ReloadResult(False, [f"{why}; nothing to reload"])


def read_reload(running: Config, path: Path, keep_servers: bool = False) -> ReloadPlan | ReloadResult:
    """Read ``path`` again: what to apply over the ``running`` config, or the result of a
    reload that applies nothing (rejected, or nothing changed). ``keep_servers`` (the
    watcher's): a file with no servers is not applied over a running config that has some
    (it is more likely a file being written than meant)."""
    try:
        # Read in the event loop: a config file is small, and a thread would let a virtual
        # clock (the tests') jump past every deadline while it reads.
        loaded = load_config(path)
    except ConfigError as exc:
        return _rejected(path, list(exc.problems))
    if keep_servers and not loaded.servers and running.servers:
        why = f"{path} has no servers; not applied by --watch (reload it by hand to mean it)"
        log.warning("reload: %s", why)
        return ReloadResult(False, [why])
    changes = plan_changes(running, attrs.evolve(loaded, directory=running.directory))
    problems = min_ready_problems(running, changes.effective.servers)
    if problems:
        return _rejected(path, problems)
    if not changes.anything:
        lines = changes.describe()
        for line in lines:
            log.warning("reload: %s", line)
        log.info("reload: %s: nothing to apply", path)
        return ReloadResult(True, [], lines)
    plugins: Plugins | None = None
    if changes.plugins_changed:
        try:
            plugins = plugins_of(changes.effective)
        except ConfigError as exc:
            return _rejected(path, list(exc.problems))
    return ReloadPlan(path, changes, plugins)


def internal_error(exc: Exception) -> ReloadResult:
    """A bug in a reload: logged (with its traceback); what was applied before it stays."""
    log.exception("reload: internal error; what was applied before it stays")
    return ReloadResult(False, [f"internal error: {exc!r}"])


def _rejected(path: Path, problems: list[str]) -> ReloadResult:
    """Log a refused reload: a header, then one record per problem (each on its own line)."""
    log.error("reload: %s is rejected; the running config stays:", path)
    for problem in problems:
        log.error("reload:   %s", problem)
    return ReloadResult(False, problems)


def profile_policies(config: Config) -> dict[str, ProfilePolicy]:
    """The running profiles (``effective`` keeps their set), each with its new rules."""
    return {"default": ProfilePolicy(config), **{name: ProfilePolicy(config, name) for name in config.profiles}}


async def wait_stopped(stopping: list[UpstreamSession]) -> None:
    """Wait for the stopped servers' connections to end, ``STOP_WAIT`` at most."""
    with trio.move_on_after(STOP_WAIT) as waited:
        for upstream in stopping:
            await upstream.ended.wait()
    if waited.cancelled_caught:
        log.warning("reload: some stopped servers did not end within %.0fs; going on", STOP_WAIT)


async def watch_config(
    reload: Callable[..., Awaitable[ReloadResult]], path: Path, interval: float = WATCH_INTERVAL
) -> None:
    """Reload (``reload``: ``Hub.reload``) whenever ``path``'s contents change (looked at
    every ``interval`` seconds). New contents are applied once two looks in a row saw them
    (a file being written is not), and not at all if they have no servers while the running
    config has some (``keep_servers``): the next change is waited for."""
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
        await reload(keep_servers=True)


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

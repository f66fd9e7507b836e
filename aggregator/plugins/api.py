"""The plugin API: objects with methods named after hooks (the mitmproxy addon model).

A plugin is any object; the hooks it has are called, the ones it lacks are not. Hooks
may be plain functions or coroutines (``async def``), except ``catalog``,
``notification`` and ``server_request``, which run inside the routing core and must be
plain functions.

``request(request: Request)``
    A client's request for a server's item (tools/call, prompts/get, resources/read,
    resources/subscribe, completion/complete), before it is sent. Change
    ``request.params`` to change what is sent, set ``request.answer`` to answer it
    yourself, or raise ``Deny`` to refuse it with a message the client reads.
``response(response: Response)``
    The answer to such a request, before the client gets it: ``response.result`` or
    ``response.error``, and ``response.duration``. A plain function may change the result;
    a coroutine runs after the answer is sent (observe only).
``catalog(profile: str, kind: str, items: list[dict]) -> list[dict] | None``
    What one profile sees of one kind ("tools", "prompts", "resources",
    "resourceTemplates"), as exposed. Return a list to filter it or change descriptions
    (exposed names and URIs must not change), or None to leave it.
``notification(notification: Notification) -> bool | None``
    A notification on its way to a client (progress, log messages, list changes,
    resource updates). Change ``notification.params``, or return False to drop it.
``server_request(request: ServerRequest) -> bool | None``
    A server asks a client for sampling, elicitation or roots. Return False to refuse.

Lifecycle hooks (plain functions or coroutines; they run outside the routing core, so they
may do I/O; a plain one must not block, since the event loop waits for it: on a reload every
client would; a coroutine does blocking work in ``trio.to_thread.run_sync``):

``load()``
    Once, after the config is known and before any server starts or client is served.
``after_catalog()``
    Soon after catalog hooks ran, outside the routing core: where a catalog hook's
    side effects (a file to write) are carried out, since the hooks that run inside the
    core (``catalog``, ``notification``, ``server_request``) must do no I/O.
``shared(store)``
    A coroutine the proxy runs in a task of its own while the plugin is in place, when
    ``[cluster] store`` names a store the replicas share (``aggregator.cluster.store.Store``):
    where a plugin keeps what every replica must see (the rate limit's counters). Cancelled
    at shutdown and when a reload replaces the plugin; one that raises is logged, and the
    plugin goes on without it.
``done()``
    Once, at shutdown, also after an error and after a failed ``load``: close files,
    write what is left. Bounded to ``DONE_TIMEOUT`` seconds for each plugin.

A hook that raises anything but ``Deny`` fails closed: the request is refused with an
error naming the plugin, a catalog hook that fails hides that whole kind, a failing
server_request hook refuses. A lifecycle hook that raises is logged and the proxy goes on
(a plugin whose ``load`` failed stays loaded: its policy hooks still fail closed). A public
method whose name is close to a hook's but is not one (``on_request``, ``requset``) is
never called, and a warning at load names it; so does one for the same plugin listed twice
with the same options. Plugins come from the config (``[[plugins]]`` with ``use``
and ``options``), by entry point name in the group ``aggregator.plugins`` (the built-in
ones are there too), by dotted path ``package.module:Name``, or by file path
``path/to/file.py:Name``; ``Name`` is called with the options as keyword arguments.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from aggregator.errors import ConfigError
from aggregator.mcp.constants import TARGETED_METHODS
from aggregator.plugins.resolve import error_text, option_problems, resolve, with_path_defaults

if TYPE_CHECKING:
    from aggregator.config import Config

log = logging.getLogger(__name__)
HOOKED_METHODS = TARGETED_METHODS  # the requests request hooks see
# Every hook a plugin may have; a public method named close to one of these is a misspelling.
HOOKS = ("request", "response", "catalog", "notification", "server_request", "load", "after_catalog", "shared", "done")
DONE_TIMEOUT = 5.0  # seconds each plugin's done hook may take at shutdown
# A plain lifecycle hook runs on the proxy's one event loop: while it runs, no message moves
# (at startup nothing is served yet; on a reload every client waits). One that takes longer
# than this is named in a warning.
SLOW_PLAIN_HOOK = 0.5  # seconds
_HOOK_PREFIXES = ("on_", "handle_", "hook_")


class Deny(Exception):
    """Raised by a request hook to refuse a request; the message reaches the client."""

    def __init__(self, message: str, *, retry_after: float | None = None, reason: str = "denied") -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.reason = reason


class InvalidOptions(ValueError):
    """Raised by a plugin's constructor for options it cannot use; each problem is reported
    with its key path (``plugins[0].options.rate: ...``)."""

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("; ".join(f"{key}: {problem}" for key, problem in problems.items()))
        self.problems = problems


@attrs.define(eq=False)
class Request:
    client: int  # the session
    profile: str
    method: str
    server: str
    name: str  # the server's own name for the item (or its URI)
    exposed: str  # what the client called it
    params: dict[str, Any]
    answer: dict[str, Any] | None = None  # set by a hook to answer without the server
    started: float = attrs.field(factory=time.monotonic)
    # Who the front authenticated: a static token's index, an access token's principal
    # (issuer and subject; ``str()`` shows it), None for a caller without a token. Never a token.
    principal: Any = None
    # The session's name on every replica (``[cluster] keys``: a digest of its sealed id,
    # never the id itself); None for a session only this replica knows (``client`` is
    # this replica's own number for it).
    session: str | None = None


@attrs.define(eq=False)
class Response:
    request: Request
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    duration: float


@attrs.define(eq=False)
class Notification:
    client: int
    method: str
    params: dict[str, Any]


@attrs.frozen
class ServerRequest:
    server: str
    method: str
    params: dict[str, Any]


def _name(plugin: Any) -> str:
    return getattr(plugin, "name", None) or type(plugin).__name__


def misspelled_hooks(plugin: Any) -> dict[str, str]:
    """A plugin's public methods that look like hooks but are not: name -> the hook meant."""
    found = {}
    for attribute in dir(plugin):
        if attribute.startswith("_") or attribute in HOOKS:
            continue
        candidate = attribute.lower()
        for prefix in _HOOK_PREFIXES:
            candidate = candidate.removeprefix(prefix)
        close = [candidate] if candidate in HOOKS else difflib.get_close_matches(candidate, HOOKS, 1, 0.85)
        if close and callable(inspect.getattr_static(plugin, attribute, None)):  # runs no property
            found[attribute] = close[0]
    return found


class Plugins:
    """The loaded plugins, and how each hook is run over them."""

    def __init__(self, plugins: list[Any]) -> None:
        self.plugins = plugins
        self._request = [p for p in plugins if callable(getattr(p, "request", None))]
        self._response = [p for p in plugins if callable(getattr(p, "response", None))]
        self._catalog = [p for p in plugins if callable(getattr(p, "catalog", None))]
        self._server_request = [p for p in plugins if callable(getattr(p, "server_request", None))]
        self._notification = [p for p in plugins if callable(getattr(p, "notification", None))]
        self._after_catalog = [p for p in plugins if callable(getattr(p, "after_catalog", None))]
        self._shared = [p for p in plugins if callable(getattr(p, "shared", None))]
        self._shared_scope = trio.CancelScope()  # their shared hooks' tasks
        for plugin in plugins:
            for hook in ("catalog", "server_request", "notification"):
                if inspect.iscoroutinefunction(getattr(plugin, hook, None)):
                    raise ConfigError(f"plugin {_name(plugin)}: its {hook} hook must be a plain function")
            for attribute, hook in misspelled_hooks(plugin).items():
                log.warning(
                    "plugin %s: %s is not a hook, so it is never called (did you mean %s?)",
                    _name(plugin),
                    attribute,
                    hook,
                )
        # Called (by the catalog hooks' runner, inside the core) when after_catalog hooks
        # are due; the hub sets it to wake the task that runs them outside the core.
        self.catalog_changed: Callable[[], None] = lambda: None
        self._done = False
        self._failures: set[tuple[int, str, type]] = set()  # (plugin, hook, error) logged in full

        # A request hook that may wait (a coroutine function) runs in a task of its own, so
        # that it holds up only the request it decides on, never its client's other messages.
        self.request_hooks_wait = any(inspect.iscoroutinefunction(p.request) for p in self._request)
        # Which hooks there are, as fields: the hub reads them on every message.
        self.watch_requests = bool(self._request or self._response)
        self.watch_notifications = bool(self._notification)
        self.watch_server_requests = bool(self._server_request)

    @property
    def catalog_hook(self) -> Callable[[str, str, list[dict[str, Any]]], list[dict[str, Any]]] | None:
        """What the core calls to run every catalog hook; None when no plugin has one."""
        return self.catalog if self._catalog else None

    @property
    def after_catalog_hooks(self) -> bool:
        return bool(self._after_catalog)

    async def load(self) -> None:
        """Run every load hook, in the order the plugins are listed."""
        for plugin in self.plugins:
            await _lifecycle(plugin, "load")

    @property
    def shared_hooks(self) -> bool:
        return bool(self._shared)

    async def run_shared(self, store: Any) -> None:
        """Run every shared hook with ``store`` until ``stop_shared`` (or cancelled)."""
        with self._shared_scope:
            async with trio.open_nursery() as nursery:
                for plugin in self._shared:
                    nursery.start_soon(_shared, plugin, store)

    def stop_shared(self) -> None:
        """End the shared hooks' tasks (these plugins are done, or replaced)."""
        self._shared_scope.cancel()

    async def after_catalog(self) -> None:
        """Run every after_catalog hook (outside the core, after catalog hooks ran)."""
        for plugin in self._after_catalog:
            await _lifecycle(plugin, "after_catalog")

    async def done(self) -> None:
        """Run every done hook once, in the order the plugins are listed, each bounded by
        ``DONE_TIMEOUT`` and shielded from the cancellation that is shutting the proxy down."""
        if self._done:
            return
        self._done = True
        self.stop_shared()
        for plugin in self.plugins:
            if not callable(getattr(plugin, "done", None)):
                continue
            with trio.move_on_after(DONE_TIMEOUT, shield=True) as scope:
                await _lifecycle(plugin, "done")
            if scope.cancelled_caught:
                log.warning(
                    "plugin %s: done hook did not finish within %gs; going on without it", _name(plugin), DONE_TIMEOUT
                )

    async def request(self, request: Request) -> None:
        """Run the request hooks; raise Deny to refuse (any other failure becomes one)."""
        for plugin in self._request:
            try:
                outcome = plugin.request(request)
                if inspect.isawaitable(outcome):
                    await outcome
            except Deny:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken plugin fails closed
                self._failed(plugin, "request", exc, "refusing the request")
                raise Deny(
                    f"refused: plugin {_name(plugin)} failed ({type(exc).__name__})", reason="plugin_failed"
                ) from None
            if request.answer is not None:
                return

    def response(self, response: Response, background: Callable[[Any], None]) -> None:
        for plugin in self._response:
            try:
                outcome = plugin.response(response)
                if inspect.isawaitable(outcome):
                    background(outcome)
            except Exception as exc:  # noqa: BLE001 - an answer is delivered even if a plugin fails
                self._failed(plugin, "response", exc, "the answer is delivered")

    def _failed(self, plugin: Any, hook: str, exc: Exception, consequence: str) -> None:
        """Log a hook's failure: with its traceback the first time this hook fails this
        way, in one line after that (a hook run for every message or every rebuild would
        otherwise fill the log). The traceback is the plugin's own: not the context the
        proxy called it in (a shutdown's cancellation, say)."""
        exc.__suppress_context__ = True
        first = (id(plugin), hook, type(exc)) not in self._failures
        self._failures.add((id(plugin), hook, type(exc)))
        log.error(
            "plugin %s: %s hook failed%s (%s: %s); %s",
            _name(plugin),
            hook,
            "" if first else " again",
            type(exc).__name__,
            exc,
            consequence,
            exc_info=exc if first else None,
        )

    def catalog(self, profile: str, kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._after_catalog:
            self.catalog_changed()
        for plugin in self._catalog:
            try:
                changed = plugin.catalog(profile, kind, items)
            except Exception as exc:  # noqa: BLE001 - fail closed: show nothing of this kind
                self._failed(plugin, "catalog", exc, f"hiding every {kind}")
                return []
            if changed is not None:
                items = list(changed)
        return items

    def notification(self, notification: Notification) -> bool:
        """Whether to deliver a notification (hooks may change its params)."""
        for plugin in self._notification:
            try:
                if plugin.notification(notification) is False:
                    return False
            except Exception as exc:  # noqa: BLE001 - fail closed: do not deliver
                self._failed(plugin, "notification", exc, "dropping it")
                return False
        return True

    def server_request(self, request: ServerRequest) -> bool:
        for plugin in self._server_request:
            try:
                if plugin.server_request(request) is False:
                    return False
            except Exception as exc:  # noqa: BLE001 - fail closed
                self._failed(plugin, "server_request", exc, "refusing")
                return False
        return True


async def _shared(plugin: Any, store: Any) -> None:
    """A plugin's shared hook, for as long as it runs; a failure is logged, never raised."""
    try:
        await plugin.shared(store)
    except Exception:
        log.exception("plugin %s: its shared hook failed; it goes on without the other replicas", _name(plugin))


async def _lifecycle(plugin: Any, hook: str) -> None:
    """Run one lifecycle hook if the plugin has it; a failure is logged, never raised."""
    method = getattr(plugin, hook, None)
    if not callable(method):
        return
    started = time.perf_counter()
    try:
        try:
            outcome = method()  # a plain hook runs whole here; a coroutine function only starts
        finally:
            _warn_if_slow(plugin, hook, time.perf_counter() - started)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # noqa: BLE001 - a plugin never takes the proxy down
        log.exception("plugin %s: %s hook failed", _name(plugin), hook)


def _warn_if_slow(plugin: Any, hook: str, blocked: float) -> None:
    if blocked > SLOW_PLAIN_HOOK:
        log.warning(
            "plugin %s: its plain %s hook held up the proxy for %.1fs (no message moved meanwhile);"
            " make it async and run blocking work in trio.to_thread.run_sync",
            _name(plugin),
            hook,
            blocked,
        )


def plugins_of(config: Config) -> Plugins:
    """The plugins ``config`` names, built (their load hooks not run yet), relative paths
    beside the config file; ConfigError names the one that failed."""
    return load_plugins(list(config.plugins), Path(config.directory) if config.directory else None)


def load_plugins(specs: list[Any], config_dir: Path | None = None) -> Plugins:
    """Build the plugins the config names; ConfigError names the one that failed."""
    plugins, problems = [], []
    # (factory, use, options, the key paths listing it): the same plugin listed again with the
    # same options runs every hook twice (a rate halved, each audit line twice).
    listed: list[tuple[Any, str, dict[str, Any], list[str]]] = []
    for index, spec in enumerate(specs):
        path = f"plugins[{index}]"
        try:
            factory = resolve(spec.use, config_dir)
        except Exception as exc:  # noqa: BLE001 - reported with its key path
            problems.append(f"{path}.use: cannot load {spec.use!r}: {error_text(exc)}")
            continue
        # Values are the plugin's to check when built, in its own words.
        unknown = option_problems(factory, spec.use, dict(spec.options), path, types=False)
        if unknown:
            problems.extend(unknown)
            continue
        try:
            plugin = factory(**with_path_defaults(factory, dict(spec.options), config_dir))
        except InvalidOptions as exc:
            problems.extend(f"{path}.options.{key}: {problem}" for key, problem in exc.problems.items())
            continue
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{path}.options: {spec.use} refused them: {exc}")
            continue
        log.info("plugin %s loaded from %s", _name(plugin), spec.use)
        plugins.append(plugin)
        options = dict(spec.options)
        for factory_seen, use_seen, options_seen, paths in listed:
            if (factory_seen is factory or use_seen == spec.use) and options_seen == options:
                paths.append(path)
                break
        else:
            listed.append((factory, spec.use, options, [path]))
    if problems:
        raise ConfigError(problems)
    for _, use, _, paths in listed:
        if len(paths) > 1:
            log.warning(
                "plugin %s is listed %d times with the same options (%s): each copy runs every hook",
                use,
                len(paths),
                ", ".join(paths),
            )
    return Plugins(plugins)

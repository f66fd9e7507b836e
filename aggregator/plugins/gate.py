"""The plugins' hooks around the router: request hooks that may answer, deny or rewrite a
client's request before it is routed (in a task of its own, bounded by the server's
request timeout, when they may wait), response hooks on the answers to the requests they
watched, and notification hooks on what goes to clients. A failing hook ends only its own
request, with a logged error.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from aggregator.config import Config
from aggregator.core.catalogs.policy import server_request_allowed
from aggregator.core.commands import Command
from aggregator.core.router import ToClient, proxy_error
from aggregator.jsonrpc.errors import INVALID_REQUEST
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import CANCELLED
from aggregator.plugins.api import HOOKED_METHODS, Deny, Notification, Plugins, Request, Response, ServerRequest

if TYPE_CHECKING:
    from aggregator.core.router import SessionInfo

log = logging.getLogger(__name__)


class GateHost(Protocol):
    """What the hooks need of the hub (the hub is one; this module does not import it,
    which is above it). The gate never holds the router: it asks the hub what a request
    names, and hands back what the hooks decided for the hub to carry out."""

    config: Config

    def has_client(self, key: int) -> bool:
        """Whether client ``key`` is still connected."""

    def session_info(self, key: int) -> SessionInfo | None:
        """What is known of client ``key``'s session (None: no session now)."""

    def describe(self, key: int, message: dict[str, Any]) -> tuple[str, str, str] | None:
        """The server, its name and the exposed name a client's request names, if any."""

    def request_in_flight(self, key: int, id: Any) -> bool:
        """Whether client ``key`` has a request ``id`` in flight."""

    def stamped(self, key: int, method: str, answer: dict[str, Any]) -> dict[str, Any]:
        """An answer the proxy makes itself, stamped as the router stamps its own."""

    async def routed(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        """The router's commands for a client's message, past the startup gate (the hub
        carries them out: this is the gate's answer to the hub's own call)."""

    async def route_now(self, key: int, message: dict[str, Any]) -> None:
        """Route a request the hooks allowed in a task of their own; carried out now."""

    def answer_now(self, answer: ToClient) -> None:
        """Send an answer the hooks made (in a task of their own) now."""


class PluginGate:
    """The plugins' hooks for one hub: the requests they decide on and those they watch."""

    def __init__(self, host: GateHost, plugins: Plugins, before: PluginGate | None = None) -> None:
        """``before``: the gate of the plugins a reload replaces; what it watches and counts
        carries over (its requests in flight are answered with its plugins)."""
        self.host = host
        self.plugins = plugins
        self.nursery: trio.Nursery | None = None  # for hooks that may wait; set once running
        self.hooking: dict[tuple[int, Any], trio.CancelScope] = {}  # requests plugins decide on
        self.replaced = False  # set by a reload: what this gate still decides on is the old plugins'
        if before is None:
            self.watched: dict[tuple[int, Any], Request] = {}  # requests plugins want answers of
            # Of those, the ones replaced plugins watch: answered with them.
            self.retired: dict[tuple[int, Any], Plugins] = {}
            # For the metrics: (hook, decision) -> how often; (server, method) -> server-to-client
            # requests its policy refused.
            self.decisions: dict[tuple[str, str], int] = {}
            self.policy_denials: dict[tuple[str, str], int] = {}
            self.waiters: list[trio.Event] = []  # set when a replaced plugins' request ends
        else:
            before.replaced = True
            self.watched, self.retired = before.watched, before.retired
            self.decisions, self.policy_denials = before.decisions, before.policy_denials
            self.waiters = before.waiters
            self.retired.update(dict.fromkeys(set(self.watched) - set(self.retired), before.plugins))

    def in_flight(self, plugins: Plugins) -> bool:
        """Whether requests ``plugins`` decide on or watch are in flight (after a reload)."""
        return bool(self.hooking) or any(owner is plugins for owner in self.retired.values())

    async def answered_all(self, plugins: Plugins) -> None:
        """Wait until no request ``plugins`` decide on or watch is in flight."""
        while self.in_flight(plugins):
            event = trio.Event()
            self.waiters.append(event)
            await event.wait()

    def _wake(self) -> None:
        for event in self.waiters:
            event.set()
        self.waiters.clear()

    def forget(self, plugins: Plugins) -> None:
        """Forget the requests ``plugins`` watch (replaced, they wait for them no longer)."""
        for key in [key for key, owner in self.retired.items() if owner is plugins]:
            del self.retired[key]
            self.watched.pop(key, None)

    def decided(self, hook: str, decision: str) -> None:
        """Count what a hook decided (``denied``, ``answered``, ``allowed``, ``dropped``)."""
        key = (hook, decision)
        self.decisions[key] = self.decisions.get(key, 0) + 1

    async def client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        """A client's decoded message: decided by request hooks, or routed."""
        if self.hooking and kind == REQUEST and (key, message["id"]) in self.hooking:
            return [_already_in_flight(key, message["id"])]
        if kind == REQUEST and self.plugins.watch_requests and message["method"] in HOOKED_METHODS:
            if self.plugins.request_hooks_wait and self.nursery is not None:
                started = self._start(key, message)
                if started is not None:
                    return started
            else:
                answered = await self._decide(key, message)
                if answered is not None:
                    return [answered]
        elif self.hooking and kind == NOTIFICATION and message["method"] == CANCELLED:
            params = message.get("params")
            scope = self.hooking.get((key, params.get("requestId") if type(params) is dict else None))
            if scope is not None:  # cancelled while its plugins decide: it never goes upstream
                scope.cancel()
                return []
        return await self.host.routed(key, kind, message)

    def _start(self, key: int, message: dict[str, Any]) -> list[Command] | None:
        """Run request hooks that may wait in a task of their own, bounded by the server's
        request timeout; the client's reader goes on at once. None: the router answers."""
        target = self.host.describe(key, message)
        if target is None or self.host.session_info(key) is None or self.host.request_in_flight(key, message["id"]):
            return None  # the router answers what names nothing, or reuses an id
        id = message["id"]
        server = target[0]
        timeout = self.host.config.servers[server].request_timeout if server in self.host.config.servers else 60.0
        scope = trio.CancelScope(deadline=trio.current_time() + timeout)
        self.hooking[(key, id)] = scope
        assert self.nursery is not None
        self.nursery.start_soon(self._hooked, key, message, scope, server, timeout)
        return []

    async def _hooked(
        self, key: int, message: dict[str, Any], scope: trio.CancelScope, server: str, seconds: float
    ) -> None:
        id = message["id"]
        try:
            with scope:
                answered = await self._decide(key, message)
                if answered is None:  # allowed: routed, and carried out by the hub at once
                    await self.host.route_now(key, message)
            if scope.cancelled_caught:
                if self.host.has_client(key) and trio.current_time() >= scope.deadline:
                    log.warning(
                        "client %d: request hooks did not decide on %s within %gs", key, message["method"], seconds
                    )
                    self.host.answer_now(
                        ToClient(
                            key,
                            proxy_error(
                                id,
                                f"Plugins did not decide on this request within {seconds:g}s",
                                reason="timeout",
                                server=server,
                            ),
                        )
                    )
                return
            if answered is not None:
                self.host.answer_now(answered)
        except Exception:  # noqa: BLE001 - one request's failure, never its client's session
            log.exception("client %d: internal error running request hooks for %s", key, message["method"])
            if self.host.has_client(key):
                self.host.answer_now(
                    ToClient(key, proxy_error(id, "Internal error in the aggregator", reason="internal", server=server))
                )
        finally:
            self.hooking.pop((key, id), None)
            if self.waiters:
                self._wake()

    async def _decide(self, key: int, message: dict[str, Any]) -> ToClient | None:
        """Run the request hooks: the answer they made (a denial, or an answer of their
        own), or None to route the request (its params as the hooks left them)."""
        target = self.host.describe(key, message)
        client = self.host.session_info(key)
        if target is None or client is None or self.host.request_in_flight(key, message["id"]):
            return None  # the router answers what names nothing, or reuses an id
        server, name, exposed = target
        params = message.get("params") or {}
        request = Request(
            key,
            client.profile,
            message["method"],
            server,
            name,
            exposed,
            params,
            principal=client.principal,
            session=client.shared_name,
        )
        try:
            await self.plugins.request(request)
        except Deny as denial:
            self.decided("request", "denied")
            data: dict[str, Any] = {"source": "aggregator", "reason": denial.reason, "server": server}
            if denial.retry_after is not None:
                data["retry_after"] = round(denial.retry_after, 3)
            answer = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {"code": INVALID_REQUEST, "message": denial.message, "data": data},
            }
            self.plugins.response(Response(request, None, answer["error"], 0.0), self.background)
            return ToClient(key, answer)
        if request.answer is not None:
            self.decided("request", "answered")
            self.plugins.response(Response(request, request.answer, None, 0.0), self.background)
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": dict(request.answer)}
            return ToClient(key, self.host.stamped(key, message["method"], answer))
        message["params"] = request.params
        self.watched[(key, message["id"])] = request
        if self.replaced:  # decided on by plugins a reload replaced meanwhile: they see it through
            self.retired[(key, message["id"])] = self.plugins
        self.decided("request", "allowed")
        return None

    def server_request_allowed(self, server: str, method: str, params: dict[str, Any]) -> bool:
        """The per-server policy for a sampling, elicitation or roots request, then the
        plugins' server_request hooks; each refusal counted."""
        if not server_request_allowed(self.host.config, server, method):
            self.policy_denials[(server, method)] = self.policy_denials.get((server, method), 0) + 1
            return False
        if not self.plugins.watch_server_requests:
            return True
        allowed = self.plugins.server_request(ServerRequest(server, method, params))
        self.decided("server_request", "allowed" if allowed else "denied")
        return allowed

    def notify(self, command: ToClient) -> bool:
        message = command.message
        if type(message) is bytes or "method" not in message or "id" in message:
            return True
        params = message.get("params")
        notification = Notification(command.session, message["method"], params if type(params) is dict else {})
        if not self.plugins.notification(notification):
            self.decided("notification", "dropped")
            return False
        if notification.params is not params and notification.params:
            message["params"] = notification.params
        return True

    def background(self, awaitable: Any) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception:  # noqa: BLE001 - observe-only hooks cannot change anything now
                log.exception("a plugin's response hook failed")

        if self.nursery is not None:
            self.nursery.start_soon(run)

    def answered(self, session: int, message: Any) -> None:
        """A client gets an answer: run response hooks if plugins watched its request."""
        if type(message) is bytes or "method" in message:
            return
        key = (session, message.get("id"))
        request = self.watched.pop(key, None)
        if request is None:
            return
        plugins = self.plugins
        if self.retired:
            plugins = self.retired.pop(key, plugins)
            self._wake()
        response = Response(request, message.get("result"), message.get("error"), time.monotonic() - request.started)
        plugins.response(response, self.background)
        if response.result is not None and "result" in message:
            message["result"] = response.result

    def forget_client(self, key: int) -> None:
        """A client left: stop deciding on its requests, forget the ones watched."""
        if not self.hooking and not self.watched:  # no plugin watches anything (every stateless request ends here)
            return
        for hooking in [h for h in self.hooking if h[0] == key]:
            self.hooking.pop(hooking).cancel()
        for watched in [w for w in self.watched if w[0] == key]:
            del self.watched[watched]
            self.retired.pop(watched, None)
        if self.waiters:
            self._wake()


def _already_in_flight(key: int, id: Any) -> ToClient:
    return ToClient(
        key,
        {
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": INVALID_REQUEST, "message": f"Invalid request: id {id!r} is already in flight"},
        },
    )

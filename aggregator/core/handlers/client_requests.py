"""The handlers of client requests, each looked up by its method. Sans-IO.

``ClientRequests`` owns whether startup is complete (until it is, an initialize waits;
so does a modern request, ``core.era.modern_callers``) and the table of handlers
(``handlers``, by method). It is given what a request names (``Targets``), forwarding,
the objects that answer what it does not forward (the handshake, search mode, result
budgets, modern callers, parked calls, a modern server's input, the answers of a parked
call's server), the proxy's own requests upstream, the links, the per-session servers,
the subscriptions and whose each task is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aggregator.core.catalogs.discovery import META_PAGE, SEARCH_TOOLS, Search
from aggregator.core.catalogs.result_budget import RESULTS_SCHEME, ResultBudgets
from aggregator.core.catalogs.targets import Targets
from aggregator.core.catalogs.uris import InvalidUri, normalize_uri
from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.modern_input import ModernInput
from aggregator.core.era.modern_results import list_page_suffix, splice_page
from aggregator.core.era.parked import ParkedCalls
from aggregator.core.era.request_state import is_ours, is_wrapped
from aggregator.core.handlers.answers import Answers
from aggregator.core.lifecycle.upstream_era import LEGACY_ERA, MODERN_ERA
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UNSENT, UpstreamLink
from aggregator.core.records.log_levels import LEVELS
from aggregator.core.replies import answer
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.tasks import TaskOwners, split_task_id
from aggregator.core.upstreams.own_listings import OwnListings
from aggregator.core.upstreams.upstream_control import Gather, UpstreamControl
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INVALID_PARAMS, METHOD_NOT_FOUND, RemoteProtocolError
from aggregator.jsonrpc.kinds import ERROR, RESPONSE
from aggregator.mcp.constants import LIST_METHODS, TOOLS
from aggregator.mcp.modern import LISTEN, REQUEST_STATE, TASKS_EXTENSION, declares_tasks, tasks_required
from aggregator.mcp.versions import DISCOVER

log = logging.getLogger(__name__)


# A client request's handler: (the client, the request) -> commands.
RequestHandler = Callable[[ClientState, dict[str, Any]], list[Command]]


class ClientRequests:
    """A client request's handler, by its method: each looks up what the request names
    (``resolve_target``) and forwards it, or answers it from the proxy's own state."""

    def __init__(
        self,
        *,
        links: dict[str, UpstreamLink],
        per_session: set[str],
        targets: Targets,
        forwarding: Forwarding,
        own_listings: OwnListings,
        handshake: Handshake,
        search: Search,
        budgets: ResultBudgets,
        modern: ModernCallers,
        modern_input: ModernInput,
        parked: ParkedCalls,
        answers: Answers,
        control: UpstreamControl,
        subscriptions: Subscriptions,
        tasks: dict[str, int],
        task_owners: TaskOwners,
    ) -> None:
        self.links = links
        self.per_session = per_session
        self.targets = targets  # what a request names
        self.forwarding = forwarding
        self.own_listings = own_listings  # lists held for a session's own connections to start
        self.handshake = handshake  # initialize
        self.search = search  # search mode's tools and pages
        self.budgets = budgets  # the rest of a cut result, read back
        self.modern = modern  # server/discover, subscriptions/listen
        self.modern_input = modern_input  # a retry with a wrapped upstream state
        self.parked = parked  # a retry that resumes a parked call
        self.answers = answers  # the answer a parked call's server gave meanwhile
        self.control = control  # the proxy's own requests upstream (log levels, gathers, listens)
        self.subscriptions = subscriptions
        self.tasks = tasks  # exposed 2025-11-25 task id -> owning session
        self.task_owners = task_owners  # exposed modern task id -> owning principal
        self.startup_complete = False  # until then, an initialize waits (so does a modern request)
        self.handlers = self._request_handlers()  # by method

    def _initialize(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        return self.handshake.initialize(client, message, self.startup_complete)

    def _ping(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        return [answer(client.key, message["id"], {})]

    def _set_level(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params") or {}
        level = params.get("level")
        if level not in LEVELS:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: level must be one of {', '.join(LEVELS)}")
        client.log_level = level
        return [answer(client.key, message["id"], {}), *self.control.apply_log_level()]

    def _request_handlers(self) -> dict[str, RequestHandler]:
        """The handler of each client request method the proxy serves."""
        return {
            "initialize": self._initialize,
            DISCOVER: self.modern.discover,
            LISTEN: self.modern.listen,
            "ping": self._ping,
            "tools/list": self._list,
            "prompts/list": self._list,
            "resources/list": self._list,
            "resources/templates/list": self._list,
            "tools/call": self._call_by_name,
            "prompts/get": self._call_by_name,
            "resources/read": self._read_resource,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "completion/complete": self._complete,
            "logging/setLevel": self._set_level,
            "tasks/get": self._task_request,
            "tasks/update": self._task_request,
            "tasks/result": self._task_request,
            "tasks/cancel": self._task_request,
            "tasks/list": self._list_tasks,
        }

    def _list(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        kind = LIST_METHODS[message["method"]]
        if self.own_listings.per_user:
            held = self.own_listings.wait(client, message)
            if held is not None:
                return held
        params = message.get("params") or {}
        if kind == TOOLS and self.search.searching(client):
            if params.get("cursor") is not None:
                raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: this list has one page; the cursor is stale")
            page = META_PAGE
        else:
            page = client.catalog.page(kind, params.get("cursor"))
        if client.era is MODERN_ERA:
            page = splice_page(page, list_page_suffix(depends_on_caller=self.modern.depends_on_caller(client)))
        return [ToClient(client.key, _splice_result(message["id"], page), message["id"])]

    def _call_by_name(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        if type(params) is dict and message["method"] == "tools/call" and params.get("name") in SEARCH_TOOLS:
            if self.own_listings.per_user:  # what it searches includes the servers acting as the user
                held = self.own_listings.wait(client, message)
                if held is not None:
                    return held
            searched = self.search.call(client, message)
            if searched is not None:
                return searched
        route = self.targets.resolve(client, message["method"], params)
        arguments = params.get("arguments")
        if arguments is not None and type(arguments) is not dict:  # MCP: an object (null tolerated)
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: arguments must be an object")
        if params.get(REQUEST_STATE) is not None:
            return self._retry(client, message, route.server, dict(params, name=route.original))
        return self.forwarding.forward(client, message, route.server, dict(params, name=route.original))

    def _read_resource(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        uri = params.get("uri") if type(params) is dict else None
        # The rest of a cut result (``result_budget``), in any spelling of its URI: the scheme
        # and host without case, as for every other URI (``core.catalogs.uris``). The scheme is the
        # proxy's own: none of its URIs goes to a server (an unprefixed one would get the token).
        if type(uri) is str and uri[: len(RESULTS_SCHEME)].lower() == RESULTS_SCHEME:
            try:
                normal = normalize_uri(uri)
            except InvalidUri as exc:
                raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {exc}") from None
            return self.budgets.read(client, message, normal)
        server, original = self.targets.resource_route(client, params)
        if params.get(REQUEST_STATE) is not None:
            return self._retry(client, message, server, dict(params, uri=original))
        return self.forwarding.forward(client, message, server, dict(params, uri=original))

    def _retry(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> list[Command]:
        """A request with a ``requestState``: a parked call's retry, a wrapped upstream state
        unwrapped (``core.era.modern_input``), or a state that is none of the proxy's, forwarded."""
        state = params[REQUEST_STATE]
        if is_ours(state):
            out, late = self.parked.resume(client, message, server, params)
            if late is not None:  # the server's final answer came meanwhile: the caller's now
                link, pending, final = late
                out += self.answers.answered(link, pending, RESPONSE if "result" in final else ERROR, final)
            return out
        if is_wrapped(state):
            return self.modern_input.forward_with_state(client, message, server, params)
        return self.forwarding.forward(client, message, server, params)

    def _subscribe(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        server, original = self.targets.resource_route(client, params)
        # One subscription per connection: a per-session server's is its session's own.
        name = self.forwarding.link_name(server, client.key)
        key = (name, original)
        if self.subscriptions.has(key, client.key):
            return [answer(client.key, message["id"], {})]
        if name in self.links and self.links[name].speaks is MODERN_ERA:  # no resources/subscribe: its listen follows
            self.subscriptions.add(key, client.key)
            out = self.control.own_request(name, message["method"], {})
            opened = [c.message["id"] for c in out if type(c) is ToServer and c.message.get("method") == LISTEN]
            if opened:  # answered once the server acknowledges it (``listen_acks``)
                self.links[name].acks.append((client.key, message["id"]))
                self.control.wait_for_ack(self.links[name], opened[0])
                return out
            return [answer(client.key, message["id"], {}), *out]
        if server not in self.per_session and not self.links[server].ready:
            return self.forwarding.forward(client, message, server, params)  # answers "unavailable"
        if not self.subscriptions.add(key, client.key):
            return [answer(client.key, message["id"], {})]  # already subscribed upstream
        out = self.forwarding.forward(client, message, server, dict(params, uri=original))
        pending = client.in_flight.get(message["id"])
        if pending is None:  # refused (overloaded): undo
            self.subscriptions.remove(key, client.key)
        elif pending.phase not in UNSENT:  # sent (else it waits for its connection)
            pending.subscription = key
        return out

    def _unsubscribe(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        server, original = self.targets.resource_route(client, params, while_out=True)
        name = self.forwarding.link_name(server, client.key)
        link = self.links.get(name)
        if not self.subscriptions.remove((name, original), client.key) or link is None or not link.ready:
            return [answer(client.key, message["id"], {})]
        if link.speaks is MODERN_ERA:
            return [answer(client.key, message["id"], {}), *self.control.own_request(name, message["method"], {})]
        return self.forwarding.forward(client, message, server, dict(params, uri=original))

    def _complete(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        route = self.targets.resolve(client, "completion/complete", params)
        ref = params["ref"]
        if ref["type"] == "ref/prompt":
            new_ref = dict(ref, name=route.original)
        else:
            new_ref = dict(ref, uri=route.original)
        return self.forwarding.forward(client, message, route.server, dict(params, ref=new_ref))

    def _task_request(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params: Any = message.get("params")
        task_id: Any = params.get("taskId") if type(params) is dict else None
        split = split_task_id(task_id)
        if client.era is MODERN_ERA:  # the tasks extension: the task is its principal's (``core.requests.tasks``)
            if split is None or split[0] not in self.links or not self.task_owners.owned_by(task_id, client.principal):
                raise RemoteProtocolError(INVALID_PARAMS, f"Unknown task: {task_id}")
            link = self.links[split[0]]
            if link.speaks is LEGACY_ERA or not declares_tasks(link.capabilities):  # it changed since
                why = f"Server {split[0]!r} no longer declares the {TASKS_EXTENSION} extension: its tasks are gone"
                return [ToClient(client.key, tasks_required(message["id"], why))]
            return self.forwarding.forward(client, message, split[0], dict(params, taskId=split[1]))
        if message["method"] == "tasks/update":  # not a 2025-11-25 request
            raise RemoteProtocolError(METHOD_NOT_FOUND, "Method not found: tasks/update")
        # Tasks belong to the session that created them: another session's task id is as
        # unknown as one that never existed.
        if split is None or self.tasks.get(task_id) != client.key or split[0] not in self.links:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown task: {task_id}")
        return self.forwarding.forward(client, message, split[0], dict(params, taskId=split[1]))

    def _list_tasks(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        # The connections this session's requests run on: the shared servers and its own
        # per-session ones (never another session's, nor a per-session server's shared
        # listing connection, where no client's request runs).
        servers = [
            name
            for name, link in self.links.items()
            if link.ready
            and "list" in (link.capabilities.get("tasks") or {})
            and (link.session == client.key or (link.session is None and name not in self.per_session))
        ]
        if not servers:
            return [answer(client.key, message["id"], {"tasks": []})]
        gather = Gather(client.key, message["id"], len(servers))
        out: list[Command] = []
        for server in servers:
            out += self.control.own_request(server, "tasks/list", {}, gather)
        return out


def _splice_result(id: Any, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + dumps(id) + b',"result":' + result + b"}"

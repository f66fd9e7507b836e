"""Server-to-client requests: routed to the one client they are for, or answered. Sans-IO.

``ReverseRequests`` keeps no table of its own: what it asks is in the reverse table
(``reverse_table.ReverseTable``), what waits for roots is ``roots.Roots``'s, and a modern
caller is asked through the parked calls (``core.era.parked``). It is given those, the
clients, the request table (progress tokens name a server message's request), whose each
task is, and the gates for server requests (``proxy.server_requests``, the policy).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from typing import Any

from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.parked import ParkedCalls
from aggregator.core.lifecycle.upstream_era import MODERN_ERA
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Caller, Parked, Pending, UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tasks import RELATED_TASK, expose_task_id, expose_task_ids
from aggregator.core.reverse import affinity
from aggregator.core.reverse.declared import declares
from aggregator.core.reverse.reverse_table import Reverse, ReverseTable
from aggregator.core.reverse.roots import Roots
from aggregator.core.settings import ServerRequestPolicy
from aggregator.jsonrpc.errors import INVALID_REQUEST, METHOD_NOT_FOUND
from aggregator.mcp.constants import PING, SERVER_REQUESTS
from aggregator.mcp.modern import CLIENT_CAPABILITIES


class ReverseRequests:
    """Requests from upstreams to clients, under proxy-minted ids (invariant 5)."""

    def __init__(
        self,
        clients: dict[int, ClientState],
        requests: RequestTable,
        reverse: ReverseTable,
        roots: Roots,
        parked: ParkedCalls,
        tasks: dict[str, int],
        server_requests: Collection[str],
        server_request_policy: ServerRequestPolicy,
        max_in_flight: int,
    ) -> None:
        self.clients = clients
        self.requests = requests  # progress tokens name a request in flight
        self.reverse = reverse  # the requests clients were asked, under the proxy's ids
        self.roots = roots  # roots/list: answered, held, or asked
        self.parked = parked  # a modern caller is asked by its call's result
        self.tasks = tasks  # exposed task id -> owning session
        self.server_requests = server_requests  # the server-to-client requests the proxy routes
        self.server_request_policy = server_request_policy
        self.max_in_flight = max_in_flight  # requests one client may have to answer

    def server_request(self, link: UpstreamLink, message: dict[str, Any], related: int | None = None) -> list[Command]:
        """A request from an upstream to its client: route it to the one client it is for
        (``core.reverse.affinity``), or answer it at once with why it cannot be."""
        server = link.name
        method = message["method"]
        id = message["id"]
        if method == PING:
            return [ToServer(server, {"jsonrpc": "2.0", "id": id, "result": {}})]
        capability = SERVER_REQUESTS.get(method)
        if capability is None or capability not in self.server_requests:
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"Method not found: the aggregator does not route {method} to clients",
                        reason="unroutable",
                        server=server,
                        code=METHOD_NOT_FOUND,
                    ),
                )
            ]
        params = message.get("params")
        if type(params) is not dict:
            params = {}
        if not self.server_request_policy(link.server, method, params):
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"{method} from server {server!r} is not allowed by policy",
                        reason="denied",
                        server=server,
                        code=INVALID_REQUEST,
                    ),
                )
            ]
        if method == "roots/list":
            link.roots_told = False
            # During a modern caller's call, its roots are that call's own question, asked as
            # its input (shared server or not) when it declared roots (``core.era.parked``).
            owner = affinity.request_owner(**self.owner_facts(link, params, related, requests=True))
            caller = _as_caller(owner.session)
            if caller is not None and self._modern_caller(caller):
                if self._caller_declares(link, caller, owner.related, "roots"):
                    return self.parked.ask(link, caller, owner.related, message)
            return self._roots_request(link, id, params, related)
        owner = affinity.request_owner(**self.owner_facts(link, params, related, requests=True))
        caller = _as_caller(owner.session)
        if caller is None:
            why = affinity.unroutable(method, link.server, owner.signal, link.session is not None)
            return [ToServer(server, proxy_error(id, why, reason=owner.signal, server=server))]
        return self._ask_client(link, caller, id, method, params, capability, owner.related)

    def _roots_request(self, link: UpstreamLink, id: Any, params: dict[str, Any], related: int | None) -> list[Command]:
        """roots/list: answered by the proxy, held, or asked of the client the roots come
        from (``core.reverse.roots``)."""
        decided = self.roots.decide(link, id)
        if not isinstance(decided, ClientState):
            return [] if decided is None else [decided]
        owner = affinity.request_owner(**self.owner_facts(link, params, related, requests=True))
        related_id = owner.related if owner.session == decided.key else None
        return self._ask_client(link, decided.key, id, "roots/list", params, "roots", related_id)

    def release_roots(self, client: ClientState) -> list[Command]:
        """A client finished initializing: the roots/list requests held for it go on, and the
        servers answered in its place hear its roots changed."""
        ready, told = self.roots.release(client)
        out: list[Command] = []
        for link, id in ready:
            out += self._roots_request(link, id, {}, None)
        return out + self.roots.changed(told)

    def _modern_caller(self, caller: Caller) -> bool:
        """Whether ``caller`` is a modern client, or a parked call (``core.era.parked``)."""
        if isinstance(caller, Parked):
            return True
        client = self.clients.get(caller)
        return client is not None and client.era is MODERN_ERA

    def _caller_declares(self, link: UpstreamLink, caller: Caller, related: Any, capability: str) -> bool:
        """Whether the modern call ``related`` of ``caller`` (a client's session, or a parked
        call) on ``link`` declared ``capability`` in its ``_meta``."""
        if isinstance(caller, Parked):
            pending: Pending | None = caller.pending
        else:
            client = self.clients.get(caller)
            pending = client.in_flight.get(related) if client is not None and related is not None else None
        if pending is None or pending.server != link.name or pending.meta is None:
            return False
        capabilities = pending.meta.get(CLIENT_CAPABILITIES)
        return type(capabilities) is dict and type(capabilities.get(capability)) is dict

    def _ask_client(
        self,
        link: UpstreamLink,
        caller: Caller,
        id: Any,
        method: str,
        params: dict[str, Any],
        capability: str,
        related: Any,
    ) -> list[Command]:
        """Forward a server's request to client ``caller`` under a proxy-minted id; a
        modern caller (or a parked call) is asked by the result of its call instead
        (``core.era.parked``)."""
        if isinstance(caller, Parked) or self._modern_caller(caller):
            return self.parked.ask(link, caller, related, {"id": id, "method": method, "params": params})
        session = caller
        server = link.name
        client = self.clients[session]
        if not declares(client.capabilities, capability, params):
            if method == "roots/list":
                return [self.roots.answer(link, id)]
            mode = " in url mode" if params.get("mode") == "url" else ""
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"Method not found: the client does not support {method}{mode}",
                        reason="unsupported",
                        server=server,
                        code=METHOD_NOT_FOUND,
                    ),
                )
            ]
        asked = self.reverse.asked.get(session, 0)
        if asked >= self.max_in_flight:  # a client that answers nothing holds nothing more
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"The client already has {asked} requests to answer (the limit); {method} refused",
                        reason="overloaded",
                        server=server,
                    ),
                )
            ]
        proxy_id = self.reverse.open(session, Reverse(server, id, method))
        if method == "elicitation/create" and type(params.get("elicitationId")) is str:
            self.reverse.remember_elicitation(server, params["elicitationId"], session)
        forwarded = dict(params)
        expose_task_ids(server, forwarded)
        return [ToClient(session, {"jsonrpc": "2.0", "id": proxy_id, "method": method, "params": forwarded}, related)]

    def owner_facts(
        self, link: UpstreamLink, params: dict[str, Any], related: int | None, requests: bool
    ) -> dict[str, Any]:
        """What ``core.reverse.affinity`` decides from, read off this link and the message."""
        facts: dict[str, Any] = {"link_session": link.session, "live": link.session in self.clients}
        if link.session is None and not requests:
            facts["streams"] = link.streams
        if related is not None:
            pending = link.pending.get(related)
            caller = _caller(pending, self.clients, requests) if pending is not None else None
            if pending is not None and caller is not None:
                facts["stream"] = (caller, pending.client_id)
            else:
                facts["ended"] = True
        meta = params.get("_meta")
        if type(meta) is dict:
            task = meta.get(RELATED_TASK)
            task_id = task.get("taskId") if type(task) is dict else None
            owner = self.tasks.get(expose_task_id(link.name, task_id)) if type(task_id) is str else None
            if owner in self.clients:
                facts["task"] = owner
            token = meta.get("progressToken")
            pending = self.requests.progress.get(token) if type(token) is str else None
            if pending is not None and pending.server == link.name:
                caller = _caller(pending, self.clients, requests)
                if caller is not None:
                    facts["progress"] = (caller, pending.client_id)
        # The callers in flight matter only when no signal names the owner; a log line of a
        # link that streams belongs to no request then, whoever is in flight.
        if (
            link.session is None
            and related is None
            and not facts.get("streams")
            and "task" not in facts
            and "progress" not in facts
        ):
            in_flight: dict[Caller, list[Any]] = {}
            parked: dict[Caller, list[Any]] = {}
            for pending in link.pending.values():
                if pending.session in self.clients:
                    in_flight.setdefault(pending.session, []).append(pending.client_id)
                elif requests and pending.parked is not None:
                    parked.setdefault(pending.parked, []).append(pending.client_id)
            # A parked call's server waits for its answer: a request it sends is for a call
            # that runs, if there is one (``core.era.parked``).
            facts["in_flight"] = in_flight or parked
            if requests:
                facts["clients"] = [c.key for c in self.clients.values() if c.initialized]
        return facts


def _as_caller(session: Hashable | None) -> Caller | None:
    """What ``core.reverse.affinity`` named as a server request's owner: the facts it decided from
    name clients by session and parked calls by their record, nothing else."""
    assert session is None or type(session) is int or type(session) is Parked, session
    return session


def _caller(pending: Pending, clients: Mapping[int, Any], requests: bool) -> Caller | None:
    """Who a server's message about ``pending`` is for: its client if still connected; for a
    server's request (``requests``), its parked call while it is parked; else nobody."""
    if pending.session in clients:
        return pending.session
    if requests and pending.parked is not None:
        return pending.parked
    return None

"""A legacy server's call parked while its modern caller provides input. Sans-IO.

A legacy (2025) server asks its client for sampling, elicitation or roots in the middle
of a call, and waits. A modern (2026-07-28) client takes no requests: it is asked by an
``input_required`` result and answers by retrying its request. The bridge between them:

1. A legacy server's request during a modern caller's tools/call, prompts/get or
   resources/read is **gathered**: the requests the server sends for that call within
   ``GATHER_SECONDS`` of the first (a server asking several things at once) are asked
   together. Each is checked against the capabilities the request declared in its
   ``_meta``; what was not declared is never asked. When the window closes, the call is
   **parked** if anything can be asked: the caller is answered
   ``{"resultType": "input_required", "inputRequests": {key: request}, "requestState": s}``
   (the undeclared requests get -32601 from the proxy, the server decides), and the
   upstream call stays in flight, taken off its client (an HTTP caller's client lives for
   one request only): its ``Pending`` is in phase PARKED, on no session, until it resumes. When nothing
   can be asked, the call needs what the caller lacks: it is answered -32021
   MissingRequiredClientCapability naming it (``data.requiredCapabilities``), the
   server's requests get an error and the call is cancelled upstream.
2. Further requests of the server for the same call, once parked, are queued; the
   server's final answer, if it comes now, is kept.
3. The retry (same method and params, a new id, ``inputResponses`` and the state, whose
   tag ``core.era.request_state`` checks) answers each waiting server request under the
   server's own id; the call becomes the retry's and the retry waits for the final answer.
   What it did not answer (and what was queued meanwhile) is asked again in a new
   ``input_required`` result; extra responses are ignored.
4. No retry within ``input_required_timeout`` (the router's clock, in its deadlines
   heap): the server's waiting requests get an error and the call is cancelled upstream.
5. Parked calls are bounded (``ParkedTable``): ``proxy.max_parked_calls`` in all and
   ``proxy.max_parked_per_principal`` per caller's principal (none for a caller without
   one: its front has no principal to tell callers apart). Each ``input_required`` answer
   ends an HTTP caller's request, so no in-flight limit of the fronts counts a parked
   call: these do. A call that would go past either is not parked: the server's requests
   are refused, the call is cancelled upstream and fails ``overloaded`` to its caller.
6. The parked calls of one server expire at least ``EXPIRY_SPACING`` apart: calls parked
   in a burst are not all cancelled on their server in one burst when their callers never
   retry (a server given hundreds of cancels and error answers at once may not survive
   them).

A parked call's id also names it in ``requestState`` and comes from the counter of
proxy-minted server-to-client request ids, so none repeats in a process. The key of an
input request is the server's own JSON-RPC id for it, as a string (``7`` -> ``"7"``),
made unique within the result when two collide: a server can name its questions, and the
key says which of its requests an answer is for.

``ParkedCalls`` owns the parked calls (``table``, a ``ParkedTable``) and the gatherings of a
running call's requests (``gathering``); it is given the clients, the links, the request
table, the reverse table (for its ids), the request states and the clock. A retry that
finds the server's final answer already in (rule 2) hands that answer back (``resume``):
it reaches the caller the way every upstream answer does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.modern_results import stamp_result
from aggregator.core.era.request_state import RequestStates, request_digest
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Ask, Parked, Pending, Phase, UpstreamLink
from aggregator.core.replies import answer, cancelled, proxy_error
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.reverse.declared import declares, merge_required, required_of
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.jsonrpc.errors import INVALID_PARAMS, METHOD_NOT_FOUND, RemoteProtocolError
from aggregator.mcp.constants import SERVER_REQUESTS
from aggregator.mcp.modern import (
    CLIENT_CAPABILITIES,
    INPUT_REQUESTS,
    INPUT_REQUIRED,
    INPUT_REQUIRED_METHODS,
    INPUT_RESPONSES,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    REQUEST_STATE,
    RESULT_TYPE,
    request_meta,
)

log = logging.getLogger(__name__)

# How long the first request of a server for a running call waits for others of that call
# sent with it, to be asked in the same input_required result (the router's clock).
GATHER_SECONDS = 0.005
# Parked calls of one server expire at least this far apart (at most 200 a second).
EXPIRY_SPACING = 0.005


class ParkedTable(dict[int, Parked]):
    """Parked call id -> its ``Parked`` record, within its bounds (rules 5 and 6): the
    count of each principal's calls in the table and the latest deadline of each server's."""

    def __init__(self, max_calls: int, max_per_principal: int) -> None:
        super().__init__()
        self.max_calls = max_calls
        self.max_per_principal = max_per_principal
        self.by_principal: dict[Any, int] = {}  # principal -> its calls in the table
        self.expiry: dict[str, float] = {}  # link -> the latest deadline of its parked calls

    def full(self, principal: Any) -> str | None:
        """Why one more call of ``principal`` cannot be parked (a limit is reached), or None."""
        if len(self) >= self.max_calls:
            return f"{len(self)} calls already wait for their callers' input (proxy.max_parked_calls)"
        if principal is not None and self.by_principal.get(principal, 0) >= self.max_per_principal:
            return (
                f"{self.max_per_principal} calls of this caller already wait for its input"
                " (proxy.max_parked_per_principal)"
            )
        return None

    def add(self, parked: Parked) -> None:
        """Put ``parked`` in the table and its principal's count."""
        self[parked.id] = parked
        principal = parked.principal
        if principal is not None:
            self.by_principal[principal] = self.by_principal.get(principal, 0) + 1

    def remove(self, parked: Parked) -> None:
        """Take ``parked`` out of the table and its principal's count."""
        self.pop(parked.id, None)
        principal = parked.principal
        if principal is not None:
            left = self.by_principal.get(principal, 0) - 1
            if left > 0:
                self.by_principal[principal] = left
            else:
                self.by_principal.pop(principal, None)

    def deadline(self, server: str, now: float, ttl: float) -> float:
        """When a call parked now on ``server`` expires: ``ttl`` from now, but at least
        ``EXPIRY_SPACING`` after the previous one of that server (rule 6)."""
        expiries = self.expiry
        deadline = max(now + ttl, expiries.get(server, 0.0) + EXPIRY_SPACING)
        if len(expiries) > 1024 and server not in expiries:  # per-session links come and go
            for name in [name for name, at in expiries.items() if at < now]:
                del expiries[name]
        expiries[server] = deadline
        return deadline


class Gathering:
    """The requests a server sent for one running call within ``GATHER_SECONDS``."""

    __slots__ = ("pending", "asks", "missing", "deadline", "done")

    def __init__(self, pending: Pending, deadline: float) -> None:
        self.pending = pending
        self.asks: dict[str, Ask] = {}  # what the caller declared: to ask
        self.missing: list[Ask] = []  # what it did not: refused, or the call fails -32021
        self.deadline = deadline
        self.done = False


# A server's final answer that came while its call was parked, for the retry's caller:
# (its link, the call, the answer).
LateAnswer = tuple[UpstreamLink, Pending, dict[str, Any]]


class ParkedCalls:
    """Server requests during a modern caller's call, turned into input_required results."""

    def __init__(
        self,
        table: ParkedTable,
        clients: dict[int, ClientState],
        links: dict[str, UpstreamLink],
        requests: RequestTable,
        reverse: ReverseTable,
        request_states: RequestStates,
        max_in_flight: int,
        clock: Callable[[], float],
    ) -> None:
        self.table = table  # the parked calls, within their bounds
        self.gathering: dict[tuple[str, Any], Gathering] = {}  # (link, upstream id) -> a call's requests, gathered
        self.clients = clients
        self.links = links
        self.requests = requests
        self.reverse = reverse  # mints the parked calls' ids
        self.request_states = request_states  # signs what resumes a call
        self.max_in_flight = max_in_flight  # requests one call may have its caller asked
        self.clock = clock

    def ask(self, link: UpstreamLink, caller: int | Parked, related: Any, ask: dict[str, Any]) -> list[Command]:
        """A server's request ``ask`` for ``caller`` (a client's session, or a parked call)
        during its request ``related``: park the call and ask, queue, or refuse."""
        id, method = ask["id"], ask["method"]
        params = ask.get("params")
        if type(params) is not dict:
            params = {}
        parked = caller if type(caller) is Parked else None
        pending = parked.pending if parked is not None else self._modern_call(link, caller, related)
        if pending is None or pending.done:
            why = f"{method} came outside any call of a modern client, which can only be asked during one"
            return [_refuse(link, id, why, "no_request")]
        if pending.method not in INPUT_REQUIRED_METHODS:
            why = f"Method not found: a modern client cannot be asked for {method} during {pending.method}"
            return [_refuse(link, id, why, "unsupported", METHOD_NOT_FOUND)]
        capabilities = (pending.meta or {}).get(CLIENT_CAPABILITIES)
        declared = type(capabilities) is dict and declares(capabilities, SERVER_REQUESTS[method], params)
        if parked is not None:
            if not declared:
                return [_refuse(link, id, _undeclared(Ask(id, method, params)), "unsupported", METHOD_NOT_FOUND)]
            if len(parked.asks) >= self.max_in_flight:
                why = f"The client already has {len(parked.asks)} requests to answer (the limit); {method} refused"
                return [_refuse(link, id, why, "overloaded")]
            parked.asks[_input_key(parked.asks, id)] = Ask(id, method, params)
            return []  # asked with the next input_required, when the caller retries
        key = (pending.server, pending.upstream_id)
        gathering: Gathering | None = self.gathering.get(key)
        if gathering is None:
            gathering = self.gathering[key] = Gathering(pending, self.clock() + GATHER_SECONDS)
            self.requests.deadlines.push(gathering.deadline, gathering)
        if not declared:
            gathering.missing.append(Ask(id, method, params))
        elif len(gathering.asks) >= self.max_in_flight:
            why = f"The client already has {len(gathering.asks)} requests to answer (the limit); {method} refused"
            return [_refuse(link, id, why, "overloaded")]
        else:
            gathering.asks[_input_key(gathering.asks, id)] = Ask(id, method, params)
        return []  # asked when the window closes (``_gathered``)

    def _gathered(self, gathering: Gathering) -> list[Command]:
        """The window of a call's requests closed: park the call and ask what the caller
        declared, or fail it -32021 when it declared none of what the server needs."""
        gathering.done = True
        pending = gathering.pending
        self.gathering.pop((pending.server, pending.upstream_id), None)
        link = self.links.get(pending.server)
        if link is None or not link.ready:
            return []  # the link's end failed the call and its requests
        out: list[Command] = []
        client = self.requests.client_of(pending)
        if pending.done or client is None:
            asks = list(gathering.asks.values()) + gathering.missing
            return [_refuse_ask(link.name, ask, "the call ended") for ask in asks]
        out += [
            _refuse(link, ask.upstream_id, _undeclared(ask), "unsupported", METHOD_NOT_FOUND)
            for ask in gathering.missing
        ]
        if gathering.asks:
            full = self.table.full(client.principal)
            if full is not None:
                ids = [ask.upstream_id for ask in gathering.asks.values()]
                return out + self._park_refused(link, pending, client, ids, full)
            return out + self._park(pending, client, pending.client_id, gathering.asks)
        required: dict[str, Any] = {}
        for ask in gathering.missing:
            merge_required(required, required_of(ask))
        names = ", ".join(sorted(required))
        why = (
            f"Server {link.server!r} needs the client capability {names} to answer {pending.method},"
            " and this request did not declare it"
        )
        log.info("server %s: %s needs undeclared client capability %s; refused", link.name, pending.method, names)
        self.requests.end(pending, "error", "unsupported")
        error = proxy_error(
            pending.client_id, why, reason="unsupported", server=link.server, code=MISSING_REQUIRED_CLIENT_CAPABILITY
        )
        error["error"]["data"]["requiredCapabilities"] = required
        out.append(ToServer(link.name, cancelled(pending.upstream_id, "the client lacks a capability it needs")))
        out.append(ToClient(client.key, error))
        return out

    def _park_refused(
        self, link: UpstreamLink, pending: Pending, client: ClientState, ids: list[Any], full: str
    ) -> list[Command]:
        """A call that needs input but cannot be parked (rule 5): the server's requests are
        refused, the call cancelled upstream and failed ``overloaded`` to its caller."""
        log.warning("server %s: %s needs input but %s; refused", link.name, pending.method, full)
        self.requests.end(pending, "error", "overloaded")
        why = f"Server {link.server!r} needs input for {pending.method}, but {full}; try again later"
        out: list[Command] = [
            ToServer(link.name, proxy_error(id, why, reason="overloaded", server=link.server)) for id in ids
        ]
        out.append(ToServer(link.name, cancelled(pending.upstream_id, "the aggregator holds too many parked calls")))
        out.append(ToClient(client.key, proxy_error(pending.client_id, why, reason="overloaded", server=link.server)))
        return out

    def _modern_call(self, link: UpstreamLink, caller: int | Parked, related: Any) -> Pending | None:
        """The call of modern client ``caller`` on ``link`` that ``related`` names."""
        client = self.clients.get(caller) if type(caller) is int else None
        pending = client.in_flight.get(related) if client is not None and related is not None else None
        if pending is None or pending.server != link.name or pending.meta is None:
            return None
        return pending

    def _park(self, pending: Pending, client: ClientState, client_id: Any, asks: dict[str, Ask]) -> list[Command]:
        """Take ``pending`` off ``client`` and answer its request ``client_id`` with an
        input_required result asking ``asks``."""
        params = pending.params if pending.params is not None else {}
        number = self.reverse.mint()
        deadline = self.table.deadline(pending.server, self.clock(), self.request_states.ttl)
        parked = Parked(number, pending, client.principal, params, deadline)
        parked.asks = asks
        if client.in_flight.get(pending.client_id) is pending:
            del client.in_flight[pending.client_id]
        pending.session = None
        pending.phase = Phase.PARKED
        pending.parked = parked
        self.table.add(parked)
        self.requests.deadlines.push(deadline, parked)
        digest = request_digest(pending.method, params, self.links[pending.server].server)
        state = self.request_states.mint(number, client.principal, deadline, digest)
        requests = {key: {"method": ask.method, "params": _shown(ask.params)} for key, ask in asks.items()}
        result = {RESULT_TYPE: INPUT_REQUIRED, INPUT_REQUESTS: requests, REQUEST_STATE: state}
        stamp_result(result, pending.method, depends_on_caller=False)  # the proxy's identity, as on every answer
        return [answer(client.key, client_id, result)]

    def resume(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> tuple[list[Command], LateAnswer | None]:
        """A retry (to ``server``, ``params`` as sent there) carrying a state of the proxy's:
        answer the server's waiting requests and resume the call, or ask again for what is
        still missing. Second: the server's final answer that came meanwhile, for the
        caller's answer to take its usual way."""
        method = message["method"]
        digest = request_digest(method, params, server)
        number = self.request_states.verify(params[REQUEST_STATE], client.principal, self.clock(), digest)
        parked: Parked | None = self.table.get(number)
        if parked is None:
            raise RemoteProtocolError(
                INVALID_PARAMS,
                "Invalid requestState: the call it continues is no longer waiting"
                " (it was resumed already, or gave up); send the request again without it",
            )
        parked.done = True  # resumed: its deadline no longer applies
        self.table.remove(parked)
        self.requests.deadlines.discard()
        pending = parked.pending
        pending.phase = Phase.SENT
        pending.parked = None
        pending.params = parked.params
        meta = request_meta(message)
        if meta is not None:
            pending.meta = meta
        link = self.links[pending.server]
        live = not pending.done and link.ready
        responses = params.get(INPUT_RESPONSES)
        if type(responses) is not dict:
            responses = {}
        out: list[Command] = []
        for key in [key for key in parked.asks if type(responses.get(key)) is dict]:  # extra ones are ignored
            ask = parked.asks.pop(key)
            if live:
                out.append(ToServer(link.name, _answer(ask, responses[key])))
        pending.session = client.key
        pending.client_id = message["id"]
        if pending.done:  # the server answered meanwhile, or gave up
            if link.ready:
                out += [_refuse_ask(link.name, ask, "the call ended") for ask in parked.asks.values()]
            if parked.final is not None:
                return out, (link, pending, parked.final)
            why = f"Server {link.server!r} ended {method} while it waited for input (it timed out or was lost)"
            return out + [
                ToClient(client.key, proxy_error(message["id"], why, reason="unavailable", server=link.server))
            ], None
        if parked.asks:  # some were not answered, or were asked meanwhile: ask again
            return out + self._park(pending, client, message["id"], parked.asks), None
        client.in_flight[message["id"]] = pending
        token = meta.get("progressToken") if meta is not None else None
        if pending.token is not None and (type(token) is int or type(token) is str):
            pending.client_token = token
        return out, None

    def expire(self, parked: Parked | Gathering) -> list[Command]:
        """A call whose caller did not retry in time: its waiting requests fail, and it is
        cancelled upstream. (A gathering whose window closed is due here too.)"""
        if isinstance(parked, Gathering):
            return self._gathered(parked)
        parked.done = True
        self.table.remove(parked)
        pending = parked.pending
        link = self.links.get(pending.server)
        if link is None or not link.ready:
            self.requests.end(pending, "error", "timeout")
            return []
        why = "the client did not answer in time"
        out: list[Command] = [_refuse_ask(link.name, ask, why, "timeout") for ask in parked.asks.values()]
        if not pending.done:
            log.info(
                "server %s: no input for %s within %gs; cancelled", link.name, pending.method, self.request_states.ttl
            )
            self.requests.end(pending, "error", "timeout")
            out.append(ToServer(link.name, cancelled(pending.upstream_id, "the client gave no input in time")))
        return out


def _input_key(asks: dict[str, Ask], id: Any) -> str:
    """The key a server's request ``id`` is asked under: the id as a string, unique in ``asks``."""
    key = id if type(id) is str else str(id)
    if key not in asks:
        return key
    n = 2
    while f"{key}-{n}" in asks:
        n += 1
    return f"{key}-{n}"


def _undeclared(ask: Ask) -> str:
    mode = " in url mode" if ask.params.get("mode") == "url" else ""
    capability = SERVER_REQUESTS[ask.method]
    return f"Method not found: the client did not declare {capability} for this request ({ask.method}{mode})"


def _shown(params: dict[str, Any]) -> dict[str, Any]:
    """A server request's params as the client sees them: the proxy's ``_meta`` (its
    progress token) is not the client's business."""
    if "_meta" not in params:
        return params
    return {key: value for key, value in params.items() if key != "_meta"}


def _answer(ask: Ask, response: dict[str, Any]) -> dict[str, Any]:
    """The client's input, as the answer to the server's request (a legacy result has no
    ``resultType``)."""
    if RESULT_TYPE in response:
        response = {key: value for key, value in response.items() if key != RESULT_TYPE}
    return {"jsonrpc": "2.0", "id": ask.upstream_id, "result": response}


def _refuse(link: UpstreamLink, id: Any, why: str, reason: str, code: int | None = None) -> ToServer:
    if code is None:
        return ToServer(link.name, proxy_error(id, why, reason=reason, server=link.server))
    return ToServer(link.name, proxy_error(id, why, reason=reason, server=link.server, code=code))


def _refuse_ask(server: str, ask: Ask, why: str, reason: str = "ended") -> ToServer:
    message = f"No answer to {ask.method}: {why}"
    return ToServer(server, proxy_error(ask.upstream_id, message, reason=reason, server=server))

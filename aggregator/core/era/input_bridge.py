"""A modern server's ``input_required`` result for a legacy client, bridged. Sans-IO.

A modern (2026-07-28) server asks for sampling, elicitation or roots by answering a call
(``tools/call``, ``prompts/get``, ``resources/read``) with ``resultType:
"input_required"``: ``inputRequests`` (key -> a server request) and an opaque
``requestState``. A legacy client knows nothing of that; it answers server-to-client
requests. So, for a legacy caller, the proxy plays the modern client's part:

1. Each ``inputRequests`` entry goes to the caller as an ordinary server-to-client
   request under a proxy-minted id (invariant 5), related to the call (so a Streamable
   HTTP session gets it on the call's own stream), through the same gates as a legacy
   server's request: ``proxy.server_requests``, the server-request policy, the
   capabilities the client declared. A ``roots/list`` here is the call's own question
   (the answer serves that call only, shared server or not): it goes to the caller when it
   declared roots, else ``proxy.roots`` answer it; the same rule as a legacy server's
   roots/list during a modern caller's call (``core.handlers.reverse_requests``).
2. The answers are collected in a ``Bridge`` (the ``Reverse`` entry of each question
   holds a ``Question`` where a server's request id would be: its answer goes to the
   bridge, never to the server). When the last one is in, the call is retried upstream under a NEW
   upstream id with the params it was first sent with, plus ``inputResponses`` (key ->
   the client's result) and ``requestState`` echoed exactly (left out when the server
   gave none). The caller's progress token stays the proxy's same token, so progress
   and log lines of the retry reach the caller as the first attempt's did.
3. The retry's answer is the call's: a complete result (or an error) goes to the client
   as usual, another ``input_required`` is a new round.

Rules (each exit is one of these, so nothing is left behind):

- While the client is being asked, the call is a ``Pending`` in ``client.in_flight`` and
  in the deadlines, not in ``link.pending``: nothing is in flight upstream. Its deadline
  and hard deadline are the call's own, carried across rounds and retries: the whole
  exchange stays within the request's timeout (``_time_out`` -> ``InputBridge.timed_out``).
- At most ``MAX_INPUT_ROUNDS`` rounds per call; past them the call fails.
- A request the client cannot be asked (not routed, denied by policy, a capability it did
  not declare, an unknown method) fails the call at once, before anything is asked: the
  spec forbids a server to ask what the client did not declare, and the modern result
  has no place for an error in ``inputResponses``. So does an error the client answers
  (or an answer the proxy refuses): the call fails with that error named, and the
  client's other questions of that round are cancelled. (Leaving the key out would only
  have the server ask again.)
- A client cancel ends the call: its questions are cancelled, nothing more is sent
  upstream (nothing is in flight there while it is asked; a retry in flight is
  cancelled as any request). A client that leaves takes it along. An upstream lost fails
  it as any pending request of that upstream.

``InputBridge`` keeps no table of its own: a bridge travels with its call (``Pending.bridge``)
and its questions are entries of the reverse table. It is given the clients, the links, the
request table, the reverse table, roots and the gates for server requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.lifecycle.upstream_era import LEGACY_ERA
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Bridge, Pending, Phase, UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tasks import expose_task_ids
from aggregator.core.reverse.declared import declares
from aggregator.core.reverse.reverse_table import ProxyId, Reverse, ReverseTable
from aggregator.core.reverse.roots import Roots
from aggregator.core.settings import ServerRequestPolicy
from aggregator.mcp.constants import CANCELLED, SERVER_REQUESTS
from aggregator.mcp.modern import (
    INPUT_REQUESTS,
    INPUT_REQUIRED,
    INPUT_REQUIRED_METHODS,
    INPUT_RESPONSES,
    REQUEST_STATE,
    RESULT_TYPE,
)

log = logging.getLogger(__name__)

# Rounds of input one call may ask of its client before the proxy gives up on it.
MAX_INPUT_ROUNDS = 8
# A question for the client: its key in ``inputRequests``, its method and params.
Ask = tuple[str, str, dict[str, Any]]


class Question:
    """The ``upstream_id`` of a ``Reverse`` entry for one of a bridge's questions: which
    question of which bridge (no server's id is one of these, so ``ReverseTable.ids`` and the
    servers' answers never mix with it)."""

    __slots__ = ("proxy_id", "key", "bridge")

    def __init__(self, proxy_id: ProxyId, key: str, bridge: Bridge) -> None:
        self.proxy_id = proxy_id
        self.key = key
        self.bridge = bridge


def is_question(reverse: Reverse) -> bool:
    """Whether a server-to-client request in flight is one of the bridge's questions."""
    return type(reverse.upstream_id) is Question


def awaits_input(pending: Pending) -> bool:
    """Whether this call waits for its client's input (nothing of it in flight upstream)."""
    return pending.phase is Phase.ASKING


def is_input_required(result: Any) -> bool:
    return type(result) is dict and result.get(RESULT_TYPE) == INPUT_REQUIRED


class InputBridge:
    """``input_required`` results of modern servers, turned into questions to legacy callers."""

    def __init__(
        self,
        clients: dict[int, ClientState],
        links: dict[str, UpstreamLink],
        requests: RequestTable,
        reverse: ReverseTable,
        roots: Roots,
        server_requests: Collection[str],
        server_request_policy: ServerRequestPolicy,
        max_in_flight: int,
        clock: Callable[[], float],
    ) -> None:
        self.clients = clients
        self.links = links
        self.requests = requests
        self.reverse = reverse  # the questions asked, beside the servers' own requests
        self.roots = roots  # a roots/list the proxy answers itself
        self.server_requests = server_requests  # the server-to-client requests the proxy routes
        self.server_request_policy = server_request_policy
        self.max_in_flight = max_in_flight  # questions one client may have to answer
        self.clock = clock

    def bridges(self, link: UpstreamLink, pending: Pending, result: Any) -> bool:
        """Whether this answer (from a modern link) is an ``input_required`` result for a
        legacy caller that is still there: the bridge's to handle."""
        if not is_input_required(result):
            return False
        client = self.requests.client_of(pending)
        return client is not None and client.era is LEGACY_ERA

    def bridge(self, link: UpstreamLink, pending: Pending, result: dict[str, Any]) -> list[Command]:
        """The server needs input for ``pending``: ask its client, or retry at once."""
        server = link.server or link.name
        if pending.bridge is not None:
            bridge = pending.bridge
        elif pending.params is not None and pending.method in INPUT_REQUIRED_METHODS:
            bridge = Bridge(pending.params)
        else:
            log.warning("server %s: answered %s with input_required, which it may not", link.name, pending.method)
            return self.requests.fail(
                pending,
                f"Server {server!r} answered {pending.method} with input_required, which it may not",
                "malformed",
            )
        bridge.rounds += 1
        if bridge.rounds > MAX_INPUT_ROUNDS:
            log.warning("server %s: %s asked for input %d times; given up", link.name, pending.method, bridge.rounds)
            return self.requests.fail(
                pending,
                f"Server {server!r} asked for input more than {MAX_INPUT_ROUNDS} times for one {pending.method}",
                "too_many_rounds",
            )
        requests = result.get(INPUT_REQUESTS)
        state = result.get(REQUEST_STATE)
        if (
            (requests is not None and type(requests) is not dict)
            or (state is not None and type(state) is not str)
            or (not requests and state is None)
        ):
            return self.requests.fail(
                pending,
                f"Server {server!r} answered {pending.method} with an invalid input_required result",
                "malformed",
            )
        asks, answers, failed = self._input_plan(link, pending, requests or {})
        if failed is not None:
            return failed
        bridge.state = state
        bridge.answers = answers if requests is not None else None
        waiting = self._input_wait(pending, bridge)
        out: list[Command] = [self._ask_input(link, waiting, bridge, *ask) for ask in asks]
        if not bridge.asks:
            out += self._input_retry(waiting, bridge)
        return out

    def _input_plan(
        self, link: UpstreamLink, pending: Pending, requests: dict[str, Any]
    ) -> tuple[list[Ask], dict[str, Any], list[Command] | None]:
        """Decide every question before asking any: the questions for the client and the
        answers the proxy gives itself; when one cannot be asked, the call is failed (the
        commands that say so come third, else None)."""
        server = link.server or link.name
        client = self.clients[pending.key()]
        asks: list[Ask] = []
        answers: dict[str, Any] = {}
        for key, entry in requests.items():
            method = entry.get("method") if type(entry) is dict else None
            params = entry.get("params", {}) if type(entry) is dict else None
            if type(method) is not str or type(params) is not dict:
                why = f"Server {server!r} asked for input {key!r} with an invalid request"
                return asks, answers, self.requests.fail(pending, why, "malformed")
            refusal = self._input_refusal(link, client, method, params)
            if refusal is not None:
                log.info(
                    "server %s: %s needs %s of client %d: %s", link.name, pending.method, method, client.key, refusal[1]
                )
                return asks, answers, self.requests.fail(pending, *refusal)
            if method == "roots/list" and not self._asks_for_roots(link, client):
                answers[key] = {"roots": self.roots.roots or []}
            else:
                asks.append((key, method, params))
        asked = self.reverse.asked.get(client.key, 0)
        if asked + len(asks) > self.max_in_flight:
            why = (
                f"Server {server!r} asked {len(asks)} questions for {pending.method}; the client already has "
                f"{asked} to answer (limit {self.max_in_flight})"
            )
            return asks, answers, self.requests.fail(pending, why, "overloaded")
        return asks, answers, None

    def _input_refusal(
        self, link: UpstreamLink, client: ClientState, method: str, params: dict[str, Any]
    ) -> tuple[str, str] | None:
        """Why the client cannot be asked this (message, reason), or None: the gates of a
        legacy server's request (``reverse_requests``)."""
        server = link.server or link.name
        capability = SERVER_REQUESTS.get(method)
        if capability is None:
            return f"Server {server!r} asked for input with {method}, which is not an input request", "malformed"
        if capability not in self.server_requests:
            return f"Server {server!r} needs {method}, which the aggregator does not route to clients", "unroutable"
        if not self.server_request_policy(link.server, method, params):
            return f"{method} from server {server!r} is not allowed by policy", "denied"
        if method != "roots/list" and not declares(client.capabilities, capability, params):
            mode = " in url mode" if params.get("mode") == "url" else ""
            return f"Server {server!r} needs {method}{mode}, which the client does not support", "unsupported"
        return None

    def _asks_for_roots(self, link: UpstreamLink, client: ClientState) -> bool:
        """Whether a ``roots/list`` asked as a call's input is its caller's to answer: it is
        that call's own question, shared server or not (the rule of the opposite bridge,
        ``core.handlers.reverse_requests``), when the caller declared roots; if not,
        ``proxy.roots`` answer it."""
        return "roots" in client.capabilities

    def _input_wait(self, pending: Pending, bridge: Bridge) -> Pending:
        """End ``pending`` upstream; the call waits for its client's input, under its own
        deadlines and progress token."""
        waiting = self._successor(pending, 0)  # 0: no upstream id (nothing in flight there)
        waiting.phase = Phase.ASKING
        waiting.bridge = bridge
        bridge.waiting = waiting
        self.clients[waiting.key()].in_flight[waiting.client_id] = waiting
        self.requests.deadlines.push(waiting.deadline, waiting)
        return waiting

    def _successor(self, pending: Pending, upstream_id: int) -> Pending:
        """A new record of the same call, ``pending`` ended (its progress token kept)."""
        token = pending.token
        pending.token = None  # the call's token stays the same across its rounds
        self.requests.end(pending)
        after = Pending(pending.session, pending.client_id, pending.method, pending.server, upstream_id)
        after.client_token = pending.client_token
        after.token = token
        after.deadline = pending.deadline
        after.hard_deadline = pending.hard_deadline
        if token is not None:
            self.requests.progress[token] = after
        return after

    def _ask_input(
        self, link: UpstreamLink, waiting: Pending, bridge: Bridge, key: str, method: str, params: dict[str, Any]
    ) -> ToClient:
        """One question to the client, under a proxy-minted id, on the call's stream."""
        session = waiting.key()
        proxy_id = self.reverse.ask_id()
        self.reverse.add(session, proxy_id, Reverse(link.name, Question(proxy_id, key, bridge), method))
        bridge.asks[key] = proxy_id
        if method == "elicitation/create" and type(params.get("elicitationId")) is str:
            self.reverse.remember_elicitation(link.name, params["elicitationId"], session)
        forwarded = dict(params)
        expose_task_ids(link.name, forwarded)
        request = {"jsonrpc": "2.0", "id": proxy_id, "method": method, "params": forwarded}
        return ToClient(session, request, waiting.client_id)

    def answered(self, client: ClientState, reverse: Reverse, message: dict[str, Any]) -> list[Command]:
        """The client answered one of the bridge's questions (its ``Reverse`` is ended)."""
        question: Question = reverse.upstream_id
        bridge, key = question.bridge, question.key
        waiting = bridge.waiting
        if waiting is None or waiting.done or bridge.asks.get(key) != question.proxy_id:
            return []  # the call ended meanwhile
        del bridge.asks[key]
        result = message.get("result")
        if "error" in message or type(result) is not dict:
            error = message.get("error")
            detail = error.get("message") if type(error) is dict else None
            why = f"an error ({detail})" if type(detail) is str else "an error" if error is not None else "no result"
            return self._input_failed(
                waiting,
                f"The client answered {reverse.method} with {why}; {waiting.method} cannot go on",
                "input_failed",
            )
        assert bridge.answers is not None  # questions were asked
        bridge.answers[key] = result
        if bridge.asks:
            return []
        return self._input_retry(waiting, bridge)

    def refused(self, reverse: Reverse, why: str, reason: str) -> list[Command]:
        """The client's answer to one of the bridge's questions could not be accepted."""
        question: Question = reverse.upstream_id
        waiting = question.bridge.waiting
        if waiting is None or waiting.done:
            return []
        question.bridge.asks.pop(question.key, None)
        return self._input_failed(waiting, f"The client's answer to {reverse.method} was refused ({why})", reason)

    def _input_retry(self, waiting: Pending, bridge: Bridge) -> list[Command]:
        """Every answer is in: send the call again, under a new upstream id."""
        link = self.links.get(waiting.server)
        if link is None or not link.ready or link.overloaded is not None:
            server = link.server if link is not None else waiting.server
            return self._input_failed(
                waiting, f"Server {server!r} is not available to finish {waiting.method}", "unavailable"
            )
        params = {k: v for k, v in bridge.params.items() if k != INPUT_RESPONSES and k != REQUEST_STATE}
        if bridge.answers is not None:
            params[INPUT_RESPONSES] = bridge.answers
        if bridge.state is not None:
            params[REQUEST_STATE] = bridge.state
        bridge.waiting = None
        bridge.answers = None
        upstream_id = link.next_id
        link.next_id = upstream_id + 1
        retry = self._successor(waiting, upstream_id)
        retry.bridge = bridge
        link.pending[upstream_id] = retry
        retry.sent_at = self.clock()
        self.clients[retry.key()].in_flight[retry.client_id] = retry
        self.requests.deadlines.push(retry.deadline, retry)
        return [ToServer(link.name, {"jsonrpc": "2.0", "id": upstream_id, "method": retry.method, "params": params})]

    def closed(
        self, waiting: Pending, why: str, outcome: str = "cancelled", reason: str = "cancelled"
    ) -> list[Command]:
        """End a call that waits for input: its open questions are withdrawn from the client
        (counted as ``outcome`` for ``reason``)."""
        bridge = waiting.bridge
        assert bridge is not None  # a call in phase ASKING has its bridge
        self.requests.end(waiting, outcome, reason)
        bridge.waiting = None
        out: list[Command] = []
        session = waiting.key()
        live = session in self.clients
        for proxy_id in bridge.asks.values():
            if self.reverse.end(session, proxy_id) is not None and live:
                notice = {"jsonrpc": "2.0", "method": CANCELLED, "params": {"requestId": proxy_id, "reason": why}}
                out.append(ToClient(session, notice, waiting.client_id))
        bridge.asks.clear()
        return out

    def _input_failed(self, waiting: Pending, message: str, reason: str) -> list[Command]:
        """End a call that waits for input with an error of the proxy's to its client."""
        out = self.closed(waiting, message, "error", reason)
        if waiting.session not in self.clients:
            return out
        link = self.links.get(waiting.server)
        server = (link.server if link is not None else "") or waiting.server
        return [*out, ToClient(waiting.session, proxy_error(waiting.client_id, message, reason=reason, server=server))]

    def timed_out(self, waiting: Pending) -> list[Command]:
        link = self.links.get(waiting.server)
        hard = waiting.deadline >= waiting.hard_deadline
        limit = (link.max_request_timeout if hard else link.request_timeout) if link is not None else 0.0
        server = (link.server if link is not None else "") or waiting.server
        log.warning("server %s: %s timed out waiting for its client's input", waiting.server, waiting.method)
        return self._input_failed(
            waiting, f"Server {server!r} did not get the input {waiting.method} needs within {limit:g}s", "timeout"
        )

    def lost(self, link: UpstreamLink, message: str, reason: str) -> list[Command]:
        """``link`` is lost: the calls of its that wait for input fail as its pending ones."""
        out: list[Command] = []
        for client in list(self.clients.values()):
            for pending in [p for p in client.in_flight.values() if p.server == link.name and awaits_input(p)]:
                out += self._input_failed(pending, message, reason)
        return out

    def abandoned(self) -> list[Command]:
        """Shutting down: the calls that wait for input are answered, as pending ones are."""
        out: list[Command] = []
        for client in list(self.clients.values()):
            for pending in [p for p in client.in_flight.values() if awaits_input(p)]:
                server = self.links[pending.server].server or pending.server
                out += self._input_failed(
                    pending, f"Server {server!r} did not answer before the aggregator stopped", "unavailable"
                )
        return out

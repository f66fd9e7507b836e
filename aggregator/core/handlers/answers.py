"""An upstream's answer to a forwarded request, on its way to its caller. Sans-IO.

The answer goes to the client that asked, under the client's own id (invariant 1), once:
the request is ended in every table first (invariant 2), counted as the server answered
or as its error. On its way, what the proxy owns in it is rewritten (URIs to their
exposed form, task ids, a tool result cut to the caller's budget), a modern caller's is
stamped, a failed subscribe is undone, and a -32042 names the URL elicitations whose
completion notices belong to that client. An answer whose caller is gone is dropped;
one for a parked call is kept for the caller's retry (``core.era.parked``).

``Answers`` keeps no table of its own: it is given the request table, the clients, the
task owners of both eras, the result budgets, the subscriptions, the reverse table,
modern callers (what stamps an answer) and the clock. This is the hot path of every
call's answer: one attribute hop from the server messages to here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aggregator.core.catalogs.result_budget import ResultBudgets
from aggregator.core.catalogs.uris import expose_uri, rewrite_content_uris
from aggregator.core.commands import Command, DropUpstream, ShareKept, ToClient
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.modern_results import IDENTITY, unknown_result_type
from aggregator.core.lifecycle.upstream_era import MODERN_ERA
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Pending, UpstreamLink
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tasks import TaskOwners, expose_task_ids
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.jsonrpc.kinds import RESPONSE
from aggregator.mcp.modern import (
    CACHEABLE,
    COMPLETE,
    RESULT_TYPE,
    SERVER_INFO,
    TASK,
    TASK_REQUESTS,
    UNSUPPORTED_PROTOCOL_VERSION,
)

# The error a server answers when a URL-mode elicitation must be completed first (its
# data.elicitations name them; their completion notifications go to that client).
URL_ELICITATION_REQUIRED = -32042


class Answers:
    """An upstream's answer to a forwarded request, to its caller."""

    def __init__(
        self,
        requests: RequestTable,
        clients: dict[int, ClientState],
        tasks: dict[str, int],
        task_owners: TaskOwners,
        budgets: ResultBudgets,
        subscriptions: Subscriptions,
        reverse: ReverseTable,
        modern: ModernCallers,
        max_in_flight: int,
        clock: Callable[[], float],
    ) -> None:
        self.requests = requests
        self.tallies = requests.tallies  # counted as the server answered, once
        self.clients = clients
        self.tasks = tasks  # exposed 2025-11-25 task id -> owning session
        self.task_owners = task_owners  # exposed modern task id -> owning principal
        self.budgets = budgets  # tool results cut to the caller's budget
        self.subscriptions = subscriptions  # a failed subscribe is undone
        self.reverse = reverse  # the URL elicitations an error names
        self.modern = modern  # stamps a modern caller's answer
        self.max_in_flight = max_in_flight  # URL elicitations remembered per answer
        self.clock = clock

    def answered(self, link: UpstreamLink, pending: Pending, kind: int, message: dict[str, Any]) -> list[Command]:
        """An upstream's answer to a forwarded request: to its client, under its own id."""
        if kind == RESPONSE:  # counted as the server answered (``core.requests.request_table``, its tallies), once
            if not pending.done:
                self.tallies.answered(pending.method, link.server or pending.server, self.clock() - pending.sent_at)
            self.requests.end(pending)
        else:
            self.requests.end(pending, "error", "server_error", self.clock() - pending.sent_at)
        client = self.clients.get(session) if (session := pending.session) is not None else None
        if client is None:
            if pending.parked is not None:  # the answer waits for its caller's retry (``core.era.parked``)
                pending.parked.final = message
            return []
        message["id"] = pending.client_id
        if kind == RESPONSE:
            result = message.get("result")
            if link.speaks is MODERN_ERA and unknown_result_type(result, pending.method, pending.meta):
                return self.requests.fail(
                    pending,
                    f"Server {link.server!r} answered {pending.method} with a result of unknown resultType",
                    "malformed",
                )
            shared = self._expose_result(pending, result, link)
            if client.era is MODERN_ERA:
                if (
                    type(result) is dict
                    and pending.method not in CACHEABLE
                    and RESULT_TYPE not in result
                    and "_meta" not in result
                ):  # a call's result: ``stamp_result`` without cache hints, inline
                    result[RESULT_TYPE] = COMPLETE
                    result["_meta"] = {SERVER_INFO: IDENTITY}
                else:
                    self.modern.answer(client, pending, message, link)
            # What it carried goes now: the deadline heap keeps a finished Pending until it tidies
            # up, and a call's params left there would be scanned by the collector again and again.
            pending.params = pending.bridge = pending.subscription = pending.meta = None
            if shared is not None:  # the cut rest: the answer leaves once the shared store has it
                shared.answer = ToClient(client.key, message)
                return [shared]
            return [ToClient(client.key, message)]
        if pending.subscription is not None:  # a failed subscribe
            self.subscriptions.remove(pending.subscription, client.key)
        code = message["error"].get("code")
        if code == URL_ELICITATION_REQUIRED:
            self._url_elicitations_required(link, client.key, message["error"].get("data"))
        if client.era is MODERN_ERA:
            self.modern.answer(client, pending, message, link)
        pending.params = pending.bridge = pending.subscription = pending.meta = None
        if link.speaks is MODERN_ERA and code == UNSUPPORTED_PROTOCOL_VERSION:
            link.learnt = None  # its revision changed under us: the next connection finds it again
            why = f"it no longer speaks protocol {link.protocol_version}; it is asked server/discover again"
            return [ToClient(client.key, message), DropUpstream(link.name, why)]
        return [ToClient(client.key, message)]

    def _expose_result(self, pending: Pending, result: Any, link: UpstreamLink) -> ShareKept | None:
        """Rewrite what the proxy owns in an upstream result, in place; a cut result's rest
        to write to the shared store, if any."""
        if type(result) is not dict:
            return None
        method = pending.method
        if link.uri_prefix:
            _expose_result_uris(method, result, link.uri_prefix)
        if link.speaks is MODERN_ERA:  # the tasks extension: a handle, or a task polled (its result inlined)
            if method == "tools/call" and result.get(RESULT_TYPE) == TASK:
                client = self.requests.client_of(pending)
                for task_id in expose_task_ids(link.name, result):
                    self.task_owners.add(task_id, client.principal if client is not None else None)
            elif method in TASK_REQUESTS:
                expose_task_ids(link.name, result)
                if link.uri_prefix and type(result.get("result")) is dict:
                    _expose_result_uris("tools/call", result["result"], link.uri_prefix)
        elif ("task" in result and method == "tools/call") or method.startswith("tasks/"):
            for task_id in expose_task_ids(link.name, result):
                self.tasks.setdefault(task_id, pending.key())
        if self.budgets.on and method == "tools/call":
            client = self.requests.client_of(pending)
            if client is not None:
                return self.budgets.cut(client, result)  # cut to the caller's budget (``core.catalogs.result_budget``)
        return None

    def _url_elicitations_required(self, link: UpstreamLink, session: int, data: Any) -> None:
        """A -32042 answer names URL elicitations the client must complete first: their
        ``notifications/elicitation/complete`` belong to that client."""
        elicitations = data.get("elicitations") if type(data) is dict else None
        if type(elicitations) is not list:
            return
        for elicitation in elicitations[: self.max_in_flight]:
            eid = elicitation.get("elicitationId") if type(elicitation) is dict else None
            if type(eid) is str:
                self.reverse.remember_elicitation(link.name, eid, session)


def _expose_result_uris(method: str, result: dict[str, Any], prefix: str) -> None:
    """Rewrite the URIs in an upstream result to their exposed form, in place."""
    if method == "tools/call" or method == "tasks/result":
        rewrite_content_uris(result.get("content"), prefix)
    elif method == "resources/read":
        contents = result.get("contents")
        if type(contents) is list:
            for item in contents:
                if type(item) is dict and "uri" in item:
                    item["uri"] = expose_uri(prefix, item["uri"])
    elif method == "prompts/get":
        messages = result.get("messages")
        if type(messages) is list:
            for prompt_message in messages:
                if type(prompt_message) is not dict:
                    continue
                content = prompt_message.get("content")
                rewrite_content_uris([content] if type(content) is dict else content, prefix)

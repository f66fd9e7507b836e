"""A modern server's ``input_required`` result for a modern caller: checked, and its state bound. Sans-IO.

Between two modern parties the result passes through (the caller retries, the proxy
forwards the retry), but not unexamined:

- It must be what the revision allows: ``inputRequests`` an object of server requests
  (``sampling/createMessage``, ``elicitation/create``, ``roots/list``, each with object
  params), ``requestState`` a string, at least one of them, and only for ``tools/call``,
  ``prompts/get`` or ``resources/read``. Anything else fails the call (``malformed``,
  -32603, the server named), as the legacy-caller bridge (``core.era.input_bridge``) does.
- The proxy's gates for server requests apply as to a legacy server's: a method not in
  ``proxy.server_requests`` fails it (``unroutable``), one the server-request policy
  denies too (``denied``); one for a capability the caller did not declare for this
  request fails it -32021 with ``data.requiredCapabilities`` (the spec forbids a server to
  ask it, and the caller could not answer).
- The server's ``requestState`` is wrapped in one of the proxy's (``core.era.request_state``),
  bound to the caller's principal, an expiry (``proxy.input_required_timeout``) and the
  request; the retry's is unwrapped (``forward_with_state``) byte for byte before it goes
  upstream. Behind the proxy every caller reaches the server as one principal, so only
  the proxy can keep one caller from completing another's call with its state.

A valid result costs a few dict lookups per input request; the common result without
``resultType`` never comes here.

``ModernInput`` is given the request table, forwarding, the request states and the
gates; it owns no table of its own (the state travels with the caller).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from aggregator.core.commands import Command, ToClient
from aggregator.core.era.request_state import RequestStates, request_digest
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Ask, Pending, UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.reverse.declared import declares, merge_required, required_of
from aggregator.core.settings import ServerRequestPolicy
from aggregator.mcp.constants import SERVER_REQUESTS
from aggregator.mcp.modern import (
    CLIENT_CAPABILITIES,
    INPUT_REQUESTS,
    INPUT_REQUIRED_METHODS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    REQUEST_STATE,
)

log = logging.getLogger(__name__)


class ModernInput:
    """A modern server's ``input_required`` result on its way to a modern caller."""

    def __init__(
        self,
        requests: RequestTable,
        forwarding: Forwarding,
        request_states: RequestStates,
        server_requests: Collection[str],
        server_request_policy: ServerRequestPolicy,
        clock: Callable[[], float],
    ) -> None:
        self.requests = requests
        self.forwarding = forwarding  # where a verified retry goes
        self.request_states = request_states  # wraps and unwraps the server's state
        self.server_requests = server_requests  # the server-to-client requests the proxy routes
        self.server_request_policy = server_request_policy
        self.clock = clock

    def pass_input(self, link: UpstreamLink, pending: Pending, result: dict[str, Any]) -> list[Command] | None:
        """Check an ``input_required`` result for modern caller ``pending.session`` and wrap
        its state in place; None when it may go on, else what fails the call."""
        client = self.requests.client_of(pending)
        if client is None:
            return None  # nobody to answer: dropped as any late answer
        server = link.server or link.name
        requests = result.get(INPUT_REQUESTS)
        state = result.get(REQUEST_STATE)
        if (
            pending.method not in INPUT_REQUIRED_METHODS
            or (requests is not None and type(requests) is not dict)
            or (state is not None and type(state) is not str)
            or (not requests and state is None)
        ):
            return self._input_malformed(link, pending, "an invalid input_required result")
        required: dict[str, Any] = {}
        if requests:
            capabilities = (pending.meta or {}).get(CLIENT_CAPABILITIES)
            if type(capabilities) is not dict:
                capabilities = {}
            for key, entry in requests.items():
                method = entry.get("method") if type(entry) is dict else None
                params = entry.get("params", {}) if type(entry) is dict else None
                if type(method) is not str or type(params) is not dict or method not in SERVER_REQUESTS:
                    return self._input_malformed(
                        link, pending, f"input_required asking {key!r} with an invalid request"
                    )
                capability = SERVER_REQUESTS[method]
                if capability not in self.server_requests:
                    why = f"Server {server!r} needs {method}, which the aggregator does not route to clients"
                    return self.requests.fail(pending, why, "unroutable")
                if not self.server_request_policy(link.server, method, params):
                    return self.requests.fail(
                        pending, f"{method} from server {server!r} is not allowed by policy", "denied"
                    )
                if not declares(capabilities, capability, params):
                    merge_required(required, required_of(Ask(key, method, params)))
        if required:
            return self._input_undeclared(link, pending, client, required)
        if state is not None:
            digest = request_digest(pending.method, pending.params if pending.params is not None else {}, link.server)
            expires = self.clock() + self.request_states.ttl
            try:
                result[REQUEST_STATE] = self.request_states.wrap(state, client.principal, expires, digest)
            except ValueError as exc:
                return self._input_malformed(link, pending, f"input_required, but {exc}")
        return None

    def _input_malformed(self, link: UpstreamLink, pending: Pending, what: str) -> list[Command]:
        server = link.server or link.name
        log.warning("server %s: answered %s with %s", link.name, pending.method, what)
        return self.requests.fail(pending, f"Server {server!r} answered {pending.method} with {what}", "malformed")

    def _input_undeclared(
        self, link: UpstreamLink, pending: Pending, client: ClientState, required: dict[str, Any]
    ) -> list[Command]:
        """The server asked what the caller did not declare for this request: -32021."""
        names = ", ".join(sorted(required))
        server = link.server or link.name
        log.info("server %s: %s asked for undeclared client capability %s; refused", link.name, pending.method, names)
        self.requests.end(pending, "error", "unsupported")
        why = (
            f"Server {server!r} needs the client capability {names} to answer {pending.method},"
            " and this request did not declare it"
        )
        error = proxy_error(
            pending.client_id, why, reason="unsupported", server=server, code=MISSING_REQUIRED_CLIENT_CAPABILITY
        )
        error["error"]["data"]["requiredCapabilities"] = required
        return [ToClient(client.key, error)]

    def forward_with_state(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> list[Command]:
        """A retry carrying a wrapped upstream state: verified and unwrapped, then forwarded."""
        digest = request_digest(message["method"], params, server)
        params[REQUEST_STATE] = self.request_states.unwrap(
            params[REQUEST_STATE], client.principal, self.clock(), digest
        )
        return self.forwarding.forward(client, message, server, params)

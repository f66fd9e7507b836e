"""The router's state: its tables, and the objects that own the rest, wired once. Sans-IO.

``RouterState`` holds the tables the remaining handler groups share (links, clients,
catalogs, outages, subscriptions, ...) and builds the objects that own a part of the state
and its rules, each given what it reads (``_own_objects`` and the steps it calls). The
handler groups still combined with the router are its subclasses; what they offer each
other is declared here for the type checker (four methods, where the call edges between
them remain). The records and replies the groups use are re-exported from their owners.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.discovery import Search
from aggregator.core.catalogs.result_budget import ResultBudgets
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.catalogs.targets import ServerDown as ServerDown  # re-exported: where the groups look
from aggregator.core.catalogs.targets import Targets
from aggregator.core.clients.client_requests import ClientRequests
from aggregator.core.clients.clients import ClientState as ClientState  # re-exported: where the groups look
from aggregator.core.clients.clients import SessionInfo as SessionInfo
from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import Command
from aggregator.core.era.input_bridge import InputBridge
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.modern_input import ModernInput
from aggregator.core.era.parked import ParkedCalls, ParkedTable
from aggregator.core.era.request_state import RequestStates
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Listens, Subscriptions
from aggregator.core.replies import answer as answer  # re-exported: where the groups look
from aggregator.core.replies import cancelled as cancelled
from aggregator.core.replies import proxy_error as proxy_error
from aggregator.core.replies import refusal_reason as refusal_reason
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.inflight import InFlight
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tallies import Tallies
from aggregator.core.requests.tasks import TaskOwners
from aggregator.core.reverse.reverse_requests import ReverseRequests
from aggregator.core.reverse.reverse_table import Reverse as Reverse  # re-exported: where the groups look
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.core.reverse.roots import ROOTS_HOLD_SECONDS as ROOTS_HOLD_SECONDS  # re-exported
from aggregator.core.reverse.roots import Roots
from aggregator.core.settings import LinkSettings, RouterSettings
from aggregator.core.settings import ServerRequestPolicy as ServerRequestPolicy  # re-exported
from aggregator.core.upstreams.answers import Answers
from aggregator.core.upstreams.held_requests import HeldRequests
from aggregator.core.upstreams.links import Pending as Pending  # re-exported: where the groups look for them
from aggregator.core.upstreams.links import UpstreamLink as UpstreamLink
from aggregator.core.upstreams.outages import Outage
from aggregator.core.upstreams.upstream_control import Gather as Gather  # re-exported: where the groups look
from aggregator.core.upstreams.upstream_control import OwnWaiter as OwnWaiter
from aggregator.core.upstreams.upstream_control import UpstreamControl

# A server notification's handler: (its link, the message, its params, the upstream id of
# the request on whose stream it came, if known) -> commands.
NotificationHandler = Callable[[UpstreamLink, dict[str, Any], dict[str, Any], int | None], list[Command]]


def _link(catalog: Catalog, server: LinkSettings) -> UpstreamLink:
    naming = catalog.naming[server.name]
    return UpstreamLink(
        server.name,
        naming.prefix,
        naming.uri_prefix,
        request_timeout=server.request_timeout,
        max_request_timeout=server.max_request_timeout,
        timeout_resets_on_progress=server.timeout_resets_on_progress,
        server=server.name,
        protocol=server.protocol,
        discover_timeout=server.discover_timeout,
    )


class RouterState:
    """Every field of the router. Only the router's own groups write them."""

    _notifications: dict[str, NotificationHandler]  # server notification method -> its handler
    tasks: dict[str, int]  # exposed 2025-11-25 task id -> owning session
    task_owners: TaskOwners  # exposed modern (tasks extension) task id -> owning principal

    def __init__(
        self,
        catalog: Catalog,
        settings: RouterSettings,
        *,
        clock: Callable[[], float],
        profiles: dict[str, Catalog] | None = None,
        instance: str | None = None,
        server_request_policy: ServerRequestPolicy | None = None,
    ) -> None:
        servers = settings.servers
        self.catalog = catalog  # and one per profile (what its clients see), over one store of items:
        self.catalogs: dict[str, Catalog] = {"default": catalog, **(profiles or {})}
        self.clock = clock
        self.instance = instance if instance is not None else secrets.token_hex(8)
        self.links: dict[str, UpstreamLink] = {s.name: _link(catalog, s) for s in servers}
        self.per_session = {s.name for s in servers if s.isolation == "per-session"}
        # Shared servers not listed (yet, or again): their state and what was seen of them.
        self.outages: dict[str, Outage] = {s.name: Outage(s.name) for s in servers}
        self.start_takes: dict[str, float] = {}  # server -> how long its last start took
        self.clients: dict[int, ClientState] = {}
        self.max_in_flight = settings.max_in_flight
        self.max_json_depth = settings.max_json_depth  # enforced where messages are decoded
        self.server_requests = settings.server_requests
        self.server_request_policy: ServerRequestPolicy = (
            server_request_policy if server_request_policy is not None else lambda server, method, params: True
        )
        self.subscriptions = Subscriptions()  # keyed by link: (server or server@session, URI)
        self.listens = Listens()  # modern callers' open subscriptions/listen requests
        self.views = SessionViews()  # of the sessions whose own per-session connections listed
        self.tasks, self.task_owners = {}, TaskOwners()  # whose each task is (``core.requests.tasks``)
        self.request_states = RequestStates(settings.input_required_timeout)  # what resumes one
        self._own_objects(settings)

    def _own_objects(self, settings: RouterSettings) -> None:
        """The objects that own a part of the state and its rules, each given the tables
        it reads (wired once, here)."""
        clock = self.clock
        self.targets = Targets(self.catalogs, self.links, self.outages, self.per_session)  # what requests name
        self.tallies = Tallies()  # what ended how (``core.requests.tallies``)
        # Every client request in flight, its progress token and deadlines.
        self.requests = RequestTable(clock, self.links, self.clients, self.tallies, self.subscriptions)
        self.reverse = ReverseTable(settings.max_in_flight)  # server-to-client requests in flight
        # A request on its way upstream, or held for its per-session connection to start.
        self.forwarding = Forwarding(
            self.links, self.per_session, self.requests, self.server_requests, settings.max_in_flight
        )
        # Requests for a shared server that is out: held for it, or answered with its state.
        self.held_requests = HeldRequests(
            self.links,
            self.clients,
            self.requests,
            self.outages,
            self.start_takes,
            self.forwarding,
            settings.max_in_flight,
            clock,
        )
        # list_changed notices due, and when.
        self.announcements = Announcements(
            clock, settings.list_changed_debounce, self.clients, self.views, self.listens
        )
        discovery = dict(settings.discovery)  # profile -> its discovery settings
        self.budgets = ResultBudgets(clock, discovery)  # tool results cut, their rest kept
        self.search = Search(  # search mode, by the same settings
            discovery, self.clients, self.catalogs, self.links, self.announcements, self.budgets
        )
        self.handshake = Handshake(  # what the proxy says of itself
            self.links, self.catalog.separator, self.server_requests, self.instance, self.announcements
        )
        # The proxy's own requests to each upstream: its lifecycle's and the router's.
        self.control = UpstreamControl(
            self.links, self.clients, self.handshake, self.subscriptions, self.tasks, self.instance, clock
        )
        self._message_objects(settings)
        self._input_objects(settings)
        self._handling_objects()

    def _handling_objects(self) -> None:
        """The objects given most of the others: the handlers of client requests, and the
        timeouts over every table, wired last."""
        # The handlers of client requests, by method; whether startup is complete.
        self.client_requests = ClientRequests(
            links=self.links,
            per_session=self.per_session,
            targets=self.targets,
            forwarding=self.forwarding,
            handshake=self.handshake,
            search=self.search,
            budgets=self.budgets,
            modern=self.modern,
            modern_input=self.modern_input,
            parked=self.parked,
            answers=self.answers,
            control=self.control,
            subscriptions=self.subscriptions,
            tasks=self.tasks,
            task_owners=self.task_owners,
        )
        # Requests in flight given up on and timed out, and what else shares the one clock.
        self.inflight = InFlight(
            self.links,
            self.clients,
            self.requests,
            self.outages,
            self.control,
            self.parked,
            self.announcements,
            self.roots,
            self.input_bridge,
            self.modern,
            self.listens,
            self.clock,
        )

    def _message_objects(self, settings: RouterSettings) -> None:
        """The objects a caller's request and its answer go through by era, wired as
        ``_own_objects``'s are."""
        # What the proxy does for modern (2026-07-28) callers that it does not for legacy sessions.
        self.modern = ModernCallers(
            self.clients,
            self.links,
            self.catalogs,
            self.views,
            self.listens,
            self.subscriptions,
            self.targets,
            self.forwarding,
            self.control,
            self.handshake,
            self.announcements,
            self.instance,
            settings.max_in_flight,
        )
        # An upstream's answer to a forwarded request, on its way to its caller.
        self.answers = Answers(
            self.requests,
            self.clients,
            self.tasks,
            self.task_owners,
            self.budgets,
            self.subscriptions,
            self.reverse,
            self.modern,
            settings.max_in_flight,
            self.clock,
        )

    def _input_objects(self, settings: RouterSettings) -> None:
        """The objects that carry what a server asks of a client (server-to-client
        requests, input_required in either era), wired as ``_own_objects``'s are."""
        clock = self.clock
        # A modern server's input_required for a modern caller, and the caller's retry.
        self.modern_input = ModernInput(
            self.requests, self.forwarding, self.request_states, self.server_requests, self.server_request_policy, clock
        )
        self.roots = Roots(  # whose roots each server sees, and roots/list held for a client
            settings.roots, settings.single_client, self.server_requests, self.links, self.clients, clock
        )
        # Calls parked while their modern callers provide what a legacy server asks.
        self.parked = ParkedCalls(
            ParkedTable(settings.max_parked_calls, settings.max_parked_per_principal),
            self.clients,
            self.links,
            self.requests,
            self.reverse,
            self.request_states,
            settings.max_in_flight,
            clock,
        )
        # Server-to-client requests, routed to the one client they are for, or answered.
        self.reverse_requests = ReverseRequests(
            self.clients,
            self.requests,
            self.reverse,
            self.roots,
            self.parked,
            self.tasks,
            self.server_requests,
            self.server_request_policy,
            settings.max_in_flight,
        )
        # A modern server's input_required asked of a legacy caller, then the call retried.
        self.input_bridge = InputBridge(
            self.clients,
            self.links,
            self.requests,
            self.reverse,
            self.roots,
            self.server_requests,
            self.server_request_policy,
            settings.max_in_flight,
            clock,
        )

    if TYPE_CHECKING:  # what each group offers the others (defined in its own module)
        # client events
        def client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]: ...
        # upstream events
        def _own_answer(self, link: UpstreamLink, message: dict[str, Any]) -> list[Command]: ...
        def _relist(self, link: UpstreamLink, kinds: tuple[str, ...]) -> list[Command]: ...
        def server_lost(self, server: str, why: str) -> list[Command]: ...

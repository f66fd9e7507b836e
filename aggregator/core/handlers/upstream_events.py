"""What happens to an upstream: connected, ready, listed, overloaded, lost, down between starts. Sans-IO.

A connection's lifecycle (``core.lifecycle.upstream_lifecycle``, driven through
``upstream_control.UpstreamControl``) says what to do as outcomes; they are done here, in
their order (``_lifecycle``): sends, the upstream ready, its items, listed, failed.

``UpstreamEvents`` owns no table: it is given the links, the outages, the clients, the
catalogs and the per-session views, and the objects whose rules an upstream's life moves
(the proxy's own requests, forwarding, the timeouts, the requests held for a server that
is out, the server-to-client requests, roots, notices). It never calls back into the
router: a shared server listed releases the requests held for it as ``Resend`` outcomes,
in the returned list where their commands belong, and the router hands them to the client
events (``core.handlers.client_events``), which handle each as its client sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.outages import DORMANT, FAILED, IDLE_STOPPED, LAZY, RESTARTING, Outage, remember
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.commands import Answer, Command, DropUpstream, StopIdle, ToClient, ToServer, UpstreamServing
from aggregator.core.era.modern_results import IDENTITY
from aggregator.core.handlers.inflight import InFlight
from aggregator.core.lifecycle.upstream_era import MODERN_ERA, Era
from aggregator.core.lifecycle.upstream_outcomes import Failed, Items, Listing, Outcome, Ready, Send, Serving
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.replies import proxy_error
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.request_table import Tallies
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.core.reverse.roots import Roots
from aggregator.core.upstreams.held_requests import HeldRequests, Resend
from aggregator.core.upstreams.idle_stops import IdleStops
from aggregator.core.upstreams.own_listings import OwnListings, grant_listing, granted, is_grant_call
from aggregator.core.upstreams.upstream_control import UpstreamControl
from aggregator.jsonrpc.errors import INTERNAL_ERROR
from aggregator.mcp.constants import CANCELLED
from aggregator.mcp.modern import CLIENT_CAPABILITIES, INPUT_REQUESTS, INPUT_REQUIRED, RESULT_TYPE, SERVER_INFO

log = logging.getLogger(__name__)

# What an upstream event returns when a shared server may be listed by it: commands, and
# the requests held for that server to handle again (``Resend``), in their order.
Released: TypeAlias = Sequence[Command | Resend]


class UpstreamEvents:
    """An upstream's life as the trio layer reports it, and the requests held while it is out (invariant 7)."""

    def __init__(
        self,
        *,
        links: dict[str, UpstreamLink],
        outages: dict[str, Outage],
        start_takes: dict[str, float],
        clients: dict[int, ClientState],
        catalogs: dict[str, Catalog],
        views: SessionViews,
        subscriptions: Subscriptions,
        announcements: Announcements,
        control: UpstreamControl,
        forwarding: Forwarding,
        own_listings: OwnListings,
        inflight: InFlight,
        tallies: Tallies,
        held_requests: HeldRequests,
        idle: IdleStops,
        reverse: ReverseTable,
        roots: Roots,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.outages = outages  # shared servers not listed (yet, or again)
        self.start_takes = start_takes  # server -> how long its last start took
        self.clients = clients
        self.catalog = catalogs["default"]  # the store of every server's items
        self.catalogs = catalogs  # one per profile, over that store
        self.views = views  # of the sessions whose own per-session connections listed
        self.subscriptions = subscriptions
        self.announcements = announcements
        self.control = control  # the proxy's own requests to each upstream, and its lifecycles
        self.forwarding = forwarding
        self.own_listings = own_listings  # lists held for sessions' own connections to list
        self.inflight = inflight  # requests failed at once when their server is lost
        self.tallies = tallies  # what ended how
        self.held_requests = held_requests
        self.idle = idle  # shared servers stopped when nobody uses them
        self.reverse = reverse  # server-to-client requests, cancelled when their server is lost
        self.roots = roots
        self.clock = clock

    def upstream_connected(
        self,
        server: str,
        *,
        target: str,
        init_timeout: float,
        capabilities: dict[str, Any] | None = None,
        modern_possible: bool = True,
    ) -> Released:
        """A connection to ``server`` is up: its lifecycle starts the handshake
        (``core.upstreams.upstream_control``)."""
        link = self.links.get(server)
        if link is None:  # a per-session connection whose client just left
            return [DropUpstream(server, "its session ended")]
        outcomes = self.control.connect(
            link,
            target=target,
            init_timeout=init_timeout,
            capabilities=capabilities,
            modern_possible=modern_possible,
        )
        return self._lifecycle(link, outcomes)

    def expire_own(self, now: float) -> Released:
        """Time out the proxy's own requests upstream past their deadline; what their links'
        lifecycles say to do then, done."""
        if self.control.own_at is None or now < self.control.own_at:
            return []
        out: list[Command | Resend] = []
        for link, commands, outcomes in self.control.expire(now):
            out += commands
            if outcomes is not None:
                out += self._lifecycle(link, outcomes)
        return out

    def own_answer(self, link: UpstreamLink, message: dict[str, Any]) -> Released:
        """An answer to one of the proxy's own requests, settled; what the link's lifecycle
        says to do then, done."""
        out, outcomes = self.control.settle(link, message)
        if outcomes is None:
            return out
        return [*out, *self._lifecycle(link, outcomes)]

    def relist(self, link: UpstreamLink, kinds: tuple[str, ...]) -> Released:
        """The server said these lists changed: its lifecycle re-lists them (coalesced)."""
        lifecycle = link.lifecycle
        if lifecycle is None:  # between connections: the next one lists every kind anyway
            return []
        now = self.clock()
        out: list[Command | Resend] = []
        for kind in kinds:
            out += self._lifecycle(link, lifecycle.list_changed(kind, now))
        return out

    def _lifecycle(self, link: UpstreamLink, outcomes: list[Outcome]) -> list[Command | Resend]:
        """What the link's lifecycle said to do, done in order: sends, what the router makes
        of an upstream ready, listed or failed, commands for the trio layer."""
        self.control.note_own(link)
        name = link.name
        out: list[Command | Resend] = []
        for outcome in outcomes:
            if type(outcome) is Send:
                out.append(ToServer(name, outcome.message))
            elif type(outcome) is Items:
                out += self.server_items(name, outcome.kind, outcome.items)
            elif type(outcome) is Ready:
                out += self._upstream_ready(link, outcome.result)
            elif type(outcome) is Serving:
                out.append(UpstreamServing(name))
                out += self.control.listen_upstream(link)
                if link.session is None:  # listed: requests that waited for it go now
                    out += self.server_listed(name)
            elif type(outcome) is Listing:
                out += self.server_listing(name, outcome.listing)
            elif type(outcome) is Failed:
                self.control.learnt(link)
                link.refusal = outcome.refusal
                out.append(DropUpstream(name, outcome.reason))
            elif type(outcome) is Answer:
                out.append(outcome)
        return out

    def _upstream_ready(self, link: UpstreamLink, result: dict[str, Any]) -> list[Command]:
        assert link.lifecycle is not None
        link.speaks = link.lifecycle.speaks  # before server_ready: nothing legacy is sent to a modern link
        self.control.learnt(link)
        out = self.server_ready(link.name, result)
        info = result.get("serverInfo") or {}
        link.lifecycle.log.info(
            "server %s: initialized (%s %s, protocol %s%s)",
            link.name,
            info.get("name"),
            info.get("version"),
            result["protocolVersion"],
            "; modern: found by server/discover, spoken to statelessly" if link.speaks is MODERN_ERA else "",
        )
        return out

    def server_ready(self, server: str, init_result: dict[str, Any]) -> list[Command]:
        """The upstream finished its handshake; renew what clients asked of it before."""
        link = self.links[server]
        link.ready = True
        capabilities = init_result.get("capabilities")
        link.capabilities = capabilities if type(capabilities) is dict else {}
        instructions = init_result.get("instructions")
        link.instructions = instructions if type(instructions) is str and instructions.strip() else None
        link.protocol_version = init_result.get("protocolVersion")
        link.log_level = None
        link.roots_told = False
        outage = self.outages.get(server)
        if outage is not None:  # out until listed; its names are known from now on
            outage.ever_ready = True
        out = self.control.apply_log_level()
        waiting, link.waiting = link.waiting, []
        held = {params["uri"] for _, message, params in waiting if message["method"] == "resources/subscribe"}
        for uri in () if link.speaks is MODERN_ERA else self.subscriptions.of_server(server):
            if uri not in held:  # renewed; a held one goes as the client sent it
                out += self.control.own_request(server, "resources/subscribe", {"uri": uri})
        for key, message, params in waiting:
            client = self.clients.get(key)
            if self.forwarding.still_waiting(client, message):
                assert client is not None
                if client.granting and is_grant_call(client, link.server, message, params):
                    out.append(ToClient(key, granted(message["id"], link.server)))  # the grant was given
                    continue
                sent = self.forwarding.forward(client, message, link.server, params)
                out += self.forwarding.sent_held(key, message["id"], sent)
                if message["method"] == "resources/subscribe":
                    self._held_subscribe_sent(client, message, (server, params["uri"]))
            elif client is not None and message["method"] == "resources/subscribe":
                self.subscriptions.remove((server, params["uri"]), key)  # cancelled: never made
        return out

    def _held_subscribe_sent(self, client: ClientState, message: dict[str, Any], key: tuple[str, str]) -> None:
        pending = client.in_flight.get(message["id"])
        if pending is not None:
            pending.subscription = key  # a failure answered undoes it
        else:
            self.subscriptions.remove(key, client.key)  # refused (overloaded)

    def server_items(self, server: str, kind: str, items: list[dict[str, Any]]) -> list[Command]:
        """A fresh listing of one kind from a server; announce a change to clients."""
        link = self.links.get(server)
        if link is None or not link.ready:
            return []
        if link.session is not None:  # a session's own connection: its view, announced to it
            return self.announcements.announce(
                self.views.own_items(link.session, link.server, kind, items), link.session
            )
        out: list[Command] = []
        for profile, catalog in self.catalogs.items():
            changed = catalog.set_items(server, kind, items)
            if changed:
                out += self.announcements.announce([kind], profile)
            if self.views:
                out += self._views_see(catalog, server, kind, changed)
        return out

    def server_listing(self, server: str, listing: dict[str, list[dict[str, Any]]]) -> Released:
        """Every kind a server lists, at once. For a session's own connection to a
        per-session server this is the moment its session switches from the shared listing
        to its own: announced to that session for what it changed; the lists it held
        (``core.upstreams.own_listings``) are handled again."""
        link = self.links.get(server)
        if link is None or not link.ready:
            return []
        if link.session is None:
            return [command for kind, items in listing.items() for command in self.server_items(server, kind, items)]
        client = self.clients.get(link.session)
        if client is None:
            return []
        client.unlisted.discard(link.server)
        client.granting.discard(link.server)
        out: list[Command | Resend] = [*self._own_listing(client, link.server, listing)]
        if self.own_listings.held:
            out += self.own_listings.release(server)
        return out

    def _own_listing(self, client: ClientState, server: str, listing: dict[str, Any]) -> list[Command]:
        """What ``client``'s session sees of per-session ``server`` is ``listing`` now."""
        client.catalog, changed, made = self.views.listed(client.key, self.catalogs[client.profile], server, listing)
        if made:  # what its profile has due goes to it now by its own key
            self.announcements.inherit(client.profile, client.key)
        return self.announcements.announce(changed, client.key)

    def _views_see(self, catalog: Catalog, server: str, kind: str, changed: bool) -> list[Command]:
        """Announce to each session whose view over ``catalog`` changed with its listing of ``server``."""
        return [
            command
            for session, kinds in self.views.shared_changed(catalog, server, kind, changed)
            for command in self.announcements.announce(kinds, session)
        ]

    def _own_link_lost(self, link: UpstreamLink, refusal: dict[str, Any] | None) -> list[Command]:
        """A session's own connection is gone: its held subscriptions were never made, and
        the session sees the server's shared listing again (announced if that differs).
        For a server acting as each user, one that never listed is not waited for again by
        the session's lists, and one whose user must grant access first leaves the session
        its grant tool (``core.upstreams.own_listings``, rules 2 and 3)."""
        for key, message, params in link.waiting:
            if message["method"] == "resources/subscribe":
                self.subscriptions.remove((link.name, params["uri"]), key)
        assert link.session is not None
        client = self.clients.get(link.session)
        server = link.server
        listed = client is not None and getattr(client.catalog, "owns", lambda _: False)(server)
        changed, gone = self.views.lost(link.session, server)
        if gone and client is not None:
            client.catalog = self.catalogs[client.profile]
        out = self.announcements.announce(changed, link.session)
        if client is None or server not in self.own_listings.per_user:
            return out
        if not listed:
            client.unlisted.add(server)
        if refusal is not None and link.grants:  # its user must grant access first: the grant tool in its place
            client.granting.add(server)
            return out + self._own_listing(client, server, grant_listing(server))
        return out

    def server_overloaded(self, server: str, why: str) -> list[Command]:
        """The upstream reads nothing of its input: fail its requests in flight at once
        (reason overloaded). It stays connected; its late answers are dropped."""
        link = self.links.get(server)
        if link is None:
            return []
        return self.inflight.fail_pending(
            link, f"Server {link.server!r} is overloaded: {why}; the request failed", "overloaded"
        )

    def _probe_lost(self, link: UpstreamLink, why: str) -> None:
        """The connection ended (``why``: the server exited, closed its output...) while its
        ``server/discover`` was unanswered: a legacy server may exit on a method it does not
        know, so the next start sends ``initialize``. What happened is the supervisor's to
        report (once, as a server that did not start); this only notes the change of plan."""
        lifecycle = link.lifecycle
        if lifecycle is not None and lifecycle.probing and lifecycle.protocol == "auto":
            link.learnt = Era.LEGACY
            lifecycle.log.info(
                "server %s: %s before answering server/discover; its next start sends initialize instead",
                link.name,
                why,
            )

    def server_cached(self, server: str, listing: dict[str, list[dict[str, Any]]]) -> list[Command]:
        """A shared server is not started (``start = "lazy"``): its cached listing is its
        catalog until it is started, and the first request for it wakes it (``outages``
        rule 6); requests held for it already (a reload changed it while it started for
        them) wake it at once. Nothing changes for a server that is running or per-session."""
        link = self.links.get(server)
        outage = self.outages.get(server)
        if link is None or link.session is not None or link.ready or outage is None:
            return []
        # (Not ``ever_ready``: a name with its prefix that the cache lacks wakes it too,
        # and is looked up again once it is listed: ``outages`` rule 4.)
        outage.state = LAZY
        outage.memory.clear()  # (after a reload: what its old configuration listed is no guide)
        out: list[Command] = []
        for kind, items in listing.items():
            for profile, catalog in self.catalogs.items():
                changed = catalog.set_items(server, kind, items)
                out += self.announcements.announce([kind] if changed else [], profile)
                if self.views:
                    out += self._views_see(catalog, server, kind, changed)
        return out + self.held_requests.wake_for_held(server)

    def stop_idle(self, now: float) -> list[Command]:
        """Stop the shared servers nobody used for their ``idle_stop_after``
        (``core.upstreams.idle_stops``): each lets go of its connection at once, as if lost,
        but keeps its items in the catalogs; the trio layer stops it (``StopIdle``)."""
        out: list[Command] = []
        for server in self.idle.due(now):
            self.outages[server] = Outage(server, state=IDLE_STOPPED, ever_ready=True)
            out += self.server_lost(server, "stopped: nobody used it for its idle_stop_after", keep_items=True)
            out.append(StopIdle(server))
        return out

    def server_lost(
        self, server: str, why: str, *, keep_items: bool = False, reconfigured: bool = False
    ) -> list[Command]:
        """The upstream is gone: fail its requests at once, hide its items, tell clients.
        ``keep_items``: it was stopped on purpose, idle; its items stay. A start on demand
        that failed keeps them too, and the server is dormant again (``outages`` rule 7).
        ``reconfigured``: it goes because the configuration changed: its items go whatever
        its state (a dormant server's cached listing is another configuration's)."""
        link = self.links.get(server)
        if link is None:
            return []
        outage = self.outages.get(server)
        dormant = outage is not None and outage.state in DORMANT
        if not keep_items and not reconfigured and dormant and link.lifecycle is None:
            return []  # stopped on purpose, let go of already: the end of that connection changes nothing
        woken = outage.woken if outage is not None and link.session is None and not reconfigured else None
        if woken is not None:  # its start on demand failed: dormant again, its catalog kept
            keep_items = True
        link.ready = False
        link.overloaded = None
        self._probe_lost(link, why)
        refusal, link.refusal = link.refusal, None
        out: list[Command] = self._own_link_lost(link, refusal) if link.session is not None else []
        waiting, link.waiting = link.waiting, []
        for key, message, params in waiting:
            if not self.forwarding.still_waiting(self.clients.get(key), message):
                continue
            if refusal is not None:  # what its user must do first (a grant to give)
                client = self.clients.get(key)
                modern = client is not None and client.era is MODERN_ERA
                answer = consent_answer(message["id"], refusal, modern, params)
                self.tallies.ended(message["method"], link.server, "error", "unauthorized", None)
                out.append(ToClient(key, answer))
            else:
                self.tallies.ended(message["method"], link.server, "error", "unavailable", None)
                out.append(
                    ToClient(
                        key,
                        proxy_error(
                            message["id"],
                            f"Server {link.server!r} could not be started: {why}",
                            reason="unavailable",
                            server=link.server,
                        ),
                    )
                )
        out += self.inflight.fail_pending(
            link, f"Server {link.server!r} stopped before answering: {why}", "unavailable"
        )
        link.lifecycle = None  # its own requests failed with the others; its lifecycle's are stale
        out += self.control.release_acks(link)  # (their subscriptions are kept: the next listen has them)
        link.own.clear()
        self.control.reset_own_at()
        for (session, proxy_id), reverse in list(self.reverse.requests.items()):
            if reverse.server == server:
                self.reverse.end(session, proxy_id)
                out.append(
                    ToClient(
                        session,
                        {
                            "jsonrpc": "2.0",
                            "method": CANCELLED,
                            "params": {"requestId": proxy_id, "reason": f"server {server!r} stopped"},
                        },
                    )
                )
        for entry in [k for k in self.reverse.elicitations if k[0] == server]:
            self.reverse.forget_elicitation(entry)
        self.roots.forget(server)
        if outage is not None and woken is not None:
            outage.state, outage.woken, outage.reason, outage.retry_at = woken, None, why, None
        if link.session is None and not keep_items:
            out += self._server_out(server, why)
            kinds = self.catalog.forget(server)
            for profile, catalog in self.catalogs.items():
                for kind in kinds:
                    changed = catalog.rebuild(kind)
                    out += self.announcements.announce([kind] if changed else [], profile)
                    if self.views:
                        out += self._views_see(catalog, server, kind, changed)
        return out

    def _server_out(self, server: str, why: str) -> list[Command]:
        """A shared server is lost: remember what each profile saw of it, before it goes."""
        outage = self.outages.get(server)
        if outage is None:  # it was serving
            outage = self.outages[server] = Outage(server, state=RESTARTING, ever_ready=True)
        else:  # a start attempt failed (or the listing after it)
            outage.state = FAILED
        outage.reason = why
        outage.retry_at = None
        for profile, catalog in self.catalogs.items():
            seen = remember(catalog, server)
            if profile in outage.memory:
                outage.memory[profile].merge(seen)
            else:
                outage.memory[profile] = seen
        # Held requests are answered by ``server_down``, which follows at once with the time
        # of the next attempt; when shutting down, none follows.
        return self.held_requests.fail(server) if self.forwarding.draining else []

    def server_down(self, server: str, reason: str, retry_in: float) -> list[Command]:
        """The supervisor of a shared server that was lost (or did not start) starts it again
        in ``retry_in`` seconds. Requests that waited for the attempt that failed fail now."""
        outage = self.outages.get(server)
        if outage is None or server not in self.links:
            return []
        outage.retry_at = outage.attempt_at = self.clock() + max(0.0, retry_in)
        outage.reason = reason
        return self.held_requests.fail(server)

    def server_listed(self, server: str) -> list[Resend]:
        """A shared server is ready and listed: it is out no more. Held requests are
        released, to be looked up again (a name it no longer has is unknown now) and sent
        within their deadline."""
        outage = self.outages.pop(server, None)
        if outage is None:
            return []
        link = self.links.get(server)
        if link is not None:
            self.idle.listed(link)
        now = self.clock()
        if outage.attempt_at is not None:
            self.start_takes[server] = max(0.0, now - outage.attempt_at)
        return self.held_requests.release(server)


def consent_answer(id: Any, refusal: dict[str, Any], modern: bool, params: dict[str, Any]) -> dict[str, Any]:
    """What answers a call whose server has no credential of its user's yet: ``refusal``,
    the error its connection answered with (naming the URL to open, and as -32042 with
    ``data.elicitations`` for a legacy client that takes URL elicitations). A 2026-07-28
    caller that declared URL elicitation gets the input request form instead: an
    ``input_required`` result asking ``elicitation/create`` in URL mode, after which it
    sends the call again (-32042 is 2025-11-25 only); any other modern caller gets the
    error naming the URL."""
    data = refusal.get("data")
    if type(data) is not dict:
        data = {}
    url = data.get("url")
    if not modern or type(url) is not str:
        return {"jsonrpc": "2.0", "id": id, "error": refusal}
    meta = params.get("_meta")
    capabilities = meta.get(CLIENT_CAPABILITIES) if type(meta) is dict else None
    elicitation = capabilities.get("elicitation") if type(capabilities) is dict else None
    if type(elicitation) is not dict or type(elicitation.get("url")) is not dict:
        error = {key: value for key, value in refusal.items() if key != "code"}
        error["code"] = INTERNAL_ERROR
        error["data"] = {key: value for key, value in data.items() if key != "elicitations"}
        return {"jsonrpc": "2.0", "id": id, "error": error}
    server = data.get("server")
    ask = {"mode": "url", "message": f"Server {server!r} acts as you: grant it access to continue.", "url": url}
    result = {
        RESULT_TYPE: INPUT_REQUIRED,
        INPUT_REQUESTS: {"grant": {"method": "elicitation/create", "params": ask}},
        "_meta": {SERVER_INFO: IDENTITY},
    }
    return {"jsonrpc": "2.0", "id": id, "result": result}

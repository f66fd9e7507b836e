"""The proxy's own requests to each upstream, one way: the link's lifecycle and the router's. Sans-IO.

Each ``UpstreamLink`` has one ``OwnRequests`` table (string ids ``aggregator-N``, never
repeated while the link lives) and, while connected, its ``UpstreamLifecycle``
(handshake, listing, re-listing). The router's own requests go through the same table:
a ``tasks/list`` of a gather, a subscription renewed after a restart, a log level. An
answer with such an id is settled here and goes by its waiter: the router's
(``OwnWaiter``) to the gather, the lifecycle's to the lifecycle, whose outcomes become
calls of the router (``server_ready``, ``server_items``, ``server_listing``,
``server_listed``) and commands for the trio layer (``UpstreamServing``,
``DropUpstream``). A modern link has one ``subscriptions/listen`` of the router's open
while it serves (``_listen_upstream``): for the lists its server says change and the resources
clients subscribed to there; a changed set opens a new listen, then cancels the old one;
one that ends is opened again after a backoff. Their deadlines are the router's (``next_deadline``/``expire``), so
the hub's one clock keeps them; the trio layer only says ``upstream_connected`` and
``server_lost``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from aggregator.core.commands import Answer, Command, DropUpstream, ToServer, UpstreamServing
from aggregator.core.era import listen_acks
from aggregator.core.era.listen_acks import AckWait
from aggregator.core.era.upstream_era import LEGACY_ERA, MODERN_ERA, Era
from aggregator.core.requests.tasks import expose_task_ids
from aggregator.core.state import Gather, OwnWaiter, RouterState, UpstreamLink, answer, cancelled
from aggregator.core.upstreams.own_requests import Waiting
from aggregator.core.upstreams.upstream_lifecycle import UpstreamLifecycle
from aggregator.core.upstreams.upstream_outcomes import Failed, Items, Listing, Outcome, Ready, Send, Serving
from aggregator.jsonrpc.errors import METHOD_NOT_FOUND
from aggregator.mcp.constants import INITIALIZE
from aggregator.mcp.modern import LISTEN

log = logging.getLogger(__name__)

SET_LEVEL = "logging/setLevel"
# What the proxy asks a legacy server for itself that a modern one has no request for.
LEGACY_ONLY = frozenset(("resources/subscribe", "resources/unsubscribe", SET_LEVEL))
LISTEN_BACKOFF = (1.0, 60.0)  # first and longest wait before a listen that ended is opened again


class Listening(NamedTuple):
    """The waiter of a link's ``subscriptions/listen``: what it asked for; ``attempt``
    counts listens that ended early in a row (for the backoff)."""

    key: tuple[Any, ...]
    attempt: int = 0


class ListenAgain(NamedTuple):
    """A placeholder in the own table (never sent): open the listen again at its deadline."""

    attempt: int


class UpstreamControl(RouterState):
    """The own requests of each link: opened, answered, timed out, dropped with the link."""

    def upstream_connected(
        self,
        server: str,
        *,
        target: str,
        init_timeout: float,
        capabilities: dict[str, Any] | None = None,
        modern_possible: bool = True,
    ) -> list[Command]:
        """A connection to ``server`` is up: its lifecycle starts the handshake, declaring
        ``capabilities`` (a per-session connection's client's) or the proxy's own.
        ``modern_possible``: its transport has a modern binding (stdio, Streamable HTTP;
        not legacy SSE or WebSocket, which are spoken to with ``initialize`` at once)."""
        link = self.links.get(server)
        if link is None:  # a per-session connection whose client just left
            return [DropUpstream(server, "its session ended")]
        link.own.drop_if(UpstreamLifecycle.owns)  # an ended connection's, if any were left
        link.speaks = Era.LEGACY  # until this connection finds its era
        lifecycle = link.lifecycle = UpstreamLifecycle(
            server,
            instance=self.instance,
            target=target,
            init_timeout=init_timeout,
            request_timeout=link.request_timeout,
            per_session=link.session is not None,
            log=logging.getLogger(f"aggregator.server.{link.server}"),
            requests=link.own,
            protocol=link.protocol,
            discover_timeout=link.discover_timeout,
            era=link.learnt if modern_possible else Era.LEGACY,
        )
        if capabilities is None:
            capabilities = self.handshake.upstream_client_capabilities()
        return self._outcomes(link, lifecycle.connected(self.clock(), capabilities))

    def server_era(self, server: str) -> tuple[str, str] | None:
        """How the proxy speaks to ``server`` now: ("modern" or "legacy", the revision);
        None while it is not connected."""
        link = self.links.get(server)
        if link is None or not link.ready or link.protocol_version is None:
            return None
        return (link.speaks.value, link.protocol_version)

    def own_call(self, server: str, method: str, params: dict[str, Any] | None, caller: object) -> list[Command]:
        """A request of the trio layer's own to ``server``; its ``Answer`` names ``caller``
        (within the server's request timeout)."""
        link = self.links.get(server)
        if link is None or link.lifecycle is None:
            return [Answer(caller, None, f"{method}: the connection ended before an answer")]
        send = link.lifecycle.request(method, params, caller, self.clock(), link.request_timeout)
        self._note_own(link)
        return [ToServer(server, send.message)]

    def _wait_for_ack(self, link: UpstreamLink, listen: str) -> None:
        """Hold subscribe answers until the server acknowledges ``listen`` (``listen_acks``)."""
        listen_acks.wait(link, listen, self.clock())
        self._reset_own_at()  # the router's clock wakes for it

    def _release_acks(self, link: UpstreamLink) -> list[Command]:
        """Answer the subscribes held for a listen, and stop waiting (``listen_acks``)."""
        out = listen_acks.release(link, self.clients)
        self._reset_own_at()
        return out

    def _listen_acknowledged(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """The server acknowledged a listen: if it is the newest, the answers held for it go out."""
        return self._release_acks(link) if listen_acks.acknowledged(link, params) else []

    def _apply_log_level(self) -> list[Command]:
        """Set every upstream that logs to the most verbose level any client asked for."""
        out: list[Command] = []
        for name, level in self.handshake.log_levels(self.clients.values()):
            out += self._own_request(name, "logging/setLevel", {"level": level})
        return out

    def _own_request(
        self, server: str, method: str, params: dict[str, Any], gather: Gather | None = None
    ) -> list[Command]:
        """A request the proxy makes for its own bookkeeping; the answer is not forwarded."""
        link = self.links[server]
        if not link.ready:
            return []
        if link.speaks is MODERN_ERA and link.lifecycle is not None:
            if method in LEGACY_ONLY:  # a modern server's listen follows subscriptions; log levels go per request
                return self._listen_upstream(link) if method != SET_LEVEL else []
            params = dict(params, _meta=dict(params.get("_meta") or {}, **link.lifecycle.meta()))
        waiter = OwnWaiter(gather)
        message = link.own.open(method, params, waiter, self.clock() + link.request_timeout)
        waiter.id = message["id"]
        self._note_own(link)
        return [ToServer(server, message)]

    def _control_answer(self, link: UpstreamLink, message: dict[str, Any]) -> list[Command]:
        """An answer whose id is one of the proxy's own (an unknown or late one is dropped)."""
        waiting = link.own.settle(message["id"])
        if waiting is None:
            log.debug("server %s: dropping a response to unknown id %r", link.name, message["id"])
            return []
        self._reset_own_at()
        waiter = waiting.waiter
        if type(waiter) is Listening:
            return self._listen_ended(link, waiter, message)
        if type(waiter) is OwnWaiter:
            if "error" in message:
                error = message["error"]
                log.info("server %s: %s failed: %s", link.name, waiting.method, error.get("message"))
                return self._gather_step(link, waiter, None)
            return self._gather_step(link, waiter, message.get("result"))
        if link.lifecycle is None:
            return []
        out = self._outcomes(link, link.lifecycle.settled(waiting, message, self.clock()))
        if link.lifecycle.failed:
            self._reset_own_at()
        return out

    def _relist(self, link: UpstreamLink, kinds: tuple[str, ...]) -> list[Command]:
        """The server said these lists changed: its lifecycle re-lists them (coalesced)."""
        lifecycle = link.lifecycle
        if lifecycle is None:  # between connections: the next one lists every kind anyway
            return []
        now = self.clock()
        out: list[Command] = []
        for kind in kinds:
            out += self._outcomes(link, lifecycle.list_changed(kind, now))
        return out

    def _fail_own(self, link: UpstreamLink) -> list[Command]:
        """The router's own requests on ``link`` fail (its requests in flight failed)."""
        out: list[Command] = []
        for waiting in link.own.drop_if(_routers):
            out += self._gather_step(link, waiting.waiter, None)
        self._reset_own_at()
        return out

    def _expire_own(self, now: float) -> list[Command]:
        """Time out the own requests (the router's and the lifecycles') past their deadline."""
        out: list[Command] = []
        for link in list(self.links.values()):
            if not len(link.own):
                continue
            late = link.own.expire(now)
            theirs = [waiting for waiting in late if UpstreamLifecycle.owns(waiting.waiter)]
            for waiting in late:
                if type(waiting.waiter) is ListenAgain:
                    out += self._listen_upstream(link, waiting.waiter.attempt)
                    continue
                if type(waiting.waiter) is AckWait:
                    out += self._release_acks(link)
                    continue
                out += self._give_up(link, waiting, "timed out")
                if type(waiting.waiter) is OwnWaiter:
                    log.warning("server %s: %s timed out (upstream id %s)", link.name, waiting.method, waiting.id)
                    out += self._gather_step(link, waiting.waiter, None)
            if theirs and link.lifecycle is not None:
                out += self._outcomes(link, link.lifecycle.expired(theirs, now))
        self._reset_own_at()
        return out

    def _give_up(self, link: UpstreamLink, waiting: Waiting[Any], why: str) -> list[Command]:
        """The one rule for an own request the proxy stops waiting for (timed out, or
        nobody wants its answer): the server is told, so it can stop working on it. Not
        ``initialize`` (which must not be cancelled), nor on a connection not up."""
        if link.ready and link.lifecycle is not None and waiting.method != INITIALIZE:
            return [ToServer(link.name, cancelled(waiting.id, why))]
        return []

    def _drop_gathers(self, session: int, why: str, client_id: Any = None) -> list[Command]:
        """Nobody waits for the gathers of ``session`` (of its request ``client_id``, or all
        of them): their own requests are cancelled upstream now and never answered."""

        def gone(waiter: object) -> bool:
            gather = waiter.gather if type(waiter) is OwnWaiter else None
            return (
                gather is not None
                and gather.session == session
                and (client_id is None or (type(gather.client_id) is type(client_id) and gather.client_id == client_id))
            )

        out: list[Command] = []
        dropped = False
        for link in self.links.values():
            if len(link.own):
                for waiting in link.own.drop_if(gone):
                    dropped = True
                    out += self._give_up(link, waiting, why)
        if dropped:
            self._reset_own_at()
        return out

    def _note_own(self, link: UpstreamLink) -> None:
        """The link's own requests changed: the router's clock wakes for the earliest."""
        deadline = link.own.next_deadline()  # (a listen's is infinite: it never wakes the clock)
        if deadline is not None and deadline < math.inf and (self.own_at is None or deadline < self.own_at):
            self.own_at = deadline

    def _reset_own_at(self) -> None:
        """The earliest deadline of any link's own requests, exactly (not on the hot path:
        own requests are answered a few at a time)."""
        deadlines = [d for link in self.links.values() if len(link.own) and (d := link.own.next_deadline()) is not None]
        earliest = min(deadlines, default=None)
        self.own_at = earliest if earliest is not None and earliest < math.inf else None

    def _gather_step(self, link: UpstreamLink, waiter: OwnWaiter, result: Any) -> list[Command]:
        gather = waiter.gather
        if gather is None:
            return []
        if type(result) is dict:
            expose_task_ids(link.name, result)
            gather.items += [
                t
                for t in result.get("tasks") or []
                if type(t) is dict and self.tasks.get(t.get("taskId", "")) == gather.session
            ]
        gather.remaining -= 1
        if gather.remaining or gather.session not in self.clients:
            return []
        return [answer(gather.session, gather.client_id, {"tasks": gather.items})]

    def _outcomes(self, link: UpstreamLink, outcomes: list[Outcome]) -> list[Command]:
        """What the link's lifecycle said to do, done: sends, the router's own calls, commands."""
        self._note_own(link)
        name = link.name
        out: list[Command] = []
        for outcome in outcomes:
            if type(outcome) is Send:
                out.append(ToServer(name, outcome.message))
            elif type(outcome) is Items:
                out += self.server_items(name, outcome.kind, outcome.items)
            elif type(outcome) is Ready:
                out += self._upstream_ready(link, outcome.result)
            elif type(outcome) is Serving:
                out.append(UpstreamServing(name))
                out += self._listen_upstream(link)
                if link.session is None:  # listed: requests that waited for it go now
                    out += self.server_listed(name)
            elif type(outcome) is Listing:
                out += self.server_listing(name, outcome.listing)
            elif type(outcome) is Failed:
                self._learnt(link)
                out.append(DropUpstream(name, outcome.reason))
            elif type(outcome) is Answer:
                out.append(outcome)
        return out

    def _upstream_ready(self, link: UpstreamLink, result: dict[str, Any]) -> list[Command]:
        assert link.lifecycle is not None
        link.speaks = link.lifecycle.speaks  # before server_ready: nothing legacy is sent to a modern link
        self._learnt(link)
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

    # --- subscriptions/listen ----------------------------------------------------------

    def _listen_upstream(self, link: UpstreamLink, attempt: int = 0) -> list[Command]:
        """Keep one ``subscriptions/listen`` open on a modern link for what is wanted now:
        a new one when that changed (the old one cancelled after it), none when nothing is."""
        if link.speaks is LEGACY_ERA or not link.ready or link.lifecycle is None:
            return []
        wanted = self._listen_wanted(link)
        key = tuple(sorted((k, tuple(v) if type(v) is list else v) for k, v in wanted.items()))
        current = link.own.find(_listening)
        if current is not None and type(current.waiter) is Listening and current.waiter.key == key:
            return []
        out: list[Command] = []
        if wanted:
            params = {"notifications": wanted, "_meta": link.lifecycle.meta()}
            out.append(ToServer(link.name, link.own.open(LISTEN, params, Listening(key, attempt), math.inf)))
        if current is not None:
            link.own.settle(current.id)
            if type(current.waiter) is Listening:
                out.append(ToServer(link.name, cancelled(current.id, "replaced by a new listen")))
        self._reset_own_at()
        return out

    def _listen_wanted(self, link: UpstreamLink) -> dict[str, Any]:
        """The notifications a modern link's listen asks for: each list its server says
        changes, and the resources subscribed to there (if it takes subscriptions)."""
        capabilities = link.capabilities
        wanted: dict[str, Any] = {}
        for capability, field in (("tools", "toolsListChanged"), ("prompts", "promptsListChanged")):
            if (capabilities.get(capability) or {}).get("listChanged"):
                wanted[field] = True
        resources = capabilities.get("resources") or {}
        if resources.get("listChanged"):
            wanted["resourcesListChanged"] = True
        if resources.get("subscribe"):
            uris = sorted(self.subscriptions.of_server(link.name))
            if uris:
                wanted["resourceSubscriptions"] = uris
        return wanted

    def _listen_ended(self, link: UpstreamLink, waiter: Listening, message: dict[str, Any]) -> list[Command]:
        """The server answered a listen (it ended it): open it again after a backoff;
        not when the server has no ``subscriptions/listen``."""
        out = self._release_acks(link)
        error = message.get("error")
        code = error.get("code") if type(error) is dict else None
        if code == METHOD_NOT_FOUND:
            log.warning("server %s: it has no subscriptions/listen; its changes are not followed", link.name)
            return out
        first, longest = LISTEN_BACKOFF
        delay = min(longest, first * 2**waiter.attempt)
        log.info(
            "server %s: its subscriptions/listen ended (%s); opening it again in %.0fs",
            link.name,
            f"error {code}" if error is not None else "by the server",
            delay,
        )
        link.own.open(LISTEN, None, ListenAgain(waiter.attempt + 1), self.clock() + delay)
        self._note_own(link)
        return out

    def _learnt(self, link: UpstreamLink) -> None:
        """Keep what the link's connection learnt of its era for its next connection."""
        lifecycle = link.lifecycle
        if lifecycle is not None and lifecycle.learnt is not None:
            link.learnt = lifecycle.learnt
            base = self.links.get(link.server)
            if base is not None and base is not link:  # a per-session link teaches its server's
                base.learnt = lifecycle.learnt


def _routers(waiter: object) -> bool:
    return type(waiter) is OwnWaiter


def _listening(waiter: object) -> bool:
    return type(waiter) is Listening or type(waiter) is ListenAgain

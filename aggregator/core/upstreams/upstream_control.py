"""The proxy's own requests to each upstream, one way: the link's lifecycle and the router's. Sans-IO.

Each ``UpstreamLink`` has one ``OwnRequests`` table (string ids ``aggregator-N``, never
repeated while the link lives) and, while connected, its ``UpstreamLifecycle``
(handshake, listing, re-listing). The router's own requests go through the same table:
a ``tasks/list`` of a gather, a subscription renewed after a restart, a log level. An
answer with such an id is settled here and goes by its waiter: the router's
(``OwnWaiter``) to the gather, the lifecycle's to the lifecycle, whose outcomes are
handed back to the caller (``core.handlers.upstream_events`` acts on them: ready,
items, listed). A modern link has one ``subscriptions/listen`` of the router's open
while it serves (``_listen_upstream``): for the lists its server says change and the resources
clients subscribed to there; a changed set opens a new listen, then cancels the old one;
one that ends is opened again after a backoff. Their deadlines are the router's (``next_deadline``/``expire``), so
the hub's one clock keeps them; the trio layer only says ``upstream_connected`` and
``server_lost``.

``UpstreamControl`` owns the earliest deadline of the own requests (``own_at``); each
link's table is the link's. It is given the links, the clients, the handshake (what the
proxy declares and the log levels to set), the subscriptions (what a listen asks for),
whose each task is (what a gather keeps), the proxy's instance id and the clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple

from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import Answer, Command, ToServer
from aggregator.core.lifecycle.own_requests import Waiting
from aggregator.core.lifecycle.upstream_era import LEGACY_ERA, MODERN_ERA, Era
from aggregator.core.lifecycle.upstream_lifecycle import UpstreamLifecycle
from aggregator.core.lifecycle.upstream_outcomes import Outcome
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.replies import answer, cancelled
from aggregator.core.requests.tasks import expose_task_ids
from aggregator.core.upstreams import listen_acks
from aggregator.core.upstreams.listen_acks import AckWait
from aggregator.jsonrpc.errors import METHOD_NOT_FOUND
from aggregator.mcp.constants import INITIALIZE
from aggregator.mcp.modern import LISTEN

log = logging.getLogger(__name__)

SET_LEVEL = "logging/setLevel"
# What the proxy asks a legacy server for itself that a modern one has no request for.
LEGACY_ONLY = frozenset(("resources/subscribe", "resources/unsubscribe", SET_LEVEL))
LISTEN_BACKOFF = (1.0, 60.0)  # first and longest wait before a listen that ended is opened again


class Gather:
    """A client request answered from several upstreams (tasks/list)."""

    __slots__ = ("session", "client_id", "remaining", "items")

    def __init__(self, session: int, client_id: Any, remaining: int) -> None:
        self.session = session
        self.client_id = client_id
        self.remaining = remaining
        self.items: list[Any] = []


class OwnWaiter:
    """What waits for the answer to one of the router's own requests to an upstream (in
    the link's ``own`` table, beside its lifecycle's): a ``Gather``, or nothing."""

    __slots__ = ("gather", "id")

    def __init__(self, gather: Gather | None) -> None:
        self.gather = gather
        self.id = ""  # the request's id, once sent


# Per link, what expiring its own requests came to: the commands, then what its lifecycle
# said (None: its lifecycle had nothing expire), for the caller to act on in that order.
Expired = tuple[UpstreamLink, list[Command], list[Outcome] | None]


class Listening(NamedTuple):
    """The waiter of a link's ``subscriptions/listen``: what it asked for; ``attempt``
    counts listens that ended early in a row (for the backoff)."""

    key: tuple[Any, ...]
    attempt: int = 0


class ListenAgain(NamedTuple):
    """A placeholder in the own table (never sent): open the listen again at its deadline."""

    attempt: int


class UpstreamControl:
    """The own requests of each link: opened, answered, timed out, dropped with the link."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        handshake: Handshake,
        subscriptions: Subscriptions,
        tasks: dict[str, int],
        instance: str,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.clients = clients
        self.handshake = handshake  # what the proxy declares upstream, the log levels to set
        self.subscriptions = subscriptions  # what a modern link's listen asks for
        self.tasks = tasks  # exposed task id -> owning session (what a gather keeps)
        self.instance = instance
        self.clock = clock
        self.own_at: float | None = None  # the earliest deadline of the own requests upstream

    def connect(
        self,
        link: UpstreamLink,
        *,
        target: str,
        init_timeout: float,
        capabilities: dict[str, Any] | None = None,
        modern_possible: bool = True,
    ) -> list[Outcome]:
        """A connection of ``link`` is up: its lifecycle starts the handshake, declaring
        ``capabilities`` (a per-session connection's client's) or the proxy's own; what
        it says to do is the caller's to act on. ``modern_possible``: its transport has a
        modern binding (stdio, Streamable HTTP; not legacy SSE or WebSocket, which are
        spoken to with ``initialize`` at once)."""
        server = link.name
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
        return lifecycle.connected(self.clock(), capabilities)

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
        self.note_own(link)
        return [ToServer(server, send.message)]

    def wait_for_ack(self, link: UpstreamLink, listen: str) -> None:
        """Hold subscribe answers until the server acknowledges ``listen`` (``listen_acks``)."""
        listen_acks.wait(link, listen, self.clock())
        self.reset_own_at()  # the router's clock wakes for it

    def release_acks(self, link: UpstreamLink) -> list[Command]:
        """Answer the subscribes held for a listen, and stop waiting (``listen_acks``)."""
        out = listen_acks.release(link, self.clients)
        self.reset_own_at()
        return out

    def listen_acknowledged(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """The server acknowledged a listen: if it is the newest, the answers held for it go out."""
        return self.release_acks(link) if listen_acks.acknowledged(link, params) else []

    def apply_log_level(self) -> list[Command]:
        """Set every upstream that logs to the most verbose level any client asked for."""
        out: list[Command] = []
        for name, level in self.handshake.log_levels(self.clients.values()):
            out += self.own_request(name, "logging/setLevel", {"level": level})
        return out

    def own_request(
        self, server: str, method: str, params: dict[str, Any], gather: Gather | None = None
    ) -> list[Command]:
        """A request the proxy makes for its own bookkeeping; the answer is not forwarded."""
        link = self.links[server]
        if not link.ready:
            return []
        if link.speaks is MODERN_ERA and link.lifecycle is not None:
            if method in LEGACY_ONLY:  # a modern server's listen follows subscriptions; log levels go per request
                return self.listen_upstream(link) if method != SET_LEVEL else []
            params = dict(params, _meta=dict(params.get("_meta") or {}, **link.lifecycle.meta()))
        waiter = OwnWaiter(gather)
        message = link.own.open(method, params, waiter, self.clock() + link.request_timeout)
        waiter.id = message["id"]
        self.note_own(link)
        return [ToServer(server, message)]

    def settle(self, link: UpstreamLink, message: dict[str, Any]) -> tuple[list[Command], list[Outcome] | None]:
        """An answer whose id is one of the proxy's own (an unknown or late one is dropped):
        the commands it comes to, and what the link's lifecycle says to do when the answer
        was its own (else None), for the caller to act on."""
        waiting = link.own.settle(message["id"])
        if waiting is None:
            log.debug("server %s: dropping a response to unknown id %r", link.name, message["id"])
            return [], None
        self.reset_own_at()
        waiter = waiting.waiter
        if type(waiter) is Listening:
            return self._listen_ended(link, waiter, message), None
        if type(waiter) is OwnWaiter:
            if "error" in message:
                error = message["error"]
                log.info("server %s: %s failed: %s", link.name, waiting.method, error.get("message"))
                return self.gather_step(link, waiter, None), None
            return self.gather_step(link, waiter, message.get("result")), None
        if link.lifecycle is None:
            return [], None
        outcomes = link.lifecycle.settled(waiting, message, self.clock())
        if link.lifecycle.failed:
            self.reset_own_at()
        return [], outcomes

    def fail_own(self, link: UpstreamLink) -> list[Command]:
        """The router's own requests on ``link`` fail (its requests in flight failed)."""
        out: list[Command] = []
        for waiting in link.own.drop_if(_routers):
            out += self.gather_step(link, waiting.waiter, None)
        self.reset_own_at()
        return out

    def expire(self, now: float) -> list[Expired]:
        """Time out the own requests (the router's and the lifecycles') past their deadline:
        per link, the commands and what its lifecycle says to do (``Expired``)."""
        expired: list[Expired] = []
        for link in list(self.links.values()):
            if not len(link.own):
                continue
            out: list[Command] = []
            late = link.own.expire(now)
            theirs = [waiting for waiting in late if UpstreamLifecycle.owns(waiting.waiter)]
            for waiting in late:
                if type(waiting.waiter) is ListenAgain:
                    out += self.listen_upstream(link, waiting.waiter.attempt)
                    continue
                if type(waiting.waiter) is AckWait:
                    out += self.release_acks(link)
                    continue
                out += self._give_up(link, waiting, "timed out")
                if type(waiting.waiter) is OwnWaiter:
                    log.warning("server %s: %s timed out (upstream id %s)", link.name, waiting.method, waiting.id)
                    out += self.gather_step(link, waiting.waiter, None)
            outcomes = link.lifecycle.expired(theirs, now) if theirs and link.lifecycle is not None else None
            expired.append((link, out, outcomes))
        self.reset_own_at()
        return expired

    def _give_up(self, link: UpstreamLink, waiting: Waiting[Any], why: str) -> list[Command]:
        """The one rule for an own request the proxy stops waiting for (timed out, or
        nobody wants its answer): the server is told, so it can stop working on it. Not
        ``initialize`` (which must not be cancelled), nor on a connection not up."""
        if link.ready and link.lifecycle is not None and waiting.method != INITIALIZE:
            return [ToServer(link.name, cancelled(waiting.id, why))]
        return []

    def drop_gathers(self, session: int, why: str, client_id: Any = None) -> list[Command]:
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
            self.reset_own_at()
        return out

    def note_own(self, link: UpstreamLink) -> None:
        """The link's own requests changed: the router's clock wakes for the earliest."""
        deadline = link.own.next_deadline()  # (a listen's is infinite: it never wakes the clock)
        if deadline is not None and deadline < math.inf and (self.own_at is None or deadline < self.own_at):
            self.own_at = deadline

    def reset_own_at(self) -> None:
        """The earliest deadline of any link's own requests, exactly (not on the hot path:
        own requests are answered a few at a time)."""
        deadlines = [d for link in self.links.values() if len(link.own) and (d := link.own.next_deadline()) is not None]
        earliest = min(deadlines, default=None)
        self.own_at = earliest if earliest is not None and earliest < math.inf else None

    def gather_step(self, link: UpstreamLink, waiter: OwnWaiter, result: Any) -> list[Command]:
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

    # --- subscriptions/listen ----------------------------------------------------------

    def listen_upstream(self, link: UpstreamLink, attempt: int = 0) -> list[Command]:
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
        self.reset_own_at()
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
        out = self.release_acks(link)
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
        self.note_own(link)
        return out

    def learnt(self, link: UpstreamLink) -> None:
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

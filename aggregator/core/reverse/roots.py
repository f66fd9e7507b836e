"""roots/list and roots changes: asked of the client the roots come from, held, or answered by the proxy. Sans-IO.

``Roots`` owns the configured roots (``proxy.roots``), the roots/list requests held for a
client that is still initializing, and the links answered from ``proxy.roots`` in their
client's place. Its rules (whose roots a server sees: ``affinity.roots_source``):

1. A roots/list is answered by the proxy (``proxy.roots``, or none), held for the client
   the roots come from while it initializes (at most ``ROOTS_HOLD_SECONDS``), or asked of
   that client: ``decide`` says which; asking is the caller's (a server-to-client request).
2. A link answered in its client's place is told its roots changed once that client has
   roots of its own (``release``).
3. A link told its roots changed is not told again until it asks (``changed``).

It reads the links and clients it is given; it writes only each link's ``roots_told``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from aggregator.core.commands import Command, ToServer
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.reverse import affinity
from aggregator.mcp.constants import ROOTS_LIST_CHANGED

log = logging.getLogger(__name__)

# How long a roots/list waits for the client its roots come from to finish initializing;
# then it is answered from proxy.roots (or with no roots).
ROOTS_HOLD_SECONDS = 10.0


class Roots:
    """Whose roots each upstream sees, what waits for them, and telling it when they change."""

    def __init__(
        self,
        roots: Iterable[str] | None,
        single_client: bool,
        server_requests: Iterable[str],
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        clock: Callable[[], float],
    ) -> None:
        self.roots = None if roots is None else [{"uri": uri} for uri in roots]  # proxy.roots
        # Only ever one client (stdio, no network front): shared servers see its roots, else ``roots``.
        self.single_client = single_client
        self.server_requests = server_requests
        self.links = links
        self.clients = clients
        self.clock = clock
        self.held: list[tuple[str, Any, float]] = []  # (link, id, deadline) waiting for a client to initialize
        self.fallback: set[str] = set()  # links answered from ``roots`` in their client's place

    def decide(self, link: UpstreamLink, id: Any) -> ToServer | ClientState | None:
        """roots/list ``id`` of ``link`` (rule 1): the proxy's answer, the client to ask,
        or None (held)."""
        source = affinity.roots_source(link.session, self.single_client, list(self.clients))
        client = self.clients.get(source) if type(source) is int else None
        action = affinity.roots_action(
            source, client is not None and client.initialized, client is not None and "roots" in client.capabilities
        )
        if action == affinity.ANSWER:
            return self.answer(link, id)
        if action == affinity.HOLD:
            self.held.append((link.name, id, self.clock() + ROOTS_HOLD_SECONDS))
            return None
        assert client is not None  # forwarded only to a client that initialized: ``source``
        return client

    def answer(self, link: UpstreamLink, id: Any) -> ToServer:
        """The proxy's own answer to roots/list: proxy.roots, or no roots."""
        if affinity.roots_source(link.session, self.single_client, list(self.clients)) != affinity.FROM_PROXY:
            self.fallback.add(link.name)  # its client's roots may differ: tell it when they come
        return ToServer(link.name, {"jsonrpc": "2.0", "id": id, "result": {"roots": self.roots or []}})

    def release(self, client: ClientState) -> tuple[list[tuple[UpstreamLink, Any]], list[str]]:
        """A client finished initializing: the held roots/list requests that are now its to
        answer (link, id), and the links answered in its place, to be told (rule 2)."""
        ready: list[tuple[UpstreamLink, Any]] = []
        held, self.held = self.held, []
        for name, id, deadline in held:
            link = self.links.get(name)
            if link is None or not link.ready:
                continue
            source = affinity.roots_source(link.session, self.single_client, list(self.clients))
            if source != client.key:
                self.held.append((name, id, deadline))
                continue
            ready.append((link, id))
        told = [name for name in self.followers(client) if name in self.fallback]
        self.fallback.difference_update(told)
        return ready, told

    def changed(self, names: list[str]) -> list[Command]:
        """Tell these links their roots changed (rule 3)."""
        out: list[Command] = []
        for name in names:
            link = self.links[name]
            if not link.roots_told:
                link.roots_told = True
                out.append(ToServer(name, {"jsonrpc": "2.0", "method": ROOTS_LIST_CHANGED}))
        return out

    def followers(self, client: ClientState) -> list[str]:
        """The ready links whose roots are this client's (none if it declares no roots)."""
        if "roots" not in client.capabilities or "roots" not in self.server_requests:
            return []
        return affinity.roots_followers(
            client.key, ((name, link.session) for name, link in self.links.items() if link.ready), self.single_client
        )

    def held_for(self, key: int) -> list[tuple[str, Any, float]]:
        """Take the held roots/list requests whose roots come from client ``key``."""
        mine = [
            held
            for held in self.held
            if held[0] in self.links
            and affinity.roots_source(self.links[held[0]].session, self.single_client, [key]) == key
        ]
        self.held = [held for held in self.held if held not in mine]
        return mine

    def forget(self, server: str) -> None:
        """``server``'s connection is lost: nothing of it is held or owed a notice."""
        self.held = [held for held in self.held if held[0] != server]
        self.fallback.discard(server)

    def next_deadline(self) -> float | None:
        """When the first held request falls back (None: none is held)."""
        return min(held[2] for held in self.held) if self.held else None

    def expire(self, now: float) -> list[Command]:
        """The held requests past their bound, answered from ``proxy.roots``."""
        out: list[Command] = []
        kept = []
        for name, id, deadline in self.held:
            if deadline > now:
                kept.append((name, id, deadline))
                continue
            link = self.links.get(name)
            if link is not None and link.ready:
                log.info(
                    "server %s: no client to ask for roots within %gs; answered from proxy.roots",
                    name,
                    ROOTS_HOLD_SECONDS,
                )
                out.append(self.answer(link, id))
        self.held = kept
        return out

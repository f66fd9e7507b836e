"""roots/list and roots changes: asked of the client the roots come from, held, or answered by the proxy. Sans-IO."""

from __future__ import annotations

import logging
from typing import Any

from aggregator.core.commands import Command, ToServer
from aggregator.core.reverse import affinity
from aggregator.core.state import ROOTS_HOLD_SECONDS, ClientState, RouterState, UpstreamLink
from aggregator.mcp.constants import ROOTS_LIST_CHANGED

log = logging.getLogger(__name__)


class Roots(RouterState):
    """Whose roots each upstream sees, and telling it when they change."""

    def _roots_request(self, link: UpstreamLink, id: Any, params: dict[str, Any], related: int | None) -> list[Command]:
        """roots/list: from the client the server's roots come from, or from the proxy;
        held while that client is still initializing (``core.reverse.affinity.roots_source``)."""
        source = affinity.roots_source(link.session, self.single_client, list(self.clients))
        client = self.clients.get(source) if type(source) is int else None
        action = affinity.roots_action(
            source, client is not None and client.initialized, client is not None and "roots" in client.capabilities
        )
        if action == affinity.ANSWER:
            return [self._roots_answer(link, id)]
        if action == affinity.HOLD:
            self.held_roots.append((link.name, id, self.clock() + ROOTS_HOLD_SECONDS))
            return []
        assert client is not None  # forwarded only to a client that initialized: ``source``
        owner = affinity.request_owner(**self._owner_facts(link, params, related, requests=True))
        return self._ask_client(
            link, client.key, id, "roots/list", params, "roots", owner.related if owner.session == source else None
        )

    def _roots_answer(self, link: UpstreamLink, id: Any) -> ToServer:
        """The proxy's own answer to roots/list: proxy.roots, or no roots."""
        if affinity.roots_source(link.session, self.single_client, list(self.clients)) != affinity.FROM_PROXY:
            self.roots_fallback.add(link.name)  # its client's roots may differ: tell it when they come
        return ToServer(link.name, {"jsonrpc": "2.0", "id": id, "result": {"roots": self.roots or []}})

    def _release_roots(self, client: ClientState) -> list[Command]:
        """A client finished initializing: the roots/list requests held for it go on."""
        out: list[Command] = []
        held, self.held_roots = self.held_roots, []
        for name, id, deadline in held:
            link = self.links.get(name)
            if link is None or not link.ready:
                continue
            source = affinity.roots_source(link.session, self.single_client, list(self.clients))
            if source != client.key:
                self.held_roots.append((name, id, deadline))
                continue
            out += self._roots_request(link, id, {}, None)
        # It has roots of its own: those answered in its place ask again.
        told = [name for name in self._roots_followers(client) if name in self.roots_fallback]
        self.roots_fallback.difference_update(told)
        return out + self._roots_changed(told)

    def _roots_changed(self, names: list[str]) -> list[Command]:
        """Tell these links their roots changed; one that was told and has not asked since
        is not told again (it will read the roots as they are when it asks)."""
        out: list[Command] = []
        for name in names:
            link = self.links[name]
            if not link.roots_told:
                link.roots_told = True
                out.append(ToServer(name, {"jsonrpc": "2.0", "method": ROOTS_LIST_CHANGED}))
        return out

    def _roots_followers(self, client: ClientState) -> list[str]:
        """The ready links whose roots are this client's (none if it declares no roots)."""
        if "roots" not in client.capabilities or "roots" not in self.server_requests:
            return []
        return affinity.roots_followers(
            client.key, ((name, link.session) for name, link in self.links.items() if link.ready), self.single_client
        )

    def _held_for(self, key: int) -> list[tuple[str, Any, float]]:
        """Take the held roots/list requests whose roots come from client ``key``."""
        mine = [
            held
            for held in self.held_roots
            if held[0] in self.links
            and affinity.roots_source(self.links[held[0]].session, self.single_client, [key]) == key
        ]
        self.held_roots = [held for held in self.held_roots if held not in mine]
        return mine

    def _expire_roots(self, now: float) -> list[Command]:
        out: list[Command] = []
        kept = []
        for name, id, deadline in self.held_roots:
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
                out.append(self._roots_answer(link, id))
        self.held_roots = kept
        return out

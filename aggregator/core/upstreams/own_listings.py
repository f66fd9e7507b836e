"""What a session sees of the servers that act as each user. Sans-IO.

A server with ``auth = "oauth"`` or ``"token-exchange"`` (``LinkSettings.per_user``) is
never connected without a user: the proxy keeps no shared connection to it, and nothing of
it is listed for everyone (it would answer 401). What a session sees of it is what the
session's own connection lists (``core.catalogs.session_catalog``). The rules:

1. A list (``tools/list`` and the other ``*/list``, or search mode's ``find_tools``) from a
   session that acts for a user waits for the session's own connection to each such server
   it has not listed yet: the connection is started if need be, and the list is held until
   that connection has listed, has ended, or its server's ``init_timeout`` has passed; then
   it is handled again, as its client sent it. So the first list of a session shows these
   servers' items. A held list is a ``Pending`` in phase LISTING under the server's name
   (its ``server``), in its client's ``in_flight`` and the deadlines, kept here by the
   connection's name; nothing was sent.
2. A session's own connection that ended or ran out of time before it listed is not waited
   for again by that session's lists (``ClientState.unlisted``) until it has listed: a call
   starts it again, as it does today. One a call of the grant tool started (rule 3) is
   waited for, so the list after a grant shows the server's own tools.
3. An ``oauth`` server whose user has not granted access yet cannot be listed: its
   connection ends with the refusal that names the URL to open. The session then sees one
   tool in the server's place (``GRANT_TOOL``): calling it starts the connection again and
   is answered with that refusal (the consent the caller is asked for). Once the grant is
   given, the session's own listing replaces it (a list change is announced), and a call
   of the grant tool the connection was started for is answered by the proxy: granted. No user's
   listing is ever shown to another: a server acting as each user may show each its own tools.
   A ``token-exchange`` server whose exchange failed has nothing to grant (``UpstreamLink.grants``
   is false): the session sees nothing of it, as under rule 2 (the exchange logs why).
4. A session acting for nobody (no access token's user) waits for nothing: such a server
   shows it nothing, and its calls are refused as they are today.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aggregator.core.commands import Command
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Pending, Phase, UpstreamLink
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.upstreams.held_requests import Resend

log = logging.getLogger(__name__)

# The tool a session sees of an ``oauth`` server its user has not granted access to yet.
GRANT_TOOL = "grant_access"


def grant_listing(server: str) -> dict[str, list[dict[str, Any]]]:
    """What a session whose user must grant ``server`` access first sees of it (rule 3)."""
    tool = {
        "name": GRANT_TOOL,
        "description": (
            f"Server {server!r} acts as you, and you have not granted it access yet. Call this tool"
            " to get the link where you grant it; its own tools are listed once you have."
        ),
        "inputSchema": {"type": "object", "properties": {}},
    }
    return {"tools": [tool]}


def is_grant_call(client: ClientState, server: str, message: dict[str, Any], params: dict[str, Any]) -> bool:
    """Whether a request held for ``client``'s own connection to ``server`` calls the grant
    tool the session was shown in its place (rule 3)."""
    return server in client.granting and message["method"] == "tools/call" and params.get("name") == GRANT_TOOL


def granted(id: Any, server: str) -> dict[str, Any]:
    """The answer to a call of the grant tool once the session's connection serves: the
    grant was given (the server's own listing follows, announced as a list change)."""
    text = f"Access to server {server!r} is granted: list the tools again to see its own."
    return {"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}], "isError": False}}


def acts_for_user(principal: Any) -> bool:
    """Whether a session's principal is a user (an access token's issuer and subject), whom
    a server acting as each user can be reached as."""
    return type(getattr(principal, "subject", None)) is str and type(getattr(principal, "issuer", None)) is str


class OwnListings:
    """Lists held for sessions' own connections to servers acting as each user (rule 1).

    Given the links, the clients, the request table (its deadlines), forwarding (which
    makes a session's own link) and the clock; ``per_user`` (server -> how long a list
    waits for it) is the router's, kept by reloads."""

    def __init__(
        self,
        per_user: dict[str, float],
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        requests: RequestTable,
        forwarding: Forwarding,
        max_in_flight: int,
        clock: Callable[[], float],
    ) -> None:
        self.per_user = per_user
        self.links = links
        self.clients = clients
        self.requests = requests
        self.forwarding = forwarding
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.held: dict[str, list[Pending]] = {}  # a session's own link's name -> lists waiting for it
        self.lost: set[str] = set()  # own links lost, until their connection has ended (``ended``)

    def wait(self, client: ClientState, message: dict[str, Any]) -> list[Command] | None:
        """Hold a list for the session's own connections not listed yet, starting them
        (the commands to); None: nothing to wait for, answer it now."""
        if not acts_for_user(client.principal) or len(client.in_flight) >= self.max_in_flight:
            return None
        owns = getattr(client.catalog, "owns", None)
        waited: list[tuple[str, str]] = []  # (server, its own link's name)
        for server in self.per_user:
            if server not in self.links:
                continue
            name = self.forwarding.link_name(server, client.key)
            if name in self.lost:  # lost, and not forgotten yet: nothing to wait for
                continue
            if server in client.granting:
                if name not in self.links:  # a call of its grant tool starts it, not a list
                    continue
            elif server in client.unlisted or (owns is not None and owns(server)):
                continue
            waited.append((server, name))
        if not waited or len(self.held.get(waited[0][1], ())) >= self.max_in_flight:
            return None
        out: list[Command] = []
        for server, name in waited:
            if name not in self.links:
                out += self.forwarding.open_link(client, server, name)
        server, name = waited[0]
        held = self.held.setdefault(name, [])
        now = self.clock()
        pending = Pending(client.key, message["id"], message["method"], server, 0)
        pending.hold(Phase.LISTING, message)
        pending.deadline = pending.hard_deadline = now + self.per_user[server]
        self.requests.deadlines.push(pending.deadline, pending)
        client.in_flight[pending.client_id] = pending
        held.append(pending)
        return out

    def release(self, name: str, lost: bool = False) -> list[Resend]:
        """The session's own connection ``name`` has listed or is ``lost``: the lists that
        waited for it are handled again."""
        link = self.links.get(name) if lost else None
        if link is not None and link.session is not None:
            self.lost.add(name)
        out: list[Resend] = []
        for held in self.held.pop(name, ()):
            if held.done:
                continue
            self.requests.end(held)
            if held.session in self.clients:
                out.append(Resend(held))
        return out

    def ended(self, name: str) -> None:
        """The connection of own link ``name`` has ended (the link is forgotten, or kept ready).
        A list still held for it (its session left, or a reload stopped it) keeps its deadline."""
        self.lost.discard(name)
        self.held.pop(name, None)

    def holds(self, pending: Pending) -> bool:
        """Whether ``pending`` is a list held here."""
        return pending.phase is Phase.LISTING and pending.server in self.per_user

    def timed_out(self, held: Pending) -> list[Resend]:
        """A held list waited its server's ``init_timeout``: answered without that server,
        whose connection goes on starting (its listing is announced to the session)."""
        if held.server in self.links:
            self.requests.end(held)
        else:  # its server was removed meanwhile (a reload): nothing to count it under
            held.done = True
        client = self.clients.get(held.session) if held.session is not None else None
        if client is not None:
            client.in_flight.pop(held.client_id, None)
        name = self.forwarding.link_name(held.server, held.session) if held.session is not None else ""
        waiting = self.held.get(name)
        if waiting is not None:
            waiting[:] = [p for p in waiting if not p.done]
            if not waiting:
                del self.held[name]
        if client is None:
            return []
        client.unlisted.add(held.server)
        log.info(
            "server %s: session %d's own connection did not list within %gs; %s answered without it",
            held.server,
            client.key,
            self.per_user.get(held.server, 0.0),
            held.method,
        )
        return [Resend(held)]

"""A new configuration applied while clients stay connected: servers removed and added,
catalogs renewed with new rules and names. Sans-IO.

Rules of a live reconfiguration:

1. A removed server leaves no trace: everything in flight to it or held for it is
   answered (reason ``unavailable``), its server-to-client requests are cancelled at the
   client, its items leave every catalog (clients are told their lists changed), its
   subscriptions are forgotten, and its name is unknown from then on. Its per-session
   connections are stopped (``StopUpstream``); the trio layer stops its shared one.
2. A server is added with a fresh link and outage, as at startup: a request naming it
   (by its prefix) waits for its first listing or hears that it is starting.
3. Catalogs are renewed in place: their servers (names, order, prefixes) and rules change,
   never their identity, so every session keeps its catalog and its cursor checks (a page
   cursor of a catalog that changed is stale, as after any listing). Each profile whose
   clients see something different is told, once, after the debounce.
4. A server whose settings changed (its isolation aside: that one is removed and added)
   restarts as if it had been lost (``server_restarting``): its requests in flight are
   answered, what it listed is remembered, and a request naming it waits for the new
   connection (``aggregator.core.catalogs.outages``). Once the old connection has ended, its link
   takes the new settings (``server_replaced``); the new connection starts as at startup.
   A server stopped on purpose (lazy, idle-stopped) is no exception: its items (the cached
   listing of its old configuration, or what it listed last) leave the catalogs too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggregator.core.catalogs.catalog import Catalog, ServerNaming
from aggregator.core.catalogs.naming import tool_prefix, uri_prefix
from aggregator.core.catalogs.outages import RESTARTING, Outage
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.commands import Command, StopUpstream
from aggregator.core.handlers.upstream_events import UpstreamEvents
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.links import UpstreamLink, configured_link
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.settings import LinkSettings
from aggregator.core.upstreams.held_requests import HeldRequests, Resend
from aggregator.mcp.constants import KINDS


class Reconfigure:
    """Servers removed and added, and catalogs renewed, while clients stay connected.

    It changes the router's tables it is given (links, outages, per-session servers) and
    stops a server through the upstream events (``server_lost``), as if it had been lost.
    """

    def __init__(
        self,
        *,
        links: dict[str, UpstreamLink],
        outages: dict[str, Outage],
        start_takes: dict[str, float],
        per_session: set[str],
        per_user: dict[str, float],
        catalogs: dict[str, Catalog],
        views: SessionViews,
        subscriptions: Subscriptions,
        announcements: Announcements,
        requests: RequestTable,
        held_requests: HeldRequests,
        upstreams: UpstreamEvents,
    ) -> None:
        self.links = links
        self.outages = outages
        self.start_takes = start_takes
        self.per_session = per_session
        self.per_user = per_user  # acting as each user: never out, no shared connection
        self.catalog = catalogs["default"]  # its naming names every server
        self.catalogs = catalogs
        self.views = views
        self.subscriptions = subscriptions
        self.announcements = announcements
        self.requests = requests  # its ``held``
        self.held_requests = held_requests
        self.upstreams = upstreams

    def server_removed(self, server: str, why: str) -> list[Command | Resend]:
        """Forget a configured server (rule 1). The trio layer stops its shared connection."""
        out = self._stop_session_links(server, why)
        if server not in self.links:
            return out
        out += self.upstreams.server_lost(server, why, reconfigured=True)
        outage = self.outages.get(server)
        if outage is not None:
            outage.reason = why
        out += self.held_requests.fail(server, removed=why)
        self._forget_subscriptions(server)
        self.outages.pop(server, None)
        self.requests.held.pop(server, None)
        self.start_takes.pop(server, None)
        self.per_session.discard(server)
        self.per_user.pop(server, None)
        del self.links[server]
        return out

    def server_restarting(self, server: str, why: str) -> list[Command | Resend]:
        """A server whose settings changed is stopped, to start again (rule 4). The trio
        layer stops its shared connection, then calls ``server_replaced``."""
        out = self._stop_session_links(server, why)
        if server not in self.links:
            return out
        return [*out, *self.upstreams.server_lost(server, why, reconfigured=True)]

    def server_replaced(self, server: LinkSettings, why: str) -> None:
        """The old connection of a restarting server has ended: its link takes the new
        settings; requests held for it go on waiting for the new connection (rule 4)."""
        self.links[server.name] = self._link(server)
        self._acts_as_users(server)
        outage = self.outages.setdefault(server.name, Outage(server.name))
        # As told when it was stopped: the old connection's own report of its end came after.
        outage.state, outage.reason, outage.retry_at, outage.woken = RESTARTING, why, None, None

    def _acts_as_users(self, server: LinkSettings) -> None:
        """Note whether ``server`` acts as each user (no shared connection)."""
        if server.per_user:
            self.per_user[server.name] = server.init_timeout
        else:
            self.per_user.pop(server.name, None)

    def _link(self, server: LinkSettings) -> UpstreamLink:
        naming = self.catalog.naming[server.name]
        return configured_link(server, naming.prefix, naming.uri_prefix)

    def _stop_session_links(self, server: str, why: str) -> list[Command | Resend]:
        """Stop the sessions' own connections to a per-session server; the lists that
        waited for them are handled again."""
        out: list[Command | Resend] = []
        for name in [n for n, link in self.links.items() if link.session is not None and link.server == server]:
            out += self.upstreams.server_lost(name, why)
            out += self.upstreams.own_listings.release(name, lost=True)
            self._forget_subscriptions(name)
            del self.links[name]
            out.append(StopUpstream(name))
        return out

    def _forget_subscriptions(self, name: str) -> None:
        for uri in self.subscriptions.of_server(name):
            for session in list(self.subscriptions.subscribers((name, uri))):
                self.subscriptions.remove((name, uri), session)

    def server_added(self, server: LinkSettings) -> None:
        """A configured server, new to the router (rule 2); the catalogs name it already
        (``catalogs_renewed`` first)."""
        self.links[server.name] = self._link(server)
        self._acts_as_users(server)
        self.outages[server.name] = Outage(server.name)
        if server.isolation == "per-session":
            self.per_session.add(server.name)

    def catalogs_renewed(
        self, servers: Iterable[Any], policies: dict[str, Any], catalog_hook: Any = None
    ) -> list[Command]:
        """Renew every profile's catalog in place (rule 3): ``servers`` (anything with
        ``name``, ``prefix`` and ``uri_prefix``, in config order), each profile's policy
        (``policies``, by profile name; "default" too) and the plugins' catalog hook."""
        naming = {s.name: ServerNaming(s.name, tool_prefix(s), uri_prefix(s)) for s in servers}
        out: list[Command] = []
        for profile, catalog in self.catalogs.items():
            # Sessions with a view of their own (per-session servers) are told of it alone.
            seen = self.views.seen_over(catalog) if self.views else {}
            kinds = renew_catalog(catalog, naming, policies.get(profile, catalog.policy), catalog_hook)
            out += self.announcements.announce(kinds, profile)
            for session, changed in self.views.renewed(catalog, seen) if seen else ():
                out += self.announcements.announce(changed, session)
        return out


def renew_catalog(
    catalog: Catalog, naming: dict[str, ServerNaming], policy: Any, catalog_hook: Any = None
) -> list[str]:
    """Give ``catalog`` new servers and rules and rebuild it: the kinds clients see
    differently now. Items of servers no longer named stay in the (shared) store until
    ``Catalog.forget`` drops them; they are not exposed."""
    catalog.naming = dict(naming)
    catalog.uri_prefixes = {n.uri_prefix.lower(): n.name for n in naming.values() if n.uri_prefix}
    catalog.policy = policy
    catalog.catalog_hook = catalog_hook
    return [kind for kind in KINDS if catalog.rebuild(kind)]

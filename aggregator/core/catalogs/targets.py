"""What a client request names: the server and its own name or URI. Sans-IO.

``Targets`` answers one question for every request that names a tool, prompt, resource or
template, from the tables it is given (the catalogs, links, servers that are out and the
per-session servers; read, never changed here):

1. A name or URI the client's catalog routes is that route.
2. One the catalog does not route but a shared server between starts owns
   (``core.catalogs.outages``) raises ``ServerDown`` with the route: the request waits for that
   server or is answered with its state, never "Unknown" (invariant 7). A per-session
   server whose listing connection is out is the session's own: not out.
3. Anything else is -32602 from the proxy, and nothing is sent (invariant 4). URIs are
   compared in normal form, so no spelling of a hidden URI finds it.
"""

from __future__ import annotations

import logging
from typing import Any

from aggregator.core.catalogs.catalog import Catalog, Route
from aggregator.core.catalogs.outages import Outage, name_owner, template_key, template_owner, uri_owner
from aggregator.core.catalogs.uris import InvalidUri, normalize_uri
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.jsonrpc.errors import INVALID_PARAMS, RemoteProtocolError
from aggregator.mcp.constants import PROMPTS, TARGETED_METHODS, TOOLS

log = logging.getLogger(__name__)


class ServerDown(Exception):
    """A lookup found that what a request names (``route``) belongs to ``server``, which is
    out: the request waits for it or is answered with its state."""

    def __init__(self, route: Route) -> None:
        super().__init__(route.server)
        self.route = route
        self.server = route.server


class Targets:
    """One lookup for every request that names a tool, prompt, resource or template."""

    def __init__(
        self,
        catalogs: dict[str, Catalog],
        links: dict[str, UpstreamLink],
        outages: dict[str, Outage],
        per_session: set[str],
    ) -> None:
        self.catalogs = catalogs  # by profile
        self.links = links
        self.outages = outages  # shared servers not listed (yet, or again)
        self.per_session = per_session  # the servers each session has a connection of its own to

    def resolve(self, client: ClientState, method: str, params: Any) -> Route:
        """(server, its own name or URI) of what a client request names, read as its
        handler reads it.

        Raises ``RemoteProtocolError`` (-32602) for what names nothing this client may use:
        nothing is sent for an unknown name or URI (invariant 4); ``ServerDown`` (with the
        route) for what belongs to a server that is out, so the request waits for it. A name
        of a per-session server whose listing connection is out is the session's own: not out.
        """
        if method == "tools/call" or method == "prompts/get":
            name = params.get("name") if params else None
            tools = method == "tools/call"
            route: Route | None = (
                (client.catalog.tools if tools else client.catalog.prompts).get(name) if type(name) is str else None
            )
            if route is not None:
                if self.outages and self._is_out(route.server):  # a stopped server's (outages rule 6)
                    raise ServerDown(route)
                return route
            return self._name_target(client, TOOLS if tools else PROMPTS, name)
        if method == "completion/complete":
            return self._completion_target(client, params)
        return self._uri_target(client, params)

    def _name_target(self, client: ClientState, kind: str, name: Any) -> Route:
        """A tool or prompt name the catalog does not have: one of a server that is out, or unknown."""
        what = "tool" if kind == TOOLS else "prompt"
        if type(name) is not str:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {what} name must be a string")
        owner = self._name_owner(client, kind, name)
        if owner is None:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown {what}: {name}")
        return self._owned(owner)

    def _uri_target(self, client: ClientState, params: Any) -> Route:
        """A resource URI, compared in normal form, so no spelling of a hidden URI finds
        it; refused spellings are -32602 as well."""
        uri = params.get("uri") if type(params) is dict else None
        if type(uri) is not str:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: uri must be a string")
        out = False
        try:
            route: Route | None = client.catalog.route_uri(uri)
            if self.outages:
                route, out = self._outage_uri(client, uri, route)
        except InvalidUri as exc:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {exc}") from None
        if route is None:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {uri}")
        # A per-session server whose listing connection is out is still the session's own.
        if out and route[0] not in self.per_session:
            raise ServerDown(Route(*route))
        return route

    def _completion_target(self, client: ClientState, params: Any) -> Route:
        """The prompt or the resource template (or URI) a completion's ``ref`` names."""
        ref = params.get("ref") if params else None
        if type(ref) is not dict:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: ref must be an object")
        if ref.get("type") == "ref/prompt":
            name = ref.get("name")
            route: Route | None = client.catalog.prompts.get(name) if type(name) is str else None
            if route is not None:
                if self.outages and self._is_out(route.server):
                    raise ServerDown(route)
                return route
            owner = self._name_owner(client, PROMPTS, name) if type(name) is str else None
            if owner is None:
                raise RemoteProtocolError(INVALID_PARAMS, f"Unknown prompt: {name}")
            return self._owned(owner)
        uri = ref.get("uri")
        if ref.get("type") != "ref/resource" or type(uri) is not str:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: ref must be ref/prompt or ref/resource")
        try:
            route = client.catalog.route_template(uri)
            if self.outages and (route is None or self._is_out(route.server)):
                owner = self._outage_template(client, uri, route)
                if owner is not None:
                    raise ServerDown(Route(*owner))
                if route is not None and self._is_out(route.server):  # a stopped server's template
                    raise ServerDown(route)
        except InvalidUri as exc:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {exc}") from None
        if route is None:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {uri}")
        return route

    def _owned(self, owner: tuple[str, str]) -> Route:
        """What a server that is out owns: it waits for that server, unless the server is
        per-session (only its listing connection is out: the session's own answers)."""
        route = Route(*owner)
        if owner[0] not in self.per_session:
            raise ServerDown(route)
        return route

    def describe(self, client: ClientState, message: dict[str, Any]) -> tuple[str, str, str] | None:
        """(server, its own name or URI, the exposed one) a client's request is for, or None
        when it names nothing this client may use. Changes nothing (for plugins)."""
        params = message.get("params")
        method = message["method"]
        if type(params) is not dict or method not in _DESCRIBED:
            return None
        try:
            route = self.resolve(client, method, params)
        except RemoteProtocolError:
            return None
        except ServerDown as down:
            route = down.route
        if method == "completion/complete":
            exposed = params["ref"].get("name") if params["ref"].get("type") == "ref/prompt" else params["ref"]["uri"]
        else:
            exposed = params["name" if method in ("tools/call", "prompts/get") else "uri"]
        return route.server, route.original, exposed

    def resource_route(self, client: ClientState, params: Any, *, while_out: bool = False) -> Route:
        """(server, the URI to send it) for a client's resource URI. One of a server that is
        out raises ``ServerDown``, unless ``while_out`` takes it as is."""
        try:
            return self._uri_target(client, params)
        except ServerDown as down:
            if while_out:
                return down.route
            raise

    def _name_owner(self, client: ClientState, kind: str, name: str) -> tuple[str, str] | None:
        """(server, its own name) of a tool or prompt name of a server that is out, or None.
        Read off the profile's catalog: a session's own view carries no naming rules."""
        if not self.outages:
            return None
        return name_owner(self.outages, self.catalogs[client.profile], client.profile, kind, name)

    def _outage_uri(self, client: ClientState, uri: str, route: Any) -> tuple[Any, bool]:
        """``route_uri``'s answer seen with the servers that are out: (route, whether its server
        is out). A URI one of them listed is its, unless the catalog routes it to a server
        that lists it now; a URI routed by its prefix to one of them is its, unless this
        profile was not allowed to see it there."""
        catalog = client.catalog
        normal = normalize_uri(uri)
        if normal in catalog.resources:  # listed: out only if its server is stopped (outages rule 6)
            return route, route is not None and self._is_out(route[0])
        owner = uri_owner(self.outages, client.profile, normal)
        if owner is not None:
            return Route(*owner), True
        if route is not None and self._is_out(route[0]):
            seen = self.outages[route[0]].memory.get(client.profile)
            if seen is not None and seen.hides(route[1]):
                return None, False
            return route, True
        return route, False

    def _outage_template(self, client: ClientState, exposed: str, route: Any) -> tuple[str, str] | None:
        """(server, its own template or URI) if a completion's template or URI is of a server
        that is out, else None."""
        catalog = self.catalogs[client.profile]
        owner = template_owner(self.outages, client.profile, template_key(exposed, catalog.uri_prefixes))
        if owner is None:
            try:
                uri_route, out = self._outage_uri(client, exposed, route)
            except InvalidUri:  # a template, not a URI: it names nothing of a server that is out
                return None
            owner = uri_route if out else None
        return owner

    def _is_out(self, server: str) -> bool:
        """Whether a request for ``server`` that the catalog routes must wait for it."""
        return server in self.outages and server not in self.per_session and not self.links[server].ready


# The methods whose target ``describe`` tells (for plugins).
_DESCRIBED = frozenset(TARGETED_METHODS)

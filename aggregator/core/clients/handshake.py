"""The client handshake and what the proxy says about itself: capabilities, instructions, log levels. Sans-IO.

``Handshake`` answers a legacy client's ``initialize`` and says what the proxy serves,
merged over the links it is given (read; only each link's ``log_level``, what the proxy
last asked it for, is written here):

- Capabilities: a kind is advertised if a ready shared server has it, or while any shared
  server is still starting (it may bring any kind; announced later). Logging always.
  Legacy tasks are merged from the servers; the modern tasks extension is declared when
  a modern server declares it.
- Instructions: each ready shared server's, once, under its name and prefix; never a
  session's own connection's (another session must not even learn of it).
- An initialize that carries this proxy's own instance id (its config names itself) is
  refused before anything waits for startup, which would wait for that very handshake.
- Adoption (``adopt``): a session initialized elsewhere (another replica, or before a
  restart) taken over as its handshake left it, with no initialize at all.
- Log levels: every legacy upstream that logs is set to the most verbose level any client
  asked for (``log_levels``, the changes to make).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aggregator import __version__
from aggregator.core.commands import Command, ToClient, WaitForStartup
from aggregator.core.lifecycle.upstream_era import INSTANCE_KEY, LEGACY_ERA, MODERN_ERA
from aggregator.core.notices.announcements import Announcements
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.records.log_levels import most_verbose
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError
from aggregator.mcp.constants import CAPABILITY_OF, PROMPTS, RESOURCES, TOOLS
from aggregator.mcp.modern import TASKS_EXTENSION, declares_tasks
from aggregator.mcp.versions import negotiate

log = logging.getLogger(__name__)


class Handshake:
    """initialize, and what the proxy says about itself to clients and to upstreams."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        separator: str,
        server_requests: Iterable[str],
        instance: str,
        announcements: Announcements,
    ) -> None:
        self.links = links
        self.separator = separator  # between a server's prefix and its names
        self.server_requests = server_requests  # the client capabilities the proxy routes
        self.instance = instance  # this running proxy's id
        self.announcements = announcements  # whose count a client is given the lists at

    def initialize(self, client: ClientState, message: dict[str, Any], startup_complete: bool) -> list[Command]:
        """A legacy client's initialize: answered, or held until startup is complete."""
        if client.initialize_seen:
            raise RemoteProtocolError(INVALID_REQUEST, "Invalid request: already initialized")
        params = message.get("params") or {}
        if type(params) is dict and self.asked_by_itself(params):
            # Refused before waiting for startup, which waits for this very handshake.
            raise RemoteProtocolError(
                INVALID_REQUEST,
                "Refused: this initialize comes from this aggregator itself (its config lists the"
                " aggregator's own address)",
                data={INSTANCE_KEY: self.instance},  # how the asking side knows it is itself
            )
        if not startup_complete:
            return [WaitForStartup(client.key)]
        client.initialize_seen = True
        client.protocol_version = negotiate(params.get("protocolVersion"))
        capabilities = params.get("capabilities")
        client.capabilities = capabilities if type(capabilities) is dict else {}
        info = params.get("clientInfo")
        client.client_info = info if type(info) is dict else {}
        client.advertised = self.merged_capabilities()
        client.announced_upto = self.announcements.count
        result: dict[str, Any] = {
            "protocolVersion": client.protocol_version,
            "capabilities": client.advertised,
            "serverInfo": {"name": "aggregator", "version": __version__},
            "_meta": {INSTANCE_KEY: self.instance},
        }
        instructions = self.merged_instructions()
        if instructions:
            result["instructions"] = instructions
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": result})]

    def adopt(
        self, client: ClientState, protocol_version: str, capabilities: dict[str, Any], client_info: dict[str, Any]
    ) -> None:
        """A session initialized elsewhere (another replica, or before a restart) taken
        over as its handshake left it: initialized, with what its client declared then, and
        the proxy's capabilities as they are here now (no list it was given is stale: it
        lists again on the list_changed notices it gets from here on)."""
        client.initialize_seen = client.initialized = True
        client.protocol_version = protocol_version
        client.capabilities = capabilities
        client.client_info = client_info
        client.advertised = self.merged_capabilities()
        client.announced_upto = self.announcements.count

    def asked_by_itself(self, params: dict[str, Any]) -> bool:
        """Whether an initialize names this very proxy: in the experimental capabilities
        (the proxy's own legacy handshake) or in ``_meta`` (as a modern request would)."""
        meta, capabilities = params.get("_meta"), params.get("capabilities")
        if type(meta) is dict and meta.get(INSTANCE_KEY) == self.instance:
            return True
        experimental = capabilities.get("experimental") if type(capabilities) is dict else None
        mark = experimental.get(INSTANCE_KEY) if type(experimental) is dict else None
        return type(mark) is dict and mark.get("instance") == self.instance

    def log_levels(self, clients: Iterable[ClientState]) -> list[tuple[str, str]]:
        """(link, level) for every ready legacy upstream that logs and must be set to the most
        verbose level any client asked for; each is taken as set from now on."""
        target = most_verbose([c.log_level for c in clients if c.log_level is not None])
        if target is None:
            return []
        changes = []
        for name, link in self.links.items():
            if link.ready and link.speaks is LEGACY_ERA and "logging" in link.capabilities and link.log_level != target:
                link.log_level = target
                changes.append((name, target))
        return changes

    def merged_capabilities(self, *, modern: bool = False) -> dict[str, Any]:
        """What the proxy serves, merged over its shared servers: for initialize, or for
        server/discover (``modern``), where 2025-11-25 tasks have no place and the tasks
        extension is declared when a modern server declares it (``core.requests.tasks``)."""
        shared = [link for link in self.links.values() if link.session is None]
        ready = [link for link in shared if link.ready]
        waiting = len(ready) < len(shared)
        capabilities: dict[str, Any] = {}
        for kind in (TOOLS, PROMPTS, RESOURCES):
            name = CAPABILITY_OF[kind]
            # Servers still starting may bring any kind: advertise it, announce it later.
            if waiting or any(name in link.capabilities for link in ready):
                capabilities[name] = {"listChanged": True}
        if "resources" in capabilities and any(
            (link.capabilities.get("resources") or {}).get("subscribe") for link in ready
        ):
            capabilities["resources"]["subscribe"] = True
        if any("completions" in link.capabilities for link in ready):
            capabilities["completions"] = {}
        # Always: every server's log lines are forwarded, declared or not (``core.records.log_levels``).
        capabilities["logging"] = {}
        if modern:
            if any(link.speaks is MODERN_ERA and declares_tasks(link.capabilities) for link in ready):
                capabilities["extensions"] = {TASKS_EXTENSION: {}}
            return capabilities
        tasks: dict[str, Any] = {}
        for link in ready:
            upstream_tasks = link.capabilities.get("tasks")
            if type(upstream_tasks) is dict:
                _merge_into(tasks, upstream_tasks)
        if tasks:
            capabilities["tasks"] = tasks
        return capabilities

    def upstream_client_capabilities(self) -> dict[str, Any]:
        """What the proxy declares to upstreams: what it can route to a client."""
        capabilities: dict[str, Any] = {}
        if "sampling" in self.server_requests:
            capabilities["sampling"] = {}
        if "elicitation" in self.server_requests:
            capabilities["elicitation"] = {"form": {}, "url": {}}
        if "roots" in self.server_requests:
            capabilities["roots"] = {"listChanged": True}
        return capabilities

    def merged_instructions(self) -> str:
        """Each ready server's instructions, once: a per-session server's come from its shared
        listing connection, never from one session's own connection (which another session
        must not even learn of)."""
        parts = []
        for link in self.links.values():
            if link.ready and link.instructions and link.session is None:
                head = f"## Server {link.name}"
                if link.prefix:
                    head += f" (its tools and prompts are prefixed {link.prefix}{self.separator})"
                parts.append(f"{head}\n{link.instructions.strip()}")
        return "\n\n".join(parts)


def _merge_into(target: dict[str, Any], source: dict[str, Any]) -> None:
    for key, value in source.items():
        if type(value) is dict and type(target.get(key)) is dict:
            _merge_into(target[key], value)
        elif key not in target:
            target[key] = value

"""What the admin paths report: health, readiness, and the status snapshot.

``health`` says the process serves; ``readiness`` whether enough configured servers are
ready (``proxy.min_ready``, all enabled servers by default), a configured shared store
(``[cluster] store``) is up and the proxy is not draining; ``snapshot`` is everything the
status page (``/status``, ``/status.json``) and ``aggregator status`` show: the shared store
(its address without the password, up or down, its last error and round trip), each
server's state, last error, stderr tail, uptime and restarts; the sessions (a 2026-07-28
request without a session is none); the recent warnings and errors; the catalog of each
profile with the rule that hid each hidden item (the view ``aggregator tools --explain``
prints).

Everything here is read from the hub at the moment of the call and returned as plain
JSON-ready values; nothing is changed. What it shows of a server was masked where it was
recorded (its error, its stderr): no secret reaches a page or a terminal through here.
"""

from __future__ import annotations

import time
from typing import Any

from aggregator import __version__
from aggregator.config.upstream_auth import acts_as_users
from aggregator.fronts.authorization import who
from aggregator.hub.hub import Hub
from aggregator.mcp.constants import KINDS
from aggregator.ops.catalog_view import catalog_view

# The state shown for a server acting as each user: it has no shared connection to be
# ready or down, only each session's own.
PER_USER_STATE = "per user"

# The transport of a client session, by the class of the hub's sink for it.
_TRANSPORTS = {
    "Outbox": "stdio",
    "HttpSession": "streamable-http",
    "LegacySession": "sse",
    "WebSocketSink": "websocket",
}


STOPPED = ("lazy", "idle-stopped")  # a server's states when it is stopped on purpose


def health(hub: Hub) -> dict[str, Any]:
    """The process serves (whatever its servers do)."""
    return {"status": "ok", "version": __version__, "uptime": round(time.monotonic() - hub.started_at, 3)}


def readiness(hub: Hub) -> tuple[bool, dict[str, Any]]:
    """Whether to send clients here, and why: at least ``proxy.min_ready`` enabled servers
    (all, by default) are ready, startup is over and the proxy is not draining. A shared
    store that is down makes the replica "degraded", still ready: the store is the same for
    every replica, so failing them all would stop the calls that do not need it too. A server
    acting as each user is not waited for: it is connected per session, as a user, and
    shown as "per user" with its sessions connected."""
    servers: dict[str, dict[str, Any]] = {}
    per_user: dict[str, dict[str, Any]] = {}
    for server in hub.config.enabled_servers:
        if acts_as_users(server):
            per_user[server.name] = {"state": PER_USER_STATE, "sessions": sessions_connected(hub, server.name)}
            continue
        upstream = hub.upstreams.get(server.name)
        state = upstream.state if upstream is not None else "starting"
        servers[server.name] = {"state": state, "last_error": upstream.last_error if upstream is not None else None}
    # A server stopped on purpose (lazy, idle-stopped) serves its catalog and starts on demand.
    ready_count = sum(1 for about in servers.values() if about["state"] in ("ready", *STOPPED))
    needed = hub.config.proxy.min_ready
    if needed is None:
        needed = len(servers)
    draining = hub.draining
    store = hub.store.status()
    store_down = hub.config.cluster.store is not None and not store.up
    ready = ready_count >= needed and not draining and hub.startup_done.is_set()
    body: dict[str, Any] = {
        "status": "draining" if draining else ("not ready" if not ready else "degraded" if store_down else "ready"),
        "ready": ready_count,
        "needed": needed,
        "configured": len(servers),
        "draining": draining,
        "servers": {**servers, **per_user},
    }
    if hub.config.cluster.store is not None:
        body["store"] = store.as_json()
    if store_down:
        body["reason"] = f"the shared store {store.address} is down: {store.last_error or 'not connected yet'}"
    return ready, body


def sessions_connected(hub: Hub, server: str) -> int:
    """How many client sessions have their own connection to ``server`` serving now."""
    return sum(
        1 for u in list(hub.upstreams.values()) if u.per_session and u.config.name == server and u.state == "ready"
    )


def snapshot(hub: Hub) -> dict[str, Any]:
    """Everything the status page shows, as JSON-ready values."""
    now = time.monotonic()
    ready, readyz = readiness(hub)
    context = hub.router.context_report()
    return {
        "version": __version__,
        "uptime": round(now - hub.started_at, 3),
        "ready": ready,
        "readiness": {key: value for key, value in readyz.items() if key != "servers"},
        "draining": hub.draining,
        "servers": _servers(hub, now),
        "store": hub.store.status().as_json(),
        "sessions": _sessions(hub, now),
        "errors": hub.recent_errors.snapshot(),
        "catalog": {profile: _catalog(hub, profile, context) for profile in ["default", *hub.config.profiles]},
    }


def _servers(hub: Hub, now: float) -> list[dict[str, Any]]:
    rows = []
    for name, upstream in sorted(hub.upstreams.items()):
        config = upstream.config
        era = hub.router.server_era(name)
        rows.append(
            {
                "name": name,
                "state": upstream.state,
                "pid": upstream.pid,
                "transport": config.effective_transport,
                "isolation": "per-session" if upstream.per_session else "shared",
                "era": era[0] if era else None,
                "protocol": era[1] if era else None,
                "uptime": None if upstream.ready_since is None else round(now - upstream.ready_since, 3),
                "restarts": upstream.restarts,
                "last_start": None if upstream.last_start is None else round(upstream.last_start, 3),
                "last_error": upstream.last_error,
                "last_error_at": upstream.last_error_at,  # seconds since the epoch
                "stderr": upstream.stderr_tail(),
                "items": {kind: len(hub.catalog.items_of(name, kind)) for kind in KINDS},
            }
        )
    for name, config in sorted(hub.config.servers.items()):
        if not config.enabled:
            rows.append({"name": name, "state": "disabled", "transport": config.effective_transport})
        elif acts_as_users(config):  # no shared connection: one per session, as its user
            rows.append(
                {
                    "name": name,
                    "state": PER_USER_STATE,
                    "transport": config.effective_transport,
                    "isolation": "per-session",
                    "auth": config.auth,
                    "sessions": sessions_connected(hub, name),
                }
            )
    return rows


def _sessions(hub: Hub, now: float) -> list[dict[str, Any]]:
    """The client sessions (``Hub.sessions``: a stateless HTTP request's client is none)."""
    rows = []
    for key, sink, info in hub.sessions():
        since = hub.client_since.get(key, now)
        row = {
            "id": key,
            "transport": _TRANSPORTS.get(type(sink).__name__, type(sink).__name__),
            "profile": info.profile if info is not None else None,
            "protocol": info.protocol_version if info is not None else None,
            "in_flight": info.in_flight if info is not None else 0,
            "age": round(now - since, 3),
        }
        if info is not None and info.principal is not None:
            row["principal"] = who(info.principal)  # an access token's subject, a static token's index
        rows.append(row)
    return rows


def _catalog(hub: Hub, profile: str, context: dict[str, Any]) -> dict[str, Any]:
    """A profile's exposed items (name, server, original name) and its hidden ones, each
    with the rule that hid it."""
    view = catalog_view(hub.router.profile_catalog(profile))
    exposed = {
        kind: [{"name": row["name"], "server": row["server"], "original": row["original"]} for row in view[kind]]
        for kind in KINDS
    }
    return {"exposed": exposed, "hidden": view["hidden"], "discovery": context[profile]}

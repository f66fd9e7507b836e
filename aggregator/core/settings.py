"""What the core is told of the configuration: small frozen settings. Sans-IO.

The router never reads configuration objects: the trio layer builds these from its
``Config`` in one place (``aggregator.config.core_settings``), and the core's tests build
them directly. Every default comes from ``aggregator.core.defaults``, so a router built
with no settings behaves like one built from the default configuration.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from aggregator.core import defaults

# Allow or deny a server-to-client request: (server, method, params) -> bool. The policy
# layer plugs in here; the default allows everything the client declared.
ServerRequestPolicy = Callable[[str, str, dict[str, Any]], bool]

MODES = ("all", "search", "auto")  # discovery modes (``core.catalogs.discovery``)


@attrs.frozen(kw_only=True)
class Discovery:
    """One profile's discovery settings (``core.catalogs.discovery``; ``[proxy.discovery]`` and
    ``[profiles.NAME.discovery]``)."""

    mode: str = "all"  # one of MODES (checked at load)
    budget_tokens: int = 8000
    max_result_tokens: int = 0  # 0: results are never cut (``core.catalogs.result_budget``)
    keep_results_for: float = 600.0  # seconds the rest of a cut result stays readable


_ALL = Discovery()  # the built-in settings: every tool listed, no result cut


def discovery_of(table: Mapping[str, Discovery], profile: str) -> Discovery:
    """A profile's settings in ``table``: its own, else the default profile's, else the built-in ones."""
    return table.get(profile) or table.get("default") or _ALL


KEY_ID_BYTES = 4  # a key id, as bytes; as text, 6 base64url characters


@attrs.frozen
class SigningKeys:
    """The keys of one purpose (request states, cursors): ``(key id, key)`` pairs, the
    FIRST signs and every one verifies the values that carry its id, so that verifying
    never tries every key (``aggregator.cluster.keys`` derives them from ``[cluster] keys``).
    A value whose id names no key here (forged, or signed with a key since removed) is
    refused exactly as a forged one."""

    keys: tuple[tuple[bytes, bytes], ...] = attrs.field(repr=False)

    @classmethod
    def fresh(cls) -> SigningKeys:
        """One key made up for this process alone (no ``[cluster] keys``)."""
        return cls(((os.urandom(KEY_ID_BYTES), os.urandom(32)),))

    @classmethod
    def of(cls, key: SigningKeys | bytes | None) -> SigningKeys:
        """``key`` as signing keys: as it is, one key (its id made of it), or a fresh one."""
        if isinstance(key, SigningKeys):
            return key
        if key is None:
            return cls.fresh()
        return cls(((key[:KEY_ID_BYTES].ljust(KEY_ID_BYTES, b"\0"), key),))

    @property
    def signing(self) -> tuple[bytes, bytes]:
        """(key id, key) of the key that signs."""
        return self.keys[0]

    def verifying(self, key_id: bytes) -> bytes | None:
        """The key whose id is ``key_id``, None if none is."""
        for kid, key in self.keys:
            if kid == key_id:
                return key
        return None


def key_id_text(key_id: bytes) -> str:
    """A key id as text (6 base64url characters)."""
    return base64.urlsafe_b64encode(key_id).decode().rstrip("=")


def key_id_of(text: str) -> bytes | None:
    """The key id ``text`` writes; None when it cannot be one."""
    if len(text) != 6 or not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except ValueError:
        return None
    return raw if len(raw) == KEY_ID_BYTES and key_id_text(raw) == text else None


@attrs.frozen
class LinkSettings:
    """One configured server, as the router sees it."""

    name: str
    # "shared": one connection for all clients; "per-session": one per client session.
    isolation: Literal["shared", "per-session"] = "shared"
    request_timeout: float = defaults.REQUEST_TIMEOUT
    max_request_timeout: float = defaults.MAX_REQUEST_TIMEOUT
    timeout_resets_on_progress: bool = defaults.TIMEOUT_RESETS_ON_PROGRESS
    # Its protocol era: "auto" (probe with ``server/discover``, else ``initialize``) or a
    # revision that pins it (``aggregator.mcp.versions``).
    protocol: str = "auto"
    discover_timeout: float = defaults.DISCOVER_TIMEOUT
    # It acts as each user (``auth = "oauth"`` or ``"token-exchange"``): per-session, never
    # connected without a user, so what a session sees of it comes from its own connection,
    # which a list waits for at most ``init_timeout`` seconds (``core.upstreams.own_listings``).
    per_user: bool = False
    # Its user grants it access at a link (``auth = "oauth"``; not a token exchange).
    grants: bool = False
    init_timeout: float = defaults.INIT_TIMEOUT
    # A shared server nobody used for this many seconds is stopped (``core.upstreams.idle_stops``); 0: never.
    idle_stop_after: float = 0.0


@attrs.frozen(kw_only=True)
class RouterSettings:
    """The servers and the router-wide rules."""

    servers: tuple[LinkSettings, ...] = ()
    # Server-to-client requests routed to clients (capabilities: sampling, elicitation, roots).
    server_requests: tuple[str, ...] = defaults.SERVER_REQUESTS
    # The roots (URIs) shared servers see, and per-session ones whose client has none.
    roots: tuple[str, ...] | None = None
    list_changed_debounce: float = defaults.LIST_CHANGED_DEBOUNCE
    max_in_flight: int = defaults.MAX_IN_FLIGHT_PER_SESSION
    # How long a call that asked a modern client for input waits for its retry.
    input_required_timeout: float = defaults.INPUT_REQUIRED_TIMEOUT
    # How many such calls may wait at once, in all and per principal.
    max_parked_calls: int = defaults.MAX_PARKED_CALLS
    max_parked_per_principal: int = defaults.MAX_PARKED_PER_PRINCIPAL
    max_json_depth: int = defaults.MAX_JSON_DEPTH
    # Each profile's discovery settings ("default" too); a profile not named: "default"'s.
    discovery: Mapping[str, Discovery] = attrs.field(factory=dict)
    # The proxy can only ever have one client (stdio, no network front): shared servers
    # see that client's roots.
    single_client: bool = False
    # What signs the requestState of parked calls (None: a key made for this process) and
    # the name of this replica, which that state carries ([cluster]; "": none given).
    request_state_keys: SigningKeys | None = None
    replica: str = ""
    # The replica named in the ids of server-to-client requests, so that a client's answer
    # that reaches another replica finds its way back here ([cluster] keys; "": numbers).
    reverse_replica: str = ""
    # Whether the rests of cut results are written to the shared store and read back from it
    # on a miss, so that every replica serves them ([cluster] keys and store).
    share_kept_results: bool = False

"""The defaults the core and the configuration share. Sans-IO.

``ServerConfig`` and ``ProxyConfig`` take their defaults from here, and so do the
``Router`` and ``UpstreamLink`` when built without them (as the core's tests build
them): a router built from the default configuration and one built with no settings at
all behave alike. Change a default here, and the documentation (docs/) where it says it.
"""

from __future__ import annotations

from aggregator.jsonrpc.codec import DEFAULT_MAX_DEPTH
from aggregator.mcp.constants import SERVER_REQUEST_CAPABILITIES

# A request without an answer after REQUEST_TIMEOUT fails (reason "timeout"); progress
# notifications extend it when TIMEOUT_RESETS_ON_PROGRESS, never past MAX_REQUEST_TIMEOUT.
REQUEST_TIMEOUT = 60.0
MAX_REQUEST_TIMEOUT = 600.0
# How long an upstream's ``server/discover`` probe waits before the server is taken for a
# legacy one (``initialize`` follows on the same connection).
DISCOVER_TIMEOUT = 5.0
# How long a server has to finish its handshake and first listing.
INIT_TIMEOUT = 10.0
TIMEOUT_RESETS_ON_PROGRESS = True
# Requests one client session may have in flight; more are refused (reason overloaded).
MAX_IN_FLIGHT_PER_SESSION = 128
# Several list changes within this many seconds reach clients as one notification.
LIST_CHANGED_DEBOUNCE = 0.05
# A legacy server's call waiting for a modern client's input (an input_required answer):
# if the client does not retry within this many seconds, the call is cancelled upstream.
INPUT_REQUIRED_TIMEOUT = 60.0
# Such calls parked at once, in all and per principal (bearer token); past either the
# server's request is refused and the call fails (reason overloaded).
MAX_PARKED_CALLS = 256
MAX_PARKED_PER_PRINCIPAL = 64
# Server-to-client requests the proxy routes to clients (and so declares upstream).
SERVER_REQUESTS = SERVER_REQUEST_CAPABILITIES  # all of them
# Deepest JSON nesting accepted in a message, either direction (the envelope is level 1).
MAX_JSON_DEPTH = DEFAULT_MAX_DEPTH

"""The names of the modern (2026-07-28) protocol the proxy's rules are written in. Sans-IO.

Each written once: the ``_meta`` keys every modern request and result carries, the error
codes the revision adds, the methods a modern client may call and the ones it removed,
the results that carry cache hints, and the multi round-trip vocabulary. The core, the
fronts and the upstream sessions import these rather than spelling the names again.
"""

from __future__ import annotations

from typing import Any

from aggregator.jsonrpc.errors import error_response
from aggregator.mcp.versions import ALL_VERSIONS, DISCOVER

# --- _meta keys ---------------------------------------------------------------------------

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"  # every request (MUST)
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"  # every request (MUST)
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"  # every request (SHOULD)
LOG_LEVEL = "io.modelcontextprotocol/logLevel"  # a request that wants notifications/message
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"  # on what a listen stream carries
SERVER_INFO = "io.modelcontextprotocol/serverInfo"  # on results (SHOULD)
# The keys of a modern request's envelope: the caller's own, never forwarded as they are.
ENVELOPE = frozenset((PROTOCOL_VERSION, CLIENT_CAPABILITIES, CLIENT_INFO, LOG_LEVEL))

# --- error codes the revision adds ----------------------------------------------------------

HEADER_MISMATCH = -32020  # an HTTP header disagrees with the body, or is missing or invalid
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021  # data.requiredCapabilities
UNSUPPORTED_PROTOCOL_VERSION = -32022  # data.supported, data.requested
# The codes that tell a dual-era client it is talking to a modern server.
MODERN_ERRORS = frozenset((HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION))

# --- methods ------------------------------------------------------------------------------

LISTEN = "subscriptions/listen"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
# Every request a modern client may send (ClientRequest of the 2026-07-28 schema).
CLIENT_REQUESTS = frozenset(
    (
        DISCOVER,
        "completion/complete",
        "prompts/get",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        LISTEN,
        "tools/call",
        "tools/list",
    )
)
# Legacy requests the revision removed: a modern request naming one is method-not-found.
REMOVED_REQUESTS = frozenset(("initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"))
# The requests whose result may be ``input_required`` (a multi round-trip request).
INPUT_REQUIRED_METHODS = frozenset(("tools/call", "prompts/get", "resources/read"))
# The results that carry ``ttlMs`` and ``cacheScope``.
CACHEABLE = frozenset(
    (DISCOVER, "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read")
)

# --- results ------------------------------------------------------------------------------

RESULT_TYPE = "resultType"
COMPLETE = "complete"
INPUT_REQUIRED = "input_required"
INPUT_REQUESTS = "inputRequests"  # of an input_required result: id -> a server request
INPUT_RESPONSES = "inputResponses"  # of the retry: id -> the client's answer
REQUEST_STATE = "requestState"  # opaque, echoed byte for byte by the retry
TTL = "ttlMs"
CACHE_SCOPE = "cacheScope"
PUBLIC = "public"
PRIVATE = "private"

# --- extensions ---------------------------------------------------------------------------

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# Its requests, each naming a task by ``params.taskId`` (also its ``Mcp-Name`` on HTTP); a
# caller that did not declare the extension is answered -32021. ``tasks/result`` and
# ``tasks/list`` (2025-11-25) are not among them: removed, so method-not-found.
TASK_REQUESTS = frozenset(("tasks/get", "tasks/update", "tasks/cancel"))
TASK_ID = "taskId"
TASK = "task"  # the resultType of a task handle (a tools/call answered by a task)


def declares_tasks(capabilities: Any) -> bool:
    """Whether client or server ``capabilities`` declare the tasks extension."""
    extensions = capabilities.get("extensions") if type(capabilities) is dict else None
    return type(extensions) is dict and TASKS_EXTENSION in extensions


def tasks_required(id: Any, message: str) -> dict[str, Any]:
    """The error for a tasks request the extension was not negotiated for (-32021)."""
    data: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    return error_response(id, MISSING_REQUIRED_CLIENT_CAPABILITY, message, data)


def request_meta(message: dict[str, Any]) -> dict[str, Any] | None:
    """A request's ``params._meta`` if it names a protocol version (the mark of a modern
    request), else None: a request without one is legacy, or a modern one missing its
    ``_meta`` (which a modern-only connection refuses with -32602)."""
    params = message.get("params")
    if type(params) is not dict:
        return None
    meta = params.get("_meta")
    if type(meta) is not dict or PROTOCOL_VERSION not in meta:
        return None
    return meta


def unsupported_version(id: Any, requested: object) -> dict[str, Any]:
    """The error for a request naming a revision the proxy does not speak."""
    shown = requested if type(requested) is str else repr(requested)
    return error_response(
        id,
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version {shown[:40]!r} (supported: {', '.join(ALL_VERSIONS)})",
        {"supported": list(ALL_VERSIONS), "requested": echoed(requested)},
    )


ECHO_LIMIT = 256  # characters of a refused value an error's data gives back


def echoed(value: object) -> object:
    """A refused value as an error's ``data`` gives it back: itself when short, else its
    first ``ECHO_LIMIT`` characters (a string; a long list or object as its repr)."""
    if type(value) is str:
        return value if len(value) <= ECHO_LIMIT else value[:ECHO_LIMIT]
    if value is None or type(value) in (bool, int, float):  # (the JSON reader keeps integers to 64 bits)
        return value
    shown = repr(value)
    return value if len(shown) <= ECHO_LIMIT else shown[:ECHO_LIMIT]

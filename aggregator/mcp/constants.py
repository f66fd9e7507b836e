"""The MCP names the proxy's rules are written in, each written once. Sans-IO.

The four kinds of listed item and, per kind, its list method, the capability that says a
server has it, the notification that says its list changed, the field of an item the
proxy rewrites and the key of its rules in the configuration; and the server-to-client
requests the proxy routes, with the client capability each needs. The core, the
configuration, the upstream sessions and the command line import these tables rather than
spelling the names again.
"""

from __future__ import annotations

# --- listed items -------------------------------------------------------------------------

TOOLS = "tools"
PROMPTS = "prompts"
RESOURCES = "resources"
TEMPLATES = "resourceTemplates"  # the key of the result of resources/templates/list
KINDS = (TOOLS, PROMPTS, RESOURCES, TEMPLATES)

# The method that lists each kind, and the other way round.
LIST_METHOD_OF = {
    TOOLS: "tools/list",
    PROMPTS: "prompts/list",
    RESOURCES: "resources/list",
    TEMPLATES: "resources/templates/list",
}
LIST_METHODS = {method: kind for kind, method in LIST_METHOD_OF.items()}
# The capability that says a server has each kind (templates come with resources).
CAPABILITY_OF = {TOOLS: "tools", PROMPTS: "prompts", RESOURCES: "resources", TEMPLATES: "resources"}
# The notification that says a kind's list changed (one for resources and templates).
LIST_CHANGED = {kind: f"notifications/{CAPABILITY_OF[kind]}/list_changed" for kind in KINDS}
# The field of an item that the proxy rewrites, per kind.
KEY_OF = {TOOLS: "name", PROMPTS: "name", RESOURCES: "uri", TEMPLATES: "uriTemplate"}
# The key of each kind's rules in the configuration ([servers.X.templates], ...), which is
# also how the command line labels the kind.
CONFIG_KIND = {TOOLS: "tools", PROMPTS: "prompts", RESOURCES: "resources", TEMPLATES: "templates"}

# --- server-to-client requests ------------------------------------------------------------

# The server-to-client requests the proxy routes, and the client capability each needs.
SERVER_REQUESTS = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
# Those capabilities, as the configuration names them (proxy.server_requests and
# servers.X.server_requests).
SERVER_REQUEST_CAPABILITIES = tuple(SERVER_REQUESTS.values())

# --- methods the proxy's rules name outside a handler table ----------------------------

INITIALIZE = "initialize"
INITIALIZED = "notifications/initialized"
PING = "ping"
CANCELLED = "notifications/cancelled"
ROOTS_LIST_CHANGED = "notifications/roots/list_changed"
# The requests that name one tool, prompt or resource: the ones plugins' request hooks see
# and whose target the router describes to them.
TARGETED_METHODS = ("tools/call", "prompts/get", "resources/read", "resources/subscribe", "completion/complete")

# The error that says a request cannot go on until the user has completed the URL-mode
# elicitations in its data.elicitations (2025-11-25 only).
URL_ELICITATION_REQUIRED = -32042

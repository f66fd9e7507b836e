"""Tool discovery per profile: every tool listed, or two tools to find and call them. Sans-IO.

A profile's ``discovery.mode`` says what its clients' ``tools/list`` holds:

- ``all``: every tool of the profile's catalog (the proxy's behaviour without this);
- ``search``: exactly two tools, ``find_tools`` (a query in, the best matching tools of
  the caller's catalog out, each as ``tools/list`` shows it) and ``call_tool`` (a tool's
  exposed name and arguments in, exactly what calling that tool directly gives out);
- ``auto``: ``all`` while the whole list fits in ``budget_tokens`` (``core.catalogs.tokens``),
  ``search`` past it; decided again whenever the catalog changes.

Whatever the mode, every tool of the caller's catalog stays callable by its exposed name:
policy decides what a client may call, discovery only what it is shown. ``call_tool`` is
unwrapped into the call it names before plugins, policy or the router look at it
(``unwrap_call_tool``), so audit, rate limits, pinning and errors are those of a direct
call. In search mode the two names are the proxy's: a server tool exposed under either
is reached through ``call_tool``, whose ``name`` always means a tool of the catalog.
"""

from __future__ import annotations

import secrets
from typing import Any

from aggregator.core.catalogs.catalog import Catalog, Route
from aggregator.core.catalogs.result_budget import ResultBudgets
from aggregator.core.catalogs.tokens import tokens_of, tools_list_tokens
from aggregator.core.catalogs.tool_search import ToolIndex
from aggregator.core.commands import Command, ToClient
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.settings import Discovery, discovery_of
from aggregator.jsonrpc.codec import dumps
from aggregator.mcp.constants import TOOLS

FIND_TOOLS = "find_tools"
CALL_TOOL = "call_tool"
# The names of the proxy's two tools: a call that names neither is none of search mode's
# business, which a caller can tell by reading the name, before calling in here.
SEARCH_TOOLS = (FIND_TOOLS, CALL_TOOL)
DEFAULT_LIMIT = 5
MAX_LIMIT = 50
MAX_QUERY_CHARS = 1000
# Marks a client request made from a ``call_tool`` call (never sent on): a value no client
# can know, so a client cannot mark a request of its own.
UNWRAPPED = "aggregator/unwrapped"
_MARK = secrets.token_hex(16)


_TOOL_ITEM = {
    "type": "object",
    "description": "A tool as tools/list shows it: name, description, inputSchema (and title, annotations, ...).",
}
META_TOOLS: list[dict[str, Any]] = [
    {
        "name": FIND_TOOLS,
        "title": "Find tools",
        "description": (
            "Search the tools available here by what you want to do, in a few words (for example "
            '"show the git history" or "read a file"). Returns the best matching tools with their '
            "input schemas. Call one with call_tool, or directly by its name."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you want to do, in a few words."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    "default": DEFAULT_LIMIT,
                    "description": "How many tools to return at most.",
                },
            },
            "required": ["query"],
        },
        "outputSchema": {
            "type": "object",
            "properties": {"tools": {"type": "array", "items": _TOOL_ITEM}},
            "required": ["tools"],
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
    {
        "name": CALL_TOOL,
        "title": "Call a tool",
        "description": (
            "Call a tool that find_tools returned, by its name, with arguments that match its input "
            "schema. Returns exactly what the tool returns."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The tool's name, as find_tools gave it."},
                "arguments": {"type": "object", "description": "The tool's arguments."},
            },
            "required": ["name"],
        },
    },
]
META_PAGE = dumps({TOOLS: META_TOOLS})  # the tools/list result in search mode
SEARCH_LIST_TOKENS = tools_list_tokens(META_TOOLS)


class _Cache:
    """What one catalog's searches reuse until it changes: its size in tokens, its index."""

    __slots__ = ("tokens_key", "tokens", "index_key", "index")

    def __init__(self) -> None:
        self.tokens_key: Any = None
        self.tokens = 0
        self.index_key: Any = None
        self.index: ToolIndex | None = None


def _cache(catalog: Any) -> _Cache:
    cache: _Cache | None = catalog.search_cache
    if cache is None:
        cache = catalog.search_cache = _Cache()
    return cache


def _generation(catalog: Any) -> Any:
    """What changes whenever what ``catalog`` shows changes (a session's view: its own, or
    its profile's catalog's)."""
    shared = getattr(catalog, "shared", None)
    return catalog.generation if shared is None else (catalog.generation, shared.generation)


def catalog_tokens(catalog: Any) -> int:
    """The estimated tokens of ``catalog``'s whole tools/list (cached per generation)."""
    cache = _cache(catalog)
    generation = _generation(catalog)
    if cache.tokens_key != generation:
        cache.tokens = tools_list_tokens(catalog.visible(TOOLS))
        cache.tokens_key = generation
    return cache.tokens


def lists_all(discovery: Discovery, catalog: Any) -> bool:
    """Whether clients of these settings get every tool listed (else the two search tools)."""
    if discovery.mode == "all":
        return True
    if discovery.mode == "search":
        return False
    # (never the search listing when it is the larger one)
    return catalog_tokens(catalog) <= max(discovery.budget_tokens, SEARCH_LIST_TOKENS)


def _tool_error(id: Any, key: int, text: str) -> ToClient:
    return _answer(key, id, {"content": [{"type": "text", "text": text}], "isError": True})


def _answer(key: int, id: Any, result: dict[str, Any]) -> ToClient:
    return ToClient(key, {"jsonrpc": "2.0", "id": id, "result": result})


class Search:
    """The two search-mode tools, and the choice of mode per client, by each profile's
    discovery settings (which it owns: a reload renews them here)."""

    def __init__(
        self,
        discovery: dict[str, Discovery],
        clients: dict[int, ClientState],
        catalogs: dict[str, Catalog],
        links: dict[str, UpstreamLink],
        budgets: ResultBudgets,
    ) -> None:
        self.discovery = discovery  # profile -> its settings
        self.clients = clients
        self.catalogs = catalogs
        self.links = links  # their instructions describe their tools to the search
        self.budgets = budgets  # which cut results by the same settings

    def discovery_of(self, profile: str) -> Discovery:
        return discovery_of(self.discovery, profile)

    def renew(self, discovery: dict[str, Discovery]) -> list[str]:
        """New discovery settings (a reload): the profiles whose clients now see another
        tools/list (theirs to be told so, by the announcements)."""
        old, self.discovery = self.discovery, dict(discovery)
        self.budgets.renew(self.discovery)
        return [
            profile
            for profile, catalog in self.catalogs.items()
            if lists_all(self.discovery_of(profile), catalog) != lists_all(discovery_of(old, profile), catalog)
        ]

    def context_report(self) -> dict[str, dict[str, Any]]:
        """Per profile: its discovery mode, what tools/list holds now ("all" or "search"),
        and the estimated tokens of every tool's listing and of the search listing."""
        report = {}
        for profile, catalog in self.catalogs.items():
            discovery = self.discovery_of(profile)
            report[profile] = {
                "mode": discovery.mode,
                "lists": "all" if lists_all(discovery, catalog) else "search",
                "tools": len(catalog.visible(TOOLS)),
                "tools_list_tokens": catalog_tokens(catalog),
                "search_list_tokens": SEARCH_LIST_TOKENS,
                "budget_tokens": discovery.budget_tokens,
                "max_result_tokens": discovery.max_result_tokens,
                "keep_results_for": discovery.keep_results_for,
            }
        return report

    def searching(self, client: ClientState) -> bool:
        """Whether ``client`` is listed the two search tools (not every tool)."""
        return not lists_all(self.discovery_of(client.profile), client.catalog)

    def meta_on(self, client: ClientState, name: str) -> bool:
        """Whether ``name`` (find_tools, call_tool) is the proxy's tool for this client: in
        search mode; in auto mode also while it lists everything (a model that learnt them
        still finds them), unless a tool of the catalog is exposed under that name."""
        discovery = self.discovery_of(client.profile)
        if discovery.mode == "all":
            return False
        return discovery.mode == "search" or self.searching(client) or client.catalog.tools.get(name) is None

    def unwrap_call_tool(self, key: int, message: dict[str, Any]) -> None:
        """A ``call_tool`` call of a searching client becomes the call it names, in place,
        before anything looks at it, and is marked so (``UNWRAPPED``): the name it carries
        then means the catalog's tool of that name, never the proxy's two (a server tool
        exposed as ``find_tools`` or ``call_tool`` is reached so). One whose arguments name
        no tool is left as it is, and answered with its mistake."""
        params = message.get("params")
        if type(params) is not dict or params.get("name") != CALL_TOOL or message.get(UNWRAPPED) == _MARK:
            return
        client = self.clients.get(key)
        if client is None or not self.meta_on(client, CALL_TOOL):
            return
        inner = params.get("arguments")
        if type(inner) is not dict or type(inner.get("name")) is not str:
            return
        unwrapped = {k: v for k, v in params.items() if k != "arguments"}  # _meta, task: kept
        unwrapped["name"] = inner["name"]
        if "arguments" in inner:
            unwrapped["arguments"] = inner["arguments"]
        message["params"] = unwrapped
        message[UNWRAPPED] = _MARK

    def answers_itself(self, key: int, message: dict[str, Any]) -> bool:
        """Whether a request is one of search mode's own calls (``find_tools``, or a
        ``call_tool`` that names no tool), which the proxy answers: it names no server tool."""
        params = message.get("params")
        client = self.clients.get(key)
        return (
            message.get("method") == "tools/call"
            and message.get(UNWRAPPED) != _MARK
            and type(params) is dict
            and params.get("name") in (FIND_TOOLS, CALL_TOOL)
            and client is not None
            and self.meta_on(client, params["name"])
        )

    def call(self, client: ClientState, message: dict[str, Any]) -> list[Command] | None:
        """A searching client's call of ``find_tools``, or of a ``call_tool`` that names no
        tool: answered here. None for any other call (it goes its way)."""
        if not self.answers_itself(client.key, message):
            return None
        params = message["params"]
        id = message["id"]
        arguments = params.get("arguments")
        if params.get("name") == CALL_TOOL:
            text = "call_tool needs a tool's name (a string) and its arguments (an object)"
            return [_tool_error(id, client.key, text)]
        arguments = arguments if type(arguments) is dict else {}
        query = arguments.get("query")
        limit = arguments.get("limit", DEFAULT_LIMIT)
        if type(limit) is float and limit.is_integer():
            limit = int(limit)  # 5.0 is an integer to JSON Schema
        if type(query) is not str or not query.strip():
            return [_tool_error(id, client.key, "find_tools needs a query: what you want to do, in a few words")]
        if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
            return [_tool_error(id, client.key, f"find_tools: limit must be an integer from 1 to {MAX_LIMIT}")]
        found = self.find_tools(client.catalog, query[:MAX_QUERY_CHARS], limit)
        budget = self.discovery_of(client.profile).max_result_tokens
        while budget and len(found) > 1 and tokens_of({TOOLS: found}) > budget:
            found.pop()  # fewer whole tools rather than a cut list
        result = {TOOLS: found}
        content = [{"type": "text", "text": dumps(result).decode()}]
        return [_answer(client.key, id, {"content": content, "structuredContent": result})]

    def find_tools(self, catalog: Any, query: str, limit: int) -> list[dict[str, Any]]:
        """The best ``limit`` tools of ``catalog`` for ``query``, as tools/list shows them."""
        cache = _cache(catalog)
        about = {name: link.instructions or "" for name, link in self.links.items() if link.session is None}
        key = (_generation(catalog), tuple(about.items()))
        if cache.index is None or cache.index_key != key:
            tools = list(catalog.visible(TOOLS))
            routes = [catalog.tools.get(tool.get("name")) for tool in tools]
            servers = [route.server if isinstance(route, Route) else "" for route in routes]
            cache.index, cache.index_key = ToolIndex(tools, servers, about), key
        index = cache.index
        return [index.tools[i] for i in index.search(query, limit)]

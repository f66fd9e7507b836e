"""What clients see: catalogs, names and URIs, and what a request names. Sans-IO.

Owns the merged catalog per profile (``catalog``, ``naming``, ``uris``, ``cursor``,
``policy``, ``nesting``), each session's own view (``session_catalog``), the lookup of
what a request names (``targets.Targets``), search mode (``discovery``, ``tool_search``,
``tokens``) and result budgets with their kept rests (``result_budget.ResultBudgets``,
``kept_results``).

May import: ``core.clients.clients`` and ``core.upstreams`` records (links, outages),
``core.settings``, ``core.commands``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
Nothing here routes a message.
"""

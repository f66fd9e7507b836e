"""What clients see: catalogs, names and URIs, and what a request names. Sans-IO.

Owns the merged catalog per profile (``catalog``, ``naming``, ``uris``, ``cursor``,
``policy``, ``nesting``), each session's own view (``session_catalog``), the lookup of
what a request names (``targets.Targets``), search mode (``discovery``, ``tool_search``,
``tokens``: a reload's new settings return the profiles whose tools/list changed) and
result budgets with their kept rests (``result_budget.ResultBudgets``, ``kept_results``),
and shared servers ready, lost or out between starts (``outages``: what a name of one
answers meanwhile).

May import: the records (``core.records``), ``core.lifecycle``, ``core.settings``,
``core.commands``, ``core.replies``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
Nothing here routes a message.
"""

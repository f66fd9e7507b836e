"""What clients hear without asking: list_changed notices and subscriptions. Sans-IO.

Owns the resource subscriptions, refcounted across sessions, and modern callers' open
``subscriptions/listen`` requests (``subscriptions``), and the list_changed notices due
with their debounce (``announcements.Announcements``).

May import: ``core.records.clients`` (records), ``core.catalogs.session_catalog``,
``core.lifecycle.upstream_era`` (the ``Era``), ``core.commands`` and ``aggregator.mcp``.
"""

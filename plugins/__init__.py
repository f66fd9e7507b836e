"""Built-in plugins for the aggregator, built only on the public API in aggregator.plugins.

- ``audit-log`` (plugins.audit.AuditLog): one JSON line per answered request.
- ``rate-limit`` (plugins.rate_limit.RateLimit): a token bucket per client and tool.
- ``pin-definitions`` (plugins.pinning.PinDefinitions): quarantine tools whose
  definitions change after they were approved.
- ``example`` (plugins.example.ExamplePlugin): a small plugin to copy.
"""

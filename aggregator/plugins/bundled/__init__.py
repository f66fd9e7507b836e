"""Built-in plugins for the aggregator, built only on the public API in aggregator.plugins.

The config names these plugins by their entry points:

- ``audit-log`` (aggregator.plugins.bundled.audit.AuditLog): one JSON line per answered request.
- ``rate-limit`` (aggregator.plugins.bundled.rate_limit.RateLimit): a token bucket per client and tool.
- ``pin-definitions`` (aggregator.plugins.bundled.pinning.PinDefinitions): quarantine tools whose
  definitions change after they were approved.
- ``example`` (aggregator.plugins.bundled.example.ExamplePlugin): a small plugin to copy.
"""

"""Built-in plugins for the aggregator, built only on the public API in aggregator.plugins.

This folder installs as the package ``aggregator_plugins`` (a name no other distribution
will clash with); the config names these plugins by their entry points:

- ``audit-log`` (aggregator_plugins.audit.AuditLog): one JSON line per answered request.
- ``rate-limit`` (aggregator_plugins.rate_limit.RateLimit): a token bucket per client and tool.
- ``pin-definitions`` (aggregator_plugins.pinning.PinDefinitions): quarantine tools whose
  definitions change after they were approved.
- ``example`` (aggregator_plugins.example.ExamplePlugin): a small plugin to copy.
"""

"""The hub: the top nursery, and the one place the router's commands are carried out.

Owns ``Hub`` (``hub``: supervises upstreams, owns the router, serves clients), the router
it builds from config (``catalogs``), live reload (``reload``), a gentle shutdown
(``draining``), dropping clients past the total memory budget (``shedding``), and writing
once per scheduler turn what many tasks queued (``soon``).

Imports of the project's packages: ``upstreams``, ``plugins``, ``transports``, ``core``,
``config``, ``jsonrpc``, ``errors``; and ``ops`` (metrics, tracing, traffic log, recent
errors, which the hub builds and feeds) and ``fronts`` (``hub`` -> ``fronts.admission``:
the connection and session caps every front shares).
"""

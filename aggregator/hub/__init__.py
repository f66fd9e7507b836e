"""The hub: the top nursery, and the one place the router's commands are carried out.

Owns ``Hub`` (``hub``: supervises upstreams, owns the router, serves clients, reloads),
the router it builds from config (``catalogs``), the drain at shutdown and what it still
admits (``drain``), the servers startup waits for (``startup``), the router's clock
(``clock``), each session's own connections to servers (``session_links``), who each
session acts as upstream (``callers``), reading a reload's file and planning what it
changes (``reload``), the plugins in place and their wiring around the router at start and
by a reload (``plugin_wiring``), dropping clients past the total memory budget
(``shedding``), and writing once per scheduler turn what many tasks queued (``soon``).
Nothing else holds the router: fronts and upstream sessions reach the hub through their
ports (``fronts.port.ClientPort``, ``upstreams.port.UpstreamPort``), the plugin gate through
``plugins.gate.GateHost``.

It also owns the connection and session caps every network front counts against
(``caps``): how many clients the hub takes.

Floor 6 (tests/core/test_layering.py). May import ``upstreams`` (the hub is their
``UpstreamPort``), ``plugins``, ``telemetry`` (metrics, tracing, traffic log, recent
errors, which the hub builds and feeds), ``cluster`` (the shared store, which the hub
opens), ``transports``, ``config``, ``core``, ``mcp``,
``jsonrpc``, ``errors``; never ``fronts`` (which reach the hub through their
``ClientPort``), ``ops`` or ``cli``, which are above it.
"""

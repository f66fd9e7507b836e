"""Plugins: the public plugin API, the gate that runs their hooks around the router, and
finding the plugins a config names. The built-in plugins are in ``plugins.bundled``.

``api`` holds the hook vocabulary and ``Plugins`` (the loaded plugins, their lifecycle),
``gate`` the request, response and notification hooks around the router, ``resolve``
finding a plugin by entry point, module path or file and checking its options.

A plugin imports what it needs from here (``from aggregator.plugins import Deny,
Request``): the names below are the public API; the rest of the package is the proxy's.

Floor 5 (tests/core/test_layering.py). May import ``transports`` (``gate`` ->
``transports.sink``), ``config``, ``core``, ``mcp``, ``jsonrpc``, ``errors``; never the hub,
which is above: the gate reaches it through the ``GateHost`` it is given.
"""

from aggregator.plugins.api import Deny, InvalidOptions, Notification, Request, Response, ServerRequest

__all__ = ["Deny", "InvalidOptions", "Notification", "Request", "Response", "ServerRequest"]

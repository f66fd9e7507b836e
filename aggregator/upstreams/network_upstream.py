"""Upstream servers over the network: Streamable HTTP, legacy HTTP+SSE, WebSocket.

Each connector has the shape of ``run_stdio_server``: it reports a ``Channel`` (lines to
the server through an in-memory pipe, the server's messages back as it decoded them) and
returns why the connection ended. So an upstream session writes the same way whatever the
transport, the router handles every server's messages the same way, and a lost
connection is handled exactly like a crashed child process: pending requests fail at
once, the supervisor reconnects with backoff.

One module per transport (``streamable_http_upstream``, ``sse_upstream``,
``websocket_upstream``); what they share (the link to the session, the HTTP client with
the server's own headers, never a client's) is in ``network_link``.
"""

from aggregator.upstreams.sse_upstream import run_sse_server
from aggregator.upstreams.streamable_http_upstream import run_streamable_http_server
from aggregator.upstreams.websocket_upstream import run_websocket_server

__all__ = ["run_sse_server", "run_streamable_http_server", "run_websocket_server"]

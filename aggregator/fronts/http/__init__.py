"""The HTTP fronts: Streamable HTTP (legacy sessions and modern stateless requests) and
legacy HTTP+SSE, on one listener.

The endpoint (``endpoint``) owns the listener, the routing table and one object per part,
none of which inherits another: the session table (``sessions``), GET streams and
resumption (``streams``), modern stateless requests and their headers (``modern``,
``headers``), one POST's exchange (``exchange``) and the 2024-11-05 HTTP+SSE front
(``legacy_sse``); with ``[cluster]``, what belongs to another replica (``relay``) and the
sessions' state and GET streams in the shared store (``shared_sessions``). Shared by all:
response streams (``queue``) and refusals (``answers``).

Imports of the project's packages: as ``fronts`` (of which it is part).
"""

"""The HTTP fronts: Streamable HTTP (legacy sessions and modern stateless requests) and
legacy HTTP+SSE, on one listener.

Owns the listener and routing table (``endpoint``), one POST's exchange (``exchange``),
modern stateless requests and their headers (``modern``, ``headers``), the session table
(``sessions``), response streams (``queue``), GET streams and resumption (``streams``), and
the 2024-11-05 HTTP+SSE front (``legacy_sse``).

Imports of the project's packages: as ``fronts`` (of which it is part).
"""

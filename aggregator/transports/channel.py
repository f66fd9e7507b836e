"""What an upstream session talks through (``Channel``), whatever the transport, and what
a network server's messages come as (``ServerMessage``).

A stdio server's channel is its pipes (``upstreams.child_process``): the session writes
lines to its stdin, and the router decodes each line of its stdout. A network server's
connection (``upstreams.network_link``) reads each message out of an HTTP body, an event
stream or a WebSocket frame and decodes it there, once, under the same limits; it hands
the session the messages, each with the request it belongs to. What the session writes
reaches that connection through an in-memory pipe, each line with the message it
encodes (``transports.pipe``), so that connection never decodes it again.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from aggregator.jsonrpc.errors import RemoteProtocolError


@attrs.frozen(slots=True)
class ServerMessage:
    """One message from a network server, read by its connection.

    ``decoded``: what ``decode_message`` returned for it, (kind, message), or the
    RemoteProtocolError it raised, which the router answers as it would for a line.
    ``related``: the upstream id of the request on whose own stream it came (a
    Streamable HTTP POST's body or event stream), else None. ``raw``: its bytes as read
    (counted, and described in the traffic log).
    """

    decoded: tuple[int, dict[str, Any]] | RemoteProtocolError
    related: int | None
    raw: bytes


@attrs.frozen
class Channel:
    """What an upstream session talks through: a byte stream to the server, and what
    comes back, either as a byte stream of lines (``receive``: a stdio server's output) or
    as messages already read (``messages``: a network server's); maybe a log.

    ``streams``: what belongs to a request comes on that request's own stream
    (Streamable HTTP), so the router may route by it (``ServerMessage.related``).
    """

    send: trio.abc.SendStream
    receive: trio.abc.ReceiveStream | None = None
    stderr: trio.abc.ReceiveStream | None = None
    pid: int | None = None
    messages: trio.MemoryReceiveChannel[ServerMessage] | None = None
    streams: bool = False

"""What an upstream session talks through (``Channel``: a byte stream each way, maybe a
log), whatever the transport, and the tag that names the request a message came back on.

A stdio server's channel is its pipes (``upstreams.child_process``); a network server's
is an in-memory pipe fed by its connection (``upstreams.network_link``), whose lines may
be tagged.
"""

from __future__ import annotations

import attrs
import trio

# On a tagged channel, a message that arrived on the own stream of a request the proxy sent
# (a Streamable HTTP POST) comes as STREAM_TAG + that request's upstream id + STREAM_TAG +
# the message, so the router knows which request it belongs to without the JSON changing.
STREAM_TAG = b"\x1f"
STREAM_TAG_ROOM = 24  # bytes a tag may add to a line


@attrs.frozen
class Channel:
    """What an upstream session talks through: a byte stream each way, maybe a log.

    ``tagged``: lines it receives may carry a STREAM_TAG prefix (see above).
    """

    send: trio.abc.SendStream
    receive: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream | None = None
    pid: int | None = None
    tagged: bool = False


def split_tag(line: bytes) -> tuple[int | None, bytes]:
    """(the upstream request id a tagged line names, the message); (None, line) if none."""
    end = line.find(STREAM_TAG, 1, STREAM_TAG_ROOM)
    if end < 0 or not line[1:end].isdigit():
        return None, line
    return int(line[1:end]), line[end + 1 :]

"""The proxy's own stdin and stdout, for ``serve --stdio``: the one front that is not a
network listener.
"""

from __future__ import annotations

import os
import sys

import trio


class OwnStdio:
    """The proxy's own stdin/stdout as trio streams.

    stdout is taken for MCP alone: its fd is duplicated for our use and fd 1 is pointed at
    stderr, so a stray print from anywhere in the process can never corrupt the protocol.
    """

    def __init__(self) -> None:
        self._in_fd = os.dup(0)
        self._out_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.receive = trio.lowlevel.FdStream(self._in_fd)
        self.send = trio.lowlevel.FdStream(self._out_fd)

    async def aclose(self) -> None:
        await self.send.aclose()
        await self.receive.aclose()

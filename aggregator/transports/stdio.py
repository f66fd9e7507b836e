"""stdio: child processes for upstream servers, and the proxy's own stdin/stdout.

Children are started without a shell, in their own process group (a new session), with
stdin/stdout as the MCP channel and stderr as a log. Stopping follows the spec's ladder:
close stdin, wait, SIGTERM to the group, wait, SIGKILL to the group; then SIGKILL to
whatever is left of the group, so a server's own children never outlive it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

log = logging.getLogger(__name__)

# What a child inherits from the proxy's environment when its config names no more: what
# programs need to run (find binaries, a home, a locale), never the proxy's secrets.
INHERITED_ENV = (
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "LC_CTYPE",
    "TMPDIR", "TZ", "SYSTEMROOT", "VIRTUAL_ENV", "NODE_PATH", "PYTHONPATH",
)
STOP_GRACE = 2.0


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    env.update(extra)
    return env


def resolve_command(command: str, env: Mapping[str, str]) -> str:
    """Find ``command`` on the child's PATH, then beside the running Python.

    The second place makes servers installed into the same environment as the proxy
    (``pip install mcp-server-time``) work without activating it.
    """
    if os.sep in command:
        return command
    search = os.pathsep.join(
        part for part in (env.get("PATH", ""), os.path.dirname(sys.executable)) if part
    )
    found = shutil.which(command, path=search)
    if found is None:
        raise FileNotFoundError(f"command not found: {command!r} (searched PATH and {os.path.dirname(sys.executable)})")
    return found


async def open_child(
    command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> trio.Process:
    environment = child_environment(env)
    argv = [resolve_command(command, environment), *args]
    return await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
        cwd=cwd,
        start_new_session=True,
    )


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
    return int(line[1:end]), line[end + 1:]


async def run_stdio_server(
    config: Any, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED
) -> str:
    """Start a stdio server, report its Channel, return why it ended.

    Whenever this task ends (the child exited, or the caller was cancelled) the child is
    stopped with the full ladder: no orphans.
    """
    process = await open_child(config.command, config.args, config.env, config.cwd)
    try:
        task_status.started(Channel(process.stdin, process.stdout, process.stderr, process.pid))
        code = await process.wait()
        # Let the reader take what the server wrote just before it exited.
        await trio.sleep(0.05)
        return f"the server exited with status {code}"
    finally:
        await stop_child(process, config.name)


async def stop_child(process: trio.Process, name: str, grace: float = STOP_GRACE) -> None:
    """Close stdin, wait, SIGTERM the group, wait, SIGKILL the group. Never cancelled."""
    with trio.CancelScope(shield=True):
        if process.stdin is not None:
            try:
                await process.stdin.aclose()
            except trio.BrokenResourceError:
                pass
        with trio.move_on_after(grace):
            await process.wait()
        if process.returncode is None:
            log.info("server %s: still running %.0fs after stdin closed; SIGTERM", name, grace)
            _signal_group(process.pid, signal.SIGTERM)
            with trio.move_on_after(grace):
                await process.wait()
        if process.returncode is None:
            log.warning("server %s: ignored SIGTERM; SIGKILL", name)
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()
        # The leader is gone; anything it left in its group goes too.
        _signal_group(process.pid, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


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

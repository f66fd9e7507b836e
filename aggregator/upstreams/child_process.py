"""Child processes for stdio servers: started, tied to the proxy, and stopped. (The proxy's
own stdin and stdout: ``fronts.own_stdio``; what a server connection talks through:
``transports.channel``.)

Children are started without a shell, in their own process group (a new session), with
stdin/stdout as the MCP channel and stderr as a log. Stopping follows the spec's ladder:
close stdin, wait, SIGTERM to the group, wait, SIGKILL to the group; then SIGKILL to
whatever is left of the group, so a server's own children never outlive it.

A proxy that is killed (SIGKILL, the OOM killer) runs no ladder. On Linux every child is
therefore started with the parent-death signal (``PR_SET_PDEATHSIG``, SIGKILL): the kernel
kills it when the proxy dies. The kernel ties that signal to the *thread* that forked the
child, not to its process, and ``trio.lowlevel.open_process`` forks in one of trio's worker
threads, which exit after ten idle seconds (and would take the child with them). So on
Linux children are forked by one thread of our own that lives as long as the process, and
waited for through a pidfd, as trio does. Elsewhere (or without ``prctl``/``pidfd_open``)
children are started by trio and learn of the proxy's death from the end of their stdin
only: a server that ignores it outlives a killed proxy.

Every child's environment carries the loop guard's chain of configs
(``aggregator.core.catalogs.nesting``), set after the server's own ``env``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from aggregator.core.catalogs.nesting import CHAIN_VARIABLE
from aggregator.transports.channel import Channel

log = logging.getLogger(__name__)

# What a child inherits from the proxy's environment when its config names no more: what
# programs need to run (find binaries, a home, a locale) and to reach the network as the
# user does (proxies, CA certificates, the SSH agent), never the proxy's other variables,
# which may be secrets. ``env_passthrough`` adds more.
INHERITED_ENV = (
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
    "SYSTEMROOT",
    "VIRTUAL_ENV",
    "NODE_PATH",
    "PYTHONPATH",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "SSH_AUTH_SOCK",
)
STOP_GRACE = 2.0


def child_environment(extra: Mapping[str, str], passthrough: Sequence[str] = ()) -> dict[str, str]:
    """A child's environment: the inherited variables, those ``passthrough`` names (a name,
    or a prefix and ``*``), then the server's own ``env``; the loop guard's chain last."""
    names = set(INHERITED_ENV).union(name for name in passthrough if not name.endswith("*"))
    prefixes = tuple(name[:-1] for name in passthrough if name.endswith("*"))
    env = {key: value for key, value in os.environ.items() if key in names or (prefixes and key.startswith(prefixes))}
    env.update(extra)
    # Last: a server's env cannot clear the loop guard's chain (config loading refuses
    # a server env that names it, and this holds whatever built the ServerConfig).
    env.pop(CHAIN_VARIABLE, None)
    if CHAIN_VARIABLE in os.environ:
        env[CHAIN_VARIABLE] = os.environ[CHAIN_VARIABLE]
    return env


def resolve_command(command: str, env: Mapping[str, str]) -> str:
    """Find ``command`` on the child's PATH, then beside the running Python.

    The second place makes servers installed into the same environment as the proxy
    (``pip install mcp-server-time``) work without activating it.
    """
    if os.sep in command:
        return command
    search = os.pathsep.join(part for part in (env.get("PATH", ""), os.path.dirname(sys.executable)) if part)
    found = shutil.which(command, path=search)
    if found is None:
        raise FileNotFoundError(f"command not found: {command!r} (searched PATH and {os.path.dirname(sys.executable)})")
    return found


async def open_child(
    command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None, passthrough: Sequence[str] = ()
) -> trio.Process | TiedChild:
    environment = child_environment(env, passthrough)
    argv = [resolve_command(command, environment), *args]
    if _PRCTL is not None:
        return await _open_tied_child(argv, environment, cwd)
    return await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
        cwd=cwd,
        start_new_session=True,
    )


# --- children that die with the proxy (Linux) ------------------------------------------------

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    """libc's prctl, if children can be tied to the proxy here (Linux with pidfd_open)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):  # no such symbol, or a kernel before 5.3
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()
# The thread that forks every child: a pool thread never exits while the process runs.
_SPAWNER = (
    concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregator-spawner")
    if _PRCTL is not None
    else None
)


def _die_with(parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec: ask for SIGKILL when ``parent`` dies.

    It only calls prctl (resolved before the fork) and getppid: nothing that takes a lock.
    """
    prctl = _PRCTL

    def in_child() -> None:
        if prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the proxy died before the call above could cover it
            raise OSError("the aggregator that started this server has exited")

    return in_child


async def _open_tied_child(argv: list[str], env: dict[str, str], cwd: str | None) -> TiedChild:
    pipes = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read end, write end)
    ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
    spawner = _SPAWNER
    assert spawner is not None  # a tied child is only opened where prctl (and so the spawner) exists
    in_child = _die_with(os.getpid())

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=theirs[0],
            stdout=theirs[1],
            stderr=theirs[2],
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=in_child,
        )

    try:
        # Not abandoned on cancel: a fork under way finishes and its child is returned,
        # so that the caller's ladder stops it.
        popen = await trio.to_thread.run_sync(lambda: spawner.submit(spawn).result())
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return TiedChild(popen, *ours)


class TiedChild:
    """A child forked by the spawner thread: its pipes as trio streams, its exit seen through
    a pidfd. The part of trio.Process the ladder uses (pid, returncode, wait, the streams)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: int, stdout: int, stderr: int) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = trio.lowlevel.FdStream(stdin)
        self.stdout = trio.lowlevel.FdStream(stdout)
        self.stderr = trio.lowlevel.FdStream(stderr)
        self._wait_lock = trio.Lock()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)  # not reaped yet, so the pid is still this child
        except OSError as exc:  # out of descriptors: wait() polls instead
            log.warning("pid %d: no pidfd (%s); polling for its exit", popen.pid, exc.strerror or exc)

    @property
    def returncode(self) -> int | None:
        code = self._popen.poll()
        if code is not None:
            self._close_pidfd()
        return code

    async def wait(self) -> int:
        async with self._wait_lock:
            if self.returncode is None:
                if self._pidfd is not None:
                    with contextlib.suppress(trio.ClosedResourceError):
                        await trio.lowlevel.wait_readable(self._pidfd)
                    self._popen.wait()  # readable means exited: this reaps without blocking
                    self._close_pidfd()
                else:
                    while self.returncode is None:  # noqa: ASYNC110 - no pidfd to wait on
                        await trio.sleep(0.05)
            else:
                await trio.lowlevel.checkpoint()
        code = self._popen.returncode
        assert code is not None
        return code

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        pidfd = getattr(self, "_pidfd", None)
        if pidfd is not None:
            os.close(pidfd)


async def run_stdio_server(config: Any, *, task_status: trio.TaskStatus[Channel] = trio.TASK_STATUS_IGNORED) -> str:
    """Start a stdio server, report its Channel, return why it ended.

    Whenever this task ends (the child exited, or the caller was cancelled) the child is
    stopped with the full ladder: no orphans.
    """
    process = await open_child(config.command, config.args, config.env, config.cwd, config.env_passthrough)
    try:
        stdin, stdout = process.stdin, process.stdout
        assert stdin is not None and stdout is not None  # both opened as pipes
        task_status.started(Channel(stdin, stdout, process.stderr, process.pid))
        code = await process.wait()
        # Let the reader take what the server wrote just before it exited.
        await trio.sleep(0.05)
        return f"the server exited with status {code}"
    finally:
        await stop_child(process, config.name)


async def stop_child(process: trio.Process | TiedChild, name: str, grace: float = STOP_GRACE) -> None:
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

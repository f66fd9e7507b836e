"""A real ``redis-server`` for the tests: on a free port of 127.0.0.1, nothing saved to disk,
stopped by its own pid. ``REDIS`` is the binary (Debian's ``redis-server``, which the README's
test command and ``.ci/run`` install); a test needing it is skipped, saying why, only where
it is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from tests.loopback import free_port, wait_listening
from tests.required import REQUIRED

REDIS = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
needs_redis = pytest.mark.skipif(
    REDIS is None and not REQUIRED, reason="redis-server is not installed (apt-get install redis-server)"
)


class RedisServer:
    """One redis-server process; ``stop`` and ``start`` again on the same port (a restart)."""

    def __init__(self, directory: Path, password: str | None = None, unix: bool = False) -> None:
        self.port = free_port()
        self.directory = directory
        self.password = password
        self.socket = directory / "redis.sock" if unix else None  # also on a unix socket
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        login = f":{self.password}@" if self.password else ""
        return f"redis://{login}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None
        argv = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.directory), "--daemonize", "no", "--loglevel", "warning"]
        if self.password:
            argv += ["--requirepass", self.password]
        if self.socket is not None:
            argv += ["--unixsocket", str(self.socket)]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.process)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # were it paused
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def pause(self) -> None:
        """Stop answering without closing connections (SIGSTOP): what a hung server does."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)


@contextmanager
def redis_server(directory: Path, password: str | None = None, unix: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(directory, password, unix)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def until(check: Callable[[], object], seconds: float = 10.0) -> None:
    """Poll a state that has no event of its own, bounded by ``seconds``."""
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - a process's state has no event to wait on
            await trio.sleep(0.01)

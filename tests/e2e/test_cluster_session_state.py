"""Two replicas sharing ``[cluster] keys`` and a real redis-server, in front of one
``modern_server.py`` over Streamable HTTP (and a stdio server that logs): a legacy
session's mutable state and its GET stream's events live in the store
(``fronts.http.shared_sessions``), so whichever replica serves a request acts as the one
that saw the session change:

- a subscription made on A delivers its update to the session's GET stream on B;
- a GET with ``Last-Event-ID`` on A replays what B's stream wrote after that event;
- a log level set on A filters the log lines of a call served by B;
- a subscription whose lease holder is SIGKILLed is taken over by the replica serving the
  session's GET stream, and updates keep coming.

Every wait is bounded; every process started here is stopped here, by its pid.
"""

from __future__ import annotations

import http.client
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, redis_server
from tests.e2e.cluster_harness import Replica, modern_server
from tests.e2e.conftest import HERE, events, post, write_config
from tests.loopback import INIT
from tests.required import missing

pytestmark = pytest.mark.e2e

SERVER = HERE / "modern_server.py"
LOGGING = HERE / "eras_logging_server.py"
KEY = "session-state-key-" + "s" * 24
COUNTER = "modern+test://counter"
UPDATED = "notifications/resources/updated"


@contextmanager
def cluster(tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    """Replicas ``a`` and ``b`` (a redis-server, the shared server), each ready."""
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with ExitStack() as stack:
        store = stack.enter_context(redis_server(tmp_path))
        server = stack.enter_context(modern_server(tmp_path))
        started = []
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            body = f'''
[servers.modern]
url = "{server}"

[servers.logging]
command = "{sys.executable}"
args = ["{LOGGING}"]

[cluster]
keys = ["{KEY}"]
replica = "{name}"
store = "{store.url}"
'''
            replica = Replica(name, write_config(directory, body, startup_timeout=30.0), directory)
            stack.callback(replica.stop)
            replica.start()
            started.append(replica)
        yield started[0], started[1]
        for replica in started:
            assert "Traceback" not in replica.tail(100_000), replica.tail()


def request(port: int, session: str, id: int, method: str, params: dict | None = None) -> list[dict]:
    message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}
    status, _, body = post(port, message, {"mcp-session-id": session})
    assert status == 200, body
    return events(body)


def open_session(port: int) -> str:
    status, headers, body = post(port, INIT)
    assert status == 200, body
    session = headers["mcp-session-id"]
    assert post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"mcp-session-id": session})[0] == 202
    return session


class GetStream:
    """A session's GET stream on one replica, read by a thread: each event's id and message."""

    def __init__(self, port: int, session: str, last_event_id: str | None = None) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"mcp-session-id": session, "accept": "text/event-stream"}
        if last_event_id is not None:
            headers["last-event-id"] = last_event_id
        self.connection.request("GET", "/mcp", headers=headers)
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.events: queue.Queue[tuple[str, dict]] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        event_id = ""
        try:
            while line := self.response.readline():
                if line.startswith(b"id: "):
                    event_id = line[4:].strip().decode()
                elif line.startswith(b"data: ") and line[6:].strip():
                    self.events.put((event_id, json.loads(line[6:])))
        except (OSError, ValueError, AttributeError):  # (closed under the reader)
            return

    def wait_for(self, wanted: Callable[[dict], bool], seconds: float = 10.0) -> tuple[str, dict]:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                event_id, message = self.events.get(timeout=left)
            except queue.Empty:
                break
            if wanted(message):
                return event_id, message
        raise AssertionError(f"no such event within {seconds}s")

    def close(self) -> None:
        self.connection.close()


def is_update(message: dict) -> bool:
    return message.get("method") == UPDATED and message["params"]["uri"] == COUNTER


def test_an_update_subscribed_on_one_replica_reaches_the_get_stream_on_the_other_and_replays(tmp_path):
    with cluster(tmp_path) as (a, b):
        session = open_session(a.port)
        assert request(a.port, session, 2, "resources/subscribe", {"uri": COUNTER})[0]["result"] == {}
        stream = GetStream(b.port, session)
        try:
            request(a.port, session, 3, "tools/call", {"name": "modern__bump", "arguments": {}})
            first, _ = stream.wait_for(is_update)
            assert first.startswith("@"), first  # the event's position in the store
            request(b.port, session, 4, "tools/call", {"name": "modern__bump", "arguments": {}})
            second, _ = stream.wait_for(is_update)
        finally:
            stream.close()
        # The client lost B's stream and resumes on A after the first update: the second again.
        resumed = GetStream(a.port, session, first)
        try:
            again, message = resumed.wait_for(lambda message: "method" in message)
            assert (again, message["method"]) == (second, UPDATED)
            # ... and what comes next, there.
            request(b.port, session, 5, "tools/call", {"name": "modern__bump", "arguments": {}})
            third, _ = resumed.wait_for(is_update)
            assert third not in (first, second)
        finally:
            resumed.close()


def test_a_log_level_set_on_one_replica_is_honoured_on_the_other(tmp_path):
    with cluster(tmp_path) as (a, b):
        session = open_session(a.port)
        said = request(b.port, session, 2, "tools/call", {"name": "logging__chatter", "arguments": {}})
        before = [m["params"]["level"] for m in said if m.get("method") == "notifications/message"]
        assert before == ["info", "warning"]  # the default: info and above
        assert request(a.port, session, 3, "logging/setLevel", {"level": "warning"})[0]["result"] == {}
        # B hears of the change on the session's channel, within moments.
        deadline = time.monotonic() + 5
        for id in range(4, 100):
            said = request(b.port, session, id, "tools/call", {"name": "logging__chatter", "arguments": {}})
            after = [m["params"]["level"] for m in said if m.get("method") == "notifications/message"]
            if after == ["warning"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert after == ["warning"]


def test_a_subscription_outlives_its_lease_holder_killed(tmp_path):
    with cluster(tmp_path) as (a, b):
        session = open_session(a.port)
        assert request(a.port, session, 2, "resources/subscribe", {"uri": COUNTER})[0]["result"] == {}
        stream = GetStream(b.port, session)
        try:
            a.kill()  # held the subscription upstream, and its lease
            # Within the lease's time (15 s) and a renewal period, B takes it over.
            deadline = time.monotonic() + 40
            while "keeps its subscriptions upstream" not in b.tail(100_000):
                assert time.monotonic() < deadline, b.tail()
                time.sleep(0.2)
            request(b.port, session, 3, "tools/call", {"name": "modern__bump", "arguments": {}})
            stream.wait_for(is_update)
        finally:
            stream.close()

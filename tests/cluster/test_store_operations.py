"""The shared store as operators see it: /readyz stays 200 but says "degraded" with the reason
while a configured store is down, and "ready" once it is back, /status.json and /metrics show it (never its
password), the embedded default changes nothing, and ``aggregator check`` warns when the
store cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import trio
from prometheus_client.parser import text_string_to_metric_families

from aggregator.cli.status import status_text
from tests.cluster.redis_server import RedisServer, needs_redis, until
from tests.e2e.conftest import fake, write_config
from tests.loopback import free_port
from tests.rawhttp import read_response_async, request_bytes
from tests.session.fronts import running_fronts

SECRET = "pa55-word-never-shown"


async def ask(port: int, method: str, path: str):
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        with trio.fail_after(10):
            await stream.send_all(request_bytes(method, path, {"host": f"127.0.0.1:{port}"}))
            return await read_response_async(stream)
    finally:
        await stream.aclose()


async def _readyz(port: int) -> tuple[int, dict]:
    response = await ask(port, "GET", "/readyz")
    return response.status, json.loads(response.body)


@needs_redis
async def test_readiness_follows_the_store_down_and_up_again(tmp_path):
    server = RedisServer(tmp_path, password=SECRET)  # not started yet: down at start
    try:
        async with running_fronts(cluster={"store": server.url, "prefix": "t"}) as fronts:
            status, body = await _readyz(fronts.http_port)  # the start went on without it
            # Still ready: the store is down for every replica alike, and calls that do not need
            # it are served; the body says so.
            assert status == 200 and body["status"] == "degraded"
            assert body["reason"].startswith(f"the shared store redis://:***@127.0.0.1:{server.port}/0 is down")
            assert body["store"]["up"] is False and body["ready"] == body["needed"] == 1
            assert await fronts.initialize()  # calls that do not need the store are served
            server.start()
            await until(lambda: fronts.hub.store.status().up, 15)
            status, body = await _readyz(fronts.http_port)
            assert status == 200 and body["status"] == "ready" and "reason" not in body and body["store"]["up"] is True
            await fronts.hub.store.set("seen", b"1", ttl=60)
            assert await fronts.hub.store.get("seen") == b"1"
            data = json.loads((await ask(fronts.http_port, "GET", "/status.json")).body)
            assert data["store"]["kind"] == "redis" and data["store"]["round_trip_ms"] is not None
            assert data["store"]["address"] == f"redis://:***@127.0.0.1:{server.port}/0"
            assert f"shared store redis://:***@127.0.0.1:{server.port}/0: up, round trip" in "\n".join(
                status_text(data)
            )
            metrics = (await ask(fronts.http_port, "GET", "/metrics")).body.decode()
            families = {f.name: f for f in text_string_to_metric_families(metrics)}
            calls = {s.labels["operation"]: s.value for s in families["aggregator_store_calls"].samples}
            assert calls["set"] == 1 and calls["get"] == 1
            assert [s.value for s in families["aggregator_store_up"].samples] == [1]
            assert "aggregator_store_duration_seconds" in families
            server.stop()
            await until(lambda: not fronts.hub.store.status().up, 15)
            status, body = await _readyz(fronts.http_port)
            assert status == 200 and body["status"] == "degraded" and "is down" in body["reason"]
            page = (await ask(fronts.http_port, "GET", "/status")).body.decode()
            for text in (page, json.dumps(body), metrics, json.dumps(data)):
                assert SECRET not in text
            server.start()
            await until(lambda: fronts.hub.store.status().up, 15)
            assert (await _readyz(fronts.http_port))[1]["status"] == "ready"
    finally:
        server.stop()


async def test_the_embedded_store_is_ready_and_named_nowhere_in_readiness():
    async with running_fronts() as fronts:
        status, body = await _readyz(fronts.http_port)
        assert status == 200 and "store" not in body and "reason" not in body
        data = json.loads((await ask(fronts.http_port, "GET", "/status.json")).body)
        assert data["store"] == {"kind": "memory", "address": "memory", "up": True, "last_error": None,
                                 "round_trip_ms": None}  # fmt: skip
        assert not any("shared store" in line for line in status_text(data))
        with trio.fail_after(5):
            await fronts.hub.store.set("k", b"v", ttl=60)
            assert await fronts.hub.store.get("k") == b"v"


def test_check_warns_when_the_store_cannot_be_reached(tmp_path):
    port = free_port()
    body = fake("good") + f'[cluster]\nstore = "redis://:{SECRET}@127.0.0.1:{port}/0"\n'
    config = write_config(tmp_path, body, startup_timeout=10.0)
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr  # a warning: the servers are fine
    assert f"warning: the shared store redis://:***@127.0.0.1:{port}/0 cannot be reached" in done.stdout
    assert SECRET not in done.stdout + done.stderr


def test_check_is_quiet_about_a_store_it_reaches(tmp_path, redis: RedisServer):
    config = write_config(tmp_path, fake("good") + f'[cluster]\nstore = "{redis.url}"\n', startup_timeout=10.0)
    done = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert done.returncode == 0 and "shared store" not in done.stdout, done.stdout + done.stderr

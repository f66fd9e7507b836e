"""Kept results on any replica: two ``aggregator serve --http`` processes with the same
``[cluster] keys`` and a real ``redis-server`` as their store, in front of ``modern_server.py``.
A result cut on one replica is paged back on the other, for a legacy session (its sealed id
adopted there) and for a 2026-07-28 request; another caller gets "Unknown resource" there as
here. What the store costs is counted: one write per cut, one read per rest read elsewhere
(its other pages are then served from what that replica kept), nothing for a call that cuts
nothing."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.redis_server import REDIS, redis_server
from tests.e2e.conftest import HERE, events, http_proxy, initialize, post, stateless, write_config
from tests.required import missing

pytestmark = pytest.mark.e2e

SERVER = HERE / "modern_server.py"
KEY = "kept-cluster-key-" + "k" * 24
BIG = "word " * 3000  # about 3,750 tokens: cut at 500


def replica(tmp_path: Path, name: str, store: str) -> Path:
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    body = f'''
[proxy.discovery]
max_result_tokens = 500

[servers.modern]
command = "{sys.executable}"
args = ["{SERVER}"]
env = {{ MODERN_SERVER_STATE_KEY = "{"s" * 32}" }}

[cluster]
keys = ["{KEY}"]
replica = "{name}"
store = "{store}"
'''
    return write_config(directory, body, startup_timeout=30.0)


def ready(port: int) -> None:
    """Wait until the replica says it is ready (``/readyz``), as a balancer's health check does."""
    deadline = time.monotonic() + 60
    while post(port, None, path="/readyz", method="GET")[0] != 200:
        assert time.monotonic() < deadline, "the replica never got ready"
        time.sleep(0.1)


def store_calls(port: int, operation: str) -> float:
    """How many ``operation`` calls the replica made on the store so far (``/metrics``)."""
    status, _, body = post(port, None, path="/metrics", method="GET")
    assert status == 200
    found = re.search(rf'aggregator_store_calls(?:_total)?\{{operation="{operation}"\}} (\S+)', body.decode())
    return float(found.group(1)) if found else 0.0


def answer(port: int, body: dict, headers: dict) -> dict:
    status, _, raw = post(port, body, headers)
    assert status == 200, raw
    [message] = [m for m in events(raw) if m.get("id") == body["id"]]
    return message


def legacy(port: int, session: str, id: int, method: str, params: dict) -> dict:
    body = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    return answer(port, body, {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"})


def modern(port: int, id: int, method: str, params: dict) -> dict:
    body, headers = stateless(id, method, params)
    headers["mcp-name"] = params["name"] if method == "tools/call" else params["uri"]
    return answer(port, body, headers)


def pages(read, uri: str) -> list[str]:
    """Every page of the rest at ``uri``, each read with ``read(uri)``."""
    texts = []
    for _ in range(50):
        text = read(uri)["result"]["contents"][0]["text"]
        body, _, rest = text.partition("\n\n[aggregator: page ")
        texts.append(body)
        if not rest:
            return texts
        uri = rest.split("the next is ", 1)[1].rstrip("]")
    raise AssertionError("more than 50 pages")


def link(result: dict) -> str:
    return next(item["uri"] for item in result["result"]["content"] if item["type"] == "resource_link")


def test_a_result_cut_on_one_replica_is_paged_back_on_another(tmp_path):
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with (
        redis_server(tmp_path) as redis,
        http_proxy(replica(tmp_path, "a", redis.url)) as (port_a, log_a),
        http_proxy(replica(tmp_path, "b", redis.url)) as (port_b, log_b),
    ):
        ready(port_a), ready(port_b)
        session = initialize(port_a)
        assert session.startswith("ag1.")
        legacy(port_b, session, 1, "ping", {})  # adopted there before anything is counted

        writes = store_calls(port_a, "set")
        small = legacy(port_a, session, 2, "tools/call", {"name": "modern__echo", "arguments": {"text": "hi"}})
        assert small["result"]["content"][0]["text"] == "hi"
        assert store_calls(port_a, "set") == writes  # a call that cuts nothing pays nothing
        cut = legacy(port_a, session, 3, "tools/call", {"name": "modern__echo", "arguments": {"text": BIG}})
        assert store_calls(port_a, "set") == writes + 1  # one write per cut, made before its answer
        uri = link(cut)

        reads = store_calls(port_b, "get")
        shown = cut["result"]["content"][0]["text"]
        ids = iter(range(10, 100))
        there = pages(lambda u: legacy(port_b, session, next(ids), "resources/read", {"uri": u}), uri)
        assert len(there) > 1 and shown + "".join(there) == BIG
        assert store_calls(port_b, "get") == reads + 1  # one read; its other pages were kept there
        here = pages(lambda u: legacy(port_a, session, next(ids), "resources/read", {"uri": u}), uri)
        assert here == there

        # Another session, on either replica, is told of no such resource.
        other = initialize(port_b)
        for port in (port_a, port_b):
            refused = legacy(port, other, 200 + port % 7, "resources/read", {"uri": uri})
            assert refused["error"]["code"] == -32602 and "Unknown resource" in refused["error"]["message"]

        # A 2026-07-28 request without a session: cut on B, read back on A.
        cut = modern(port_b, 300, "tools/call", {"name": "modern__echo", "arguments": {"text": BIG}})
        shown = cut["result"]["content"][0]["text"]
        ids = iter(range(310, 400))
        there = pages(lambda u: modern(port_a, next(ids), "resources/read", {"uri": u}), link(cut))
        assert shown + "".join(there) == BIG
        first = modern(port_a, 400, "resources/read", {"uri": link(cut)})
        assert first["result"]["resultType"] == "complete"
        assert json.dumps(first).count("Unknown resource") == 0
    for log in (log_a, log_b):
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

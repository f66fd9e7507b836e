"""``GET /metrics`` of a real ``aggregator serve --http`` in front of fake servers, read
with prometheus_client's own parser: the numbers are the calls made."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import events, fake, http_proxy, initialize, post, write_config

pytestmark = [pytest.mark.e2e]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    status, headers, body = post(port, None, path="/metrics", method="GET")
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape_until(port: int, server: str, state: str, seconds: float = 10.0) -> dict:
    """Scrape until ``server`` is in ``state`` (bounded in count and time)."""
    deadline = time.monotonic() + seconds
    for _ in range(200):
        samples = scrape(port)
        if samples.get(("aggregator_server_state", labels(server=server, state=state))) == 1:
            return samples
        assert time.monotonic() < deadline, f"server {server} is not {state}"
        time.sleep(0.05)
    raise AssertionError(f"server {server} is not {state}")


def call(port: int, session: str, id: int, name: str) -> dict:
    status, _, body = post(
        port,
        {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {"n": id}}},
        {"mcp-session-id": session},
    )
    assert status == 200, body
    [answer] = [m for m in events(body) if m.get("id") == id]
    return answer


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(pairs.items()))


def test_metrics_count_the_calls_made(tmp_path):
    config = write_config(
        tmp_path,
        fake("a") + fake("b", "hang_call", request_timeout=1.0) + fake("c", "crash_on_call"),
        startup_timeout=10.0,
        restart_backoff_initial=0.1,
    )
    with http_proxy(config) as (port, _):
        for server in ("a", "b"):
            scrape_until(port, server, "ready")
        before = scrape_until(port, "c", "ready")
        assert before[("aggregator_server_state", labels(server="a", state="down"))] == 0
        assert not any(name == "aggregator_requests_total" for name, _ in before)
        session = initialize(port)
        post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"mcp-session-id": session})
        for id in range(1, 4):
            assert "result" in call(port, session, id, "a__echo")
        assert call(port, session, 4, "b__hang")["error"]["data"]["reason"] == "timeout"
        assert call(port, session, 5, "c__crash")["error"]["data"]["reason"] == "unavailable"
        after = scrape_until(port, "c", "ready")  # started again after its backoff
        # The same checks as every path: a foreign Host learns nothing.
        status, _, body = post(port, None, {"host": "evil.example"}, path="/metrics", method="GET")
        assert status == 421 and b"aggregator_" not in body

    def requests(server: str, outcome: str, reason: str) -> float:
        key = labels(method="tools/call", server=server, outcome=outcome, reason=reason)
        return after[("aggregator_requests_total", key)]

    assert requests("a", "ok", "") == 3
    assert requests("b", "error", "timeout") == 1
    assert requests("c", "error", "unavailable") == 1
    counted = {key for name, key in after if name == "aggregator_requests_total"}
    assert len(counted) == 3  # nothing else was forwarded (tools/list, initialize: the proxy's own)
    timed = labels(method="tools/call", server="a")
    assert after[("aggregator_upstream_request_duration_seconds_count", timed)] == 3
    inf = tuple(sorted((*timed, ("le", "+Inf"))))
    assert after[("aggregator_upstream_request_duration_seconds_bucket", inf)] == 3
    assert 0 < after[("aggregator_upstream_request_duration_seconds_sum", timed)] < 3
    assert ("aggregator_upstream_request_duration_seconds_count", labels(method="tools/call", server="b")) not in after
    # Five calls, the initialize and the initialized notification went through the router.
    assert after[("aggregator_proxy_duration_seconds_count", labels(direction="client"))] >= 7
    assert after[("aggregator_proxy_duration_seconds_count", labels(direction="server"))] >= 3
    assert after[("aggregator_requests_in_flight", labels(server="a"))] == 0
    assert after[("aggregator_sessions", labels(transport="http", profile="default"))] == 1
    assert after[("aggregator_server_restarts_total", labels(server="a"))] == 0
    assert after[("aggregator_server_restarts_total", labels(server="c"))] == 1
    for server in ("a", "b", "c"):
        assert after[("aggregator_server_received_bytes_total", labels(server=server))] > 0
        assert after[("aggregator_server_sent_bytes_total", labels(server=server))] > 0
    # What a grew by is the three calls and their answers, at least.
    grew = (
        after[("aggregator_server_sent_bytes_total", labels(server="a"))]
        - before[("aggregator_server_sent_bytes_total", labels(server="a"))]
    )
    assert grew >= 3 * len(b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}')
    assert after[("aggregator_server_queue_bytes", labels(server="a"))] == 0

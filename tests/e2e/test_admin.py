"""The admin paths end to end: /healthz, /readyz, /status, /status.json, /metrics and
/reload on the HTTP listener and the admin listener (``serve --admin``), their access
rules, and ``aggregator status``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.admin_client import ADMIN_TOKEN, get, wait_for
from tests.e2e.conftest import TOKEN, fake, http_proxy, initialize, post, stateless, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e


def two_servers(tmp_path, **proxy):
    body = fake("good") + fake("broken", "exit_at_start") + '[profiles.reader.tools]\ndeny = ["add"]\n'
    return write_config(tmp_path, body, startup_timeout=10.0, restart_backoff_initial=0.2, **proxy)


def test_health_readiness_and_status_on_both_listeners(tmp_path):
    config = two_servers(tmp_path)
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, log):
        wait_listening(admin)
        wait_for(lambda: get(port, "/readyz")[2]["servers"]["good"]["state"] == "ready")
        for listener in (port, admin):
            status, headers, body = get(listener, "/healthz")
            assert status == 200 and body["status"] == "ok" and headers["cache-control"] == "no-store"
            # One server of two never starts: not ready, with each server's state and reason.
            status, _, body = get(listener, "/readyz")
            assert status == 503, body
            assert body["ready"] == 1 and body["needed"] == 2 and body["configured"] == 2
            assert body["servers"]["good"] == {"state": "ready", "last_error": None}
            assert body["servers"]["broken"]["state"] in ("down", "starting")
            status, _, _ = get(listener, "/readyz", method="HEAD")
            assert status == 503
        session = initialize(port)
        status, _, data = get(admin, "/status.json")
        assert status == 200 and data["ready"] is False
        servers = {server["name"]: server for server in data["servers"]}
        assert servers["good"]["state"] == "ready" and servers["good"]["pid"] > 0
        assert servers["good"]["items"]["tools"] > 0 and servers["good"]["restarts"] == 0
        broken = servers["broken"]
        assert broken["restarts"] >= 1 and broken["last_error"] == "the server exited with status 3"
        assert broken["stderr"] == ["fake server: exiting at start on purpose"]
        assert [s["transport"] for s in data["sessions"]] == ["streamable-http"]
        assert data["sessions"][0]["profile"] == "default" and data["sessions"][0]["age"] >= 0
        assert any("server broken did not start" in e["message"] for e in data["errors"])
        # The catalog per profile, with the rule that hid each hidden item.
        reader = data["catalog"]["reader"]
        assert {"server": "good", "original": "add", "rule": "profiles.reader.tools.deny 'add'"} in reader["hidden"][
            "tools"
        ]
        assert "good__add" in [t["name"] for t in data["catalog"]["default"]["exposed"]["tools"]]
        assert "good__add" not in [t["name"] for t in reader["exposed"]["tools"]]
        # The page embeds the same data, escaped so that nothing ends its script element.
        status, headers, page = get(port, "/status")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in headers["content-security-policy"]
        assert b'id="initial"' in page and b"exiting at start on purpose" in page
        # Reload only on the admin listener; neither exists in this build's hub: 404.
        assert get(port, "/reload", method="POST")[0] == 404
        assert get(admin, "/reload")[0] == 405
        assert get(admin, "/nothing-here")[0] == 404
        assert get(admin, "/mcp")[0] == 404  # the admin listener serves no MCP
        assert post(port, None, {"mcp-session-id": session}, method="DELETE")[0] in (200, 204)
    assert "serving the admin endpoint" in log.read_text()


def test_min_ready_threshold(tmp_path):
    with http_proxy(two_servers(tmp_path, min_ready=1)) as (port, _):
        status, _, body = wait_for(lambda: (r := get(port, "/readyz"))[0] == 200 and r)
        assert body["status"] == "ready" and body["needed"] == 1 and body["ready"] == 1


def test_host_origin_and_tokens(tmp_path):
    config = two_servers(tmp_path)
    config.write_text(config.read_text() + f'[http]\nauth_tokens = ["{TOKEN}"]\nadmin_token = "{ADMIN_TOKEN}"\n')
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, log):
        wait_listening(admin)
        for listener in (port, admin):
            assert get(listener, "/healthz", {"host": "evil.example"})[0] == 421
            assert get(listener, "/healthz", {"origin": "http://evil.example"})[0] == 403
            status, headers, _ = get(listener, "/healthz")
            assert status == 401 and headers["www-authenticate"].startswith("Bearer")
            # The MCP token does not open the admin paths when an admin token is set.
            assert get(listener, "/status.json", {"authorization": f"Bearer {TOKEN}"})[0] == 401
            assert get(listener, "/healthz", {"authorization": f"Bearer {ADMIN_TOKEN}"})[0] == 200
            # The page's shell passes with Host and Origin alone, and holds no data.
            status, _, page = get(listener, "/status")
            assert status == 200 and b'id="initial"' not in page and b"broken" not in page
            status, _, page = get(listener, "/status", {"authorization": f"Bearer {ADMIN_TOKEN}"})
            assert status == 200 and b'id="initial"' in page
            assert get(listener, "/status", {"host": "evil.example"})[0] == 421
        # Nothing of the admin token reaches the log.
        assert get(admin, "/unknown")[0] == 401  # a request that fails the checks learns no paths
        assert get(port, "/mcp", {"authorization": f"Bearer {ADMIN_TOKEN}"}, method="POST")[0] == 401
    assert ADMIN_TOKEN not in log.read_text()


def sessions_counted(admin: int, auth: dict) -> tuple[list, float]:
    """The sessions ``/status.json`` lists (transports), and ``aggregator_sessions`` summed."""
    status, _, data = get(admin, "/status.json", auth)
    assert status == 200, data
    status, _, body = get(admin, "/metrics", auth)
    assert status == 200, body
    gauge = [
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "aggregator_sessions"
    ]
    return [session["transport"] for session in data["sessions"]], sum(gauge)


def test_requests_without_a_session_open_and_count_none(tmp_path):
    """2026-07-28 requests without a session are not sessions: after three of them the
    status and the metrics show none; a session opened then is the one they show."""
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    config.write_text(config.read_text() + f'[http]\nauth_tokens = ["{TOKEN}"]\nadmin_token = "{ADMIN_TOKEN}"\n')
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, log):
        wait_listening(admin)
        auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        wait_for(lambda: get(admin, "/readyz", auth)[0] == 200)
        caller = {"authorization": f"Bearer {TOKEN}"}
        for id in (1, 2, 3):
            body, headers = stateless(id, "tools/list")
            status, _, answer = post(port, body, {**headers, **caller})
            assert status == 200 and "a__echo" in [tool["name"] for tool in json.loads(answer)["result"]["tools"]]
        assert sessions_counted(admin, auth) == ([], 0)
        initialize(port, caller)
        assert sessions_counted(admin, auth) == (["streamable-http"], 1)
    assert "Traceback" not in log.read_text()


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_status_command(tmp_path):
    config = two_servers(tmp_path)
    config.write_text(config.read_text() + f'[http]\nadmin_token = "{ADMIN_TOKEN}"\n')
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, _):
        wait_listening(admin)
        ready = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        wait_for(lambda: get(port, "/readyz", ready)[2]["servers"]["good"]["state"] == "ready")
        done = run_cli("status", "--admin", f"127.0.0.1:{admin}", env={"AGGREGATOR_ADMIN_TOKEN": ADMIN_TOKEN})
        assert done.returncode == 1, done.stderr  # not ready: one server never starts
        assert "not ready, 1 of 2 servers ready" in done.stdout
        assert "broken" in done.stdout and "[stderr] fake server: exiting at start on purpose" in done.stdout
        assert "good:add  hidden by profiles.reader.tools.deny 'add'" in done.stdout
        done = run_cli("status", "--admin", f"http://127.0.0.1:{admin}/", "--token", ADMIN_TOKEN, "--json")
        data = json.loads(done.stdout)
        assert {s["name"] for s in data["servers"]} == {"good", "broken"}
        done = run_cli("status", "--admin", f"127.0.0.1:{admin}")
        assert done.returncode == 1 and "answered 401" in done.stderr and "AGGREGATOR_ADMIN_TOKEN" in done.stderr
        assert "Traceback" not in done.stderr
    # Nothing listens any more: one line, no traceback.
    done = run_cli("status", "--admin", f"127.0.0.1:{admin}")
    assert done.returncode == 1 and done.stderr.startswith("aggregator: cannot reach the admin endpoint")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = run_cli("status", "--config", str(config))
    assert done.returncode == 1 and "neither http.admin_listen nor http.listen" in done.stderr


def test_admin_listener_mistakes(tmp_path):
    config = two_servers(tmp_path)
    port = free_port()
    # The same port as --http, and beyond loopback without a token: one line each, nothing started.
    for extra, expected in (
        (["--http", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{port}"], "name the same address"),
        (["--admin", f"0.0.0.0:{port}"], "refusing to serve on 0.0.0.0 without authentication: set http.admin_token"),
    ):
        done = run_cli("serve", "--config", str(config), *extra)
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # check refuses what serve would.
    text = config.read_text()
    config.write_text(text + f'[http]\nadmin_listen = "0.0.0.0:{port}"\n')
    done = run_cli("check", "--config", str(config))
    assert done.returncode == 2 and "set http.admin_token" in done.stderr, done.stderr
    config.write_text(text + f'[http]\nlisten = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:{port}"\n')
    config.write_text(config.read_text() + 'admin_token = "short"\n')
    done = run_cli("check", "--config", str(config))
    assert done.returncode == 2
    assert "http.admin_listen: must be another port than http.listen" in done.stderr
    assert "http.admin_token: too short" in done.stderr and "short\n" not in done.stderr.replace("too short", "")


ESCAPES = r"printf 'hello \033]0;TITLE\007\033[31mRED\033[0m\tx\r\n' >&2; exit 1"


def test_status_and_check_show_what_a_server_wrote_as_text_not_terminal_escapes(tmp_path):
    body = f'[servers.esc]\ncommand = "sh"\nargs = ["-c", {json.dumps(ESCAPES)}]\n'
    config = write_config(tmp_path, fake("good") + body, startup_timeout=5.0, restart_backoff_initial=0.2)
    checked = run_cli("check", "--config", str(config))
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, _):
        wait_listening(admin)
        wait_for(lambda: any(s["stderr"] for s in get(port, "/status.json")[2]["servers"] if s["name"] == "esc"))
        status = run_cli("status", "--admin", f"127.0.0.1:{admin}")
    expected = r"[stderr] hello \x1b]0;TITLE\x07\x1b[31mRED\x1b[0m\x09x"
    for done in (checked, status):
        assert done.returncode == 1, done.stderr
        assert expected in done.stdout, done.stdout
        assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\r" not in done.stdout

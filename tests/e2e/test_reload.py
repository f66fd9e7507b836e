"""Live reload with a real proxy (``serve --http --watch --pid-file``), real stdio servers
and an official SDK 1.x client that keeps its session throughout: ``aggregator reload``
(SIGHUP) adds one server and removes another while the unchanged one keeps its process;
a broken file is rejected with its key path and the old config goes on serving; a policy
change picked up by ``--watch`` hides a tool without restarting anything."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import HERE, ROOT, fake, free_port, http_proxy, write_config

pytestmark = pytest.mark.e2e

DEBOUNCE = {"list_changed_debounce": 0.05}


def server_pids(proxy: int, marker: str) -> list[int]:
    """The proxy's children whose command line contains ``marker``."""
    found = []
    for task in Path(f"/proc/{proxy}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in command:
                found.append(int(child))
    return found


class Client:
    """The SDK client script, one command and one JSON answer at a time."""

    def __init__(self, python1: Path, url: str) -> None:
        self.process = subprocess.Popen(
            [str(python1), str(HERE / "sdk1_reload_client.py"), url, "90"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        self.first = self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        assert line, "the client ended"
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def wait_list(self, condition, seconds: float, what: str) -> dict:
        deadline = time.monotonic() + seconds
        seen: dict = {}
        while time.monotonic() < deadline:
            seen = self.ask("list")
            if condition(seen):
                return seen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last listing: {seen}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_reload_keeps_the_session_and_applies_only_what_changed(tmp_path, python1):
    keep = fake("keep", f"record:{tmp_path / 'keep.rec'}")
    gone = fake("gone", f"record:{tmp_path / 'gone.rec'}")
    new = fake("new", "many:2", f"record:{tmp_path / 'new.rec'}")
    config = write_config(tmp_path, keep + gone, **DEBOUNCE)
    pid_file = tmp_path / "proxy.pid"
    with http_proxy(config, "--watch", "--pid-file", str(pid_file)) as (port, log):
        proxy = int(pid_file.read_text())
        client = Client(python1, f"http://127.0.0.1:{port}/mcp")
        try:
            session = client.first["session"]
            assert session
            assert {"keep__echo", "gone__echo"} <= set(client.first["tools"])
            [keep_pid] = server_pids(proxy, "keep.rec")
            [gone_pid] = server_pids(proxy, "gone.rec")

            # 1. SIGHUP through `aggregator reload`: one server added, one removed.
            config.write_text(config.read_text().replace(gone, new))
            reload = subprocess.run(
                [sys.executable, "-m", "aggregator", "reload", "--pid-file", str(pid_file)],
                capture_output=True,
                text=True,
                timeout=30,
                cwd=ROOT,
            )
            assert reload.returncode == 0, reload.stderr
            # It is told its list changed, and sees the new server's tools, not the removed one's.
            listing = client.wait_list(
                lambda s: "new__t0" in s["tools"] and "gone__echo" not in s["tools"] and s["changed"] >= 1,
                20,
                "the new server's tools",
            )
            assert listing["session"] == session  # the same session throughout
            assert "keep__echo" in listing["tools"]
            assert server_pids(proxy, "keep.rec") == [keep_pid]  # unchanged: not restarted
            wait_for(lambda: not server_pids(proxy, "gone.rec"), 10, "the removed server to stop")
            assert not Path(f"/proc/{gone_pid}/cmdline").exists() or gone_pid not in server_pids(proxy, "gone.rec")
            assert client.ask("call new__t0")["ok"]
            assert client.ask("call keep__echo")["ok"]
            assert client.ask("call gone__echo")["code"] == -32602  # unknown now
            [new_pid] = server_pids(proxy, "new.rec")

            # 2. A broken file (seen by --watch) is rejected with its key path; nothing changes.
            good = config.read_text()
            config.write_text(good.replace("[servers.keep]", "[servers.keep]\ncomand = 1", 1))
            wait_for(lambda: "servers.keep.comand" in log.read_text(), 10, "the rejection in the log")
            assert "rejected" in log.read_text()
            assert client.ask("call keep__echo")["ok"]
            assert client.ask("list")["tools"] == listing["tools"]
            assert server_pids(proxy, "keep.rec") == [keep_pid]

            # 3. A policy change (seen by --watch) hides a tool; no server restarts.
            changed_before = client.ask("list")["changed"]
            config.write_text(good + '\n[policy.tools]\ndeny = ["t1"]\n')
            after = client.wait_list(
                lambda s: "new__t1" not in s["tools"] and s["changed"] > changed_before, 10, "the policy to apply"
            )
            assert "new__t0" in after["tools"]
            assert after["session"] == session
            assert server_pids(proxy, "keep.rec") == [keep_pid]
            assert client.ask("call new__t1")["code"] == -32602

            # 4. A changed server restarts with its new settings; the others keep their processes.
            config.write_text(config.read_text().replace('"many:2"', '"many:4"'))
            client.wait_list(lambda s: "new__t3" in s["tools"], 15, "the changed server's new tools")
            assert server_pids(proxy, "new.rec") not in ([], [new_pid])
            assert server_pids(proxy, "keep.rec") == [keep_pid]
            assert client.ask("list")["session"] == session
        finally:
            client.close()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert "servers.new: added" in text and "servers.gone: removed" in text
    assert "servers.new: changed; restarted" in text
    assert not pid_file.exists()  # removed on exit


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "AGGREGATOR_ADMIN_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**environment, **(env or {})},
    )


def test_reload_says_in_one_line_why_it_cannot(tmp_path):
    pid_file = tmp_path / "proxy.pid"
    outcomes = [run_cli("reload"), run_cli("reload", "--pid-file", str(pid_file))]
    pid_file.write_text("not a pid\n")
    outcomes.append(run_cli("reload", "--pid-file", str(pid_file)))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(f"{other.pid}\n")
        outcomes.append(run_cli("reload", "--pid-file", str(pid_file)))
        assert other.poll() is None  # not an aggregator: not signalled
    finally:
        other.kill()
        other.wait(timeout=10)
    pid_file.write_text(f"{other.pid}\n")  # a process that has ended: a stale file
    outcomes.append(run_cli("reload", "--pid-file", str(pid_file)))
    outcomes.append(run_cli("reload", "--admin", "ftp://127.0.0.1:1"))
    expected = [
        "say which proxy",
        "cannot read",
        "does not hold a process id",
        "is not a running aggregator",
        "is not a running aggregator; a stale pid file?",
        "expected an http:// or https:// URL",
    ]
    for outcome, words in zip(outcomes, expected, strict=True):
        assert outcome.returncode == 1, outcome.stderr
        assert words in outcome.stderr
        assert "Traceback" not in outcome.stderr
        assert len(outcome.stderr.strip().splitlines()) == 1, outcome.stderr


class ReloadAnswers(http.server.BaseHTTPRequestHandler):
    """An admin listener's POST /reload, answering what the test put in ``answers``."""

    answers: list[tuple[int, bytes]] = []
    paths: list[str] = []
    tokens: list[str | None] = []

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.tokens.append(self.headers.get("Authorization"))
        status, body = self.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_reload_through_an_admin_listener_prints_what_it_answers():
    server = http.server.HTTPServer(("127.0.0.1", 0), ReloadAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ReloadAnswers.answers = [
        (200, json.dumps({"ok": True, "errors": [], "changes": ["servers.a: added"]}).encode()),
        (200, json.dumps({"ok": False, "errors": ["servers.a.comand: unknown key"], "changes": []}).encode()),
        (200, b"<html>"),
        (404, b"{}"),
        (422, json.dumps({"ok": False, "errors": ["servers.b.args: expected a list"], "changes": []}).encode()),
    ]
    ReloadAnswers.paths, ReloadAnswers.tokens = [], []
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        applied = run_cli("reload", "--admin", url, env={"AGGREGATOR_ADMIN_TOKEN": "a" * 32})
        refused, garbled, missing, unprocessable = (run_cli("reload", "--admin", url) for _ in range(4))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert ReloadAnswers.paths == ["/reload"] * 5
    assert ReloadAnswers.tokens == ["Bearer " + "a" * 32, None, None, None, None]
    assert (applied.returncode, applied.stdout) == (0, "servers.a: added\n")
    assert refused.returncode == 1 and "error: servers.a.comand: unknown key" in refused.stderr
    assert garbled.returncode == 1 and "not a reload answer" in garbled.stderr
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    # The admin listener answers a refused config 422, with its errors: each is printed.
    assert unprocessable.returncode == 1
    assert unprocessable.stderr.splitlines() == [
        "error: servers.b.args: expected a list",
        "the config was rejected; the running one stays",
    ]
    for outcome in (applied, refused, garbled, missing, unprocessable):
        assert "Traceback" not in outcome.stderr


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("http://[::1", "not a valid URL"),
        ("http://127.0.0.1:19000/x y", "cannot hold spaces or control characters"),
        ("http://127.0.0.1:19000\n", "cannot hold spaces or control characters"),
        ("127.0.0.1:99999", "not a valid URL (Port out of range"),
        ("http://127.0.0.1:99999", "not a valid URL (Port out of range"),
        ("http://bob:hunter22@127.0.0.1:1", "http://bob:***@127.0.0.1:1: a user or password in the URL is not used"),
        ("http://bob:hunter22@[::1", "http://bob:***@[::1: not a valid URL"),
        ("ftp://127.0.0.1:1", "expected an http:// or https:// URL"),
    ],
)
@pytest.mark.parametrize("command", ["status", "reload"])
def test_an_admin_url_that_cannot_be_used_is_refused_in_one_line(command, address, words):
    outcome = run_cli(command, "--admin", address)
    assert outcome.returncode == 1, outcome.stderr
    assert outcome.stderr.startswith("aggregator: --admin "), outcome.stderr
    assert words in outcome.stderr, outcome.stderr
    assert len(outcome.stderr.strip().splitlines()) == 1, outcome.stderr
    assert "Traceback" not in outcome.stderr and "hunter22" not in outcome.stderr


def test_serve_replaces_a_pid_file_of_a_process_that_is_no_aggregator(tmp_path):
    # After a crash the id in the file may belong to another program by now: the file is
    # stale, as `reload` also decides. A running aggregator's file is refused.
    pid_file = tmp_path / "proxy.pid"
    config = write_config(tmp_path, fake("a"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(f"{other.pid}\n")
        with http_proxy(config, "--pid-file", str(pid_file)):
            wait_for(lambda: pid_file.read_text().strip() != str(other.pid), 20, "the pid file rewritten")
            proxy_pid = int(pid_file.read_text())
            assert b"aggregator" in Path(f"/proc/{proxy_pid}/cmdline").read_bytes()
            refused = run_cli("serve", "--http", "127.0.0.1:1", "--config", str(config), "--pid-file", str(pid_file))
            assert refused.returncode == 1, refused.stderr
            assert (
                refused.stderr == f"aggregator: --pid-file {pid_file}: process {proxy_pid} is running with it already\n"
            )
            assert int(pid_file.read_text()) == proxy_pid
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait(timeout=10)
    pid_file.write_text("0\n")  # not a process of its own: stale too
    with http_proxy(config, "--pid-file", str(pid_file)):
        wait_for(lambda: pid_file.read_text().strip() not in ("0", ""), 20, "the pid file rewritten")


@pytest.mark.parametrize("number", ["99999999999999999999", "2147483648"])
def test_a_number_no_process_id_can_be_is_no_pid(tmp_path, number):
    # `reload` says so in one line; `serve` takes the file as stale and replaces it.
    pid_file = tmp_path / "proxy.pid"
    pid_file.write_text(f"{number}\n")
    outcome = run_cli("reload", "--pid-file", str(pid_file))
    assert outcome.returncode == 1 and outcome.stderr == f"aggregator: {pid_file} does not hold a process id\n"
    config = write_config(tmp_path, fake("a"))
    with http_proxy(config, "--pid-file", str(pid_file)):
        wait_for(lambda: pid_file.read_text().strip() not in (number, ""), 20, "the pid file rewritten")


def test_a_sighup_as_soon_as_the_pid_file_is_there_reloads_and_is_not_fatal(tmp_path):
    pid_file = tmp_path / "proxy.pid"
    config = write_config(tmp_path, fake("a"))
    log = tmp_path / "early.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{free_port()}", "--config", str(config)]
            + ["--pid-file", str(pid_file)],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 20
            while not pid_file.exists() and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.001)
            os.kill(process.pid, signal.SIGHUP)
            wait_for(lambda: "reloading" in log.read_text() and "nothing to apply" in log.read_text(), 20, "a reload")
            assert process.poll() is None
        finally:
            process.terminate()
            assert process.wait(timeout=15) == 0, log.read_text()
    assert "received SIGHUP" in log.read_text() and not pid_file.exists()

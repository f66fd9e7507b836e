"""The status page in a real browser (Debian's ``chromium``, headless): it renders what the
proxy knows, a server held down shows as down with its stderr, and shows as ready again
once it is back. The page's own polling is checked too: opened without data, it fetches
``status.json`` with the token from its address and renders that."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.admin_client import ADMIN_TOKEN, get, wait_for
from tests.e2e.chromium import CHROMIUM, needs_chromium
from tests.e2e.conftest import HERE, fake, http_proxy, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e

HELD_DOWN = HERE / "held_down_server.py"


def render(url: str, profile: Path, *extra: str) -> str:
    """The page's DOM after chromium has loaded it (and run its script)."""
    done = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *extra,
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def server_row(dom: str, name: str) -> str:
    """The table row of server ``name`` in the rendered page."""
    found = re.search(rf'<tr data-server="{name}" data-state="[a-z]+">.*?</tr>', dom, re.S)
    assert found, dom[-3000:]
    return found.group(0)


def connection(dom: str) -> str:
    """What the page says of its connection to the proxy (its last poll)."""
    found = re.search(r'<span id="connection" class="[a-z]+">([^<]*)</span>', dom)
    assert found, dom[-3000:]
    return found.group(1)


@needs_chromium
def test_status_page_shows_a_server_going_down_and_coming_back(tmp_path):
    hold = tmp_path / "hold"
    body = (
        f'[servers.flaky]\ncommand = "{sys.executable}"\nargs = ["{HELD_DOWN}", "{hold}"]\n'
        + fake("steady")
        + '[profiles.reader.tools]\ndeny = ["add"]\n'
    )
    config = write_config(tmp_path, body, restart_backoff_initial=0.2, restart_backoff_max=0.5)
    admin = free_port()
    browser = tmp_path / "browser"
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, _):
        wait_listening(admin)
        wait_for(lambda: get(admin, "/readyz")[0] == 200)
        page = f"http://127.0.0.1:{admin}/status"
        dom = render(page, browser)
        assert 'id="overall" class="state ok">ready<' in dom
        row = server_row(dom, "flaky")
        assert 'data-state="ready"' in row and ">legacy 2025-11-25<" in row
        assert "profiles.reader.tools.deny 'add'" in dom  # the catalog says why add is hidden
        assert 'data-hidden="steady:add"' in dom and "steady__echo" in dom

        # Hold it down and kill its process: the proxy starts it again, and again, in vain.
        hold.write_text("")
        servers = {s["name"]: s for s in get(admin, "/status.json")[2]["servers"]}
        os.kill(servers["flaky"]["pid"], signal.SIGKILL)
        wait_for(lambda: get(admin, "/status.json")[2]["servers"][0]["restarts"] >= 2)
        dom = render(page, browser)
        row = server_row(dom, "flaky")
        assert 'data-state="down"' in row or 'data-state="starting"' in row, row
        assert "held down:" in row and "exists" in row  # its stderr tail
        assert 'id="overall" class="state bad">not ready<' in dom
        assert "server flaky" in dom  # the warning in the recent errors
        assert 'data-state="ready"' in server_row(dom, "steady")

        # Let it come back.
        hold.unlink()
        wait_for(lambda: get(admin, "/readyz")[0] == 200)
        dom = render(page, browser)
        row = server_row(dom, "flaky")
        assert 'data-state="ready"' in row
        restarts = re.findall(r"<td>(\d+)</td>", row)
        assert restarts and int(restarts[0]) >= 2, row
        assert 'id="overall" class="state ok">ready<' in dom


@needs_chromium
def test_status_page_polls_with_the_token_from_its_address(tmp_path):
    config = write_config(tmp_path, fake("steady") + f'[http]\nadmin_token = "{ADMIN_TOKEN}"\n')
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, log):
        wait_listening(admin)
        auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        wait_for(lambda: get(admin, "/readyz", auth)[0] == 200)
        # Without a token the page is a shell; it renders only what status.json gives it.
        budget = "--virtual-time-budget=5000"
        dom = render(f"http://127.0.0.1:{admin}/status#token={ADMIN_TOKEN}", tmp_path / "b1", budget)
        assert 'data-server="steady" data-state="ready"' in dom
        assert "data-updated=" in dom
        dom = render(f"http://127.0.0.1:{admin}/status", tmp_path / "b2", budget)
        assert 'data-server="steady"' not in dom
        assert connection(dom).startswith("a token is required: ")
    assert ADMIN_TOKEN not in log.read_text()


@needs_chromium
def test_status_page_takes_a_token_with_plus_percent_and_ampersand_as_written(tmp_path):
    plain = "plus+pct%41&and=more-0123456789"  # form decoding would make "+" a space
    quoted = 'quote"and+plus-0123456789'  # the browser sends '"' as %22 in the address
    config = write_config(tmp_path, fake("steady") + f"[http]\nauth_tokens = ['{plain}', '{quoted}']\n")
    admin = free_port()
    with http_proxy(config, "--admin", f"127.0.0.1:{admin}") as (port, log):
        wait_listening(admin)
        wait_for(lambda: get(admin, "/readyz", {"authorization": f"Bearer {plain}"})[0] == 200)
        budget = "--virtual-time-budget=5000"
        for index, token in enumerate([plain, quoted]):
            dom = render(f"http://127.0.0.1:{admin}/status#token={token}", tmp_path / f"b{index}", budget)
            assert 'data-server="steady" data-state="ready"' in dom, token
            assert connection(dom).startswith("updated "), token
        dom = render(f"http://127.0.0.1:{admin}/status#token=not-{plain}", tmp_path / "wrong", budget)
        assert 'data-server="steady"' not in dom
        assert connection(dom).startswith("token refused: ")
    assert plain not in log.read_text()

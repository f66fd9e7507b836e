"""The polling Streamable HTTP server (``polling_server.mjs``, the official TypeScript SDK
with an event store, SEP-1699) as the tests that put it behind the proxy use it: started on
127.0.0.1, its records read back, the proxy's config for it, and the resumptions it saw."""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.conftest import write_config
from tests.loopback import free_port, wait_listening

HERE = Path(__file__).parent
SERVER = HERE / "polling_server.mjs"
REQUEST_TIMEOUT = 30


@contextmanager
def polling_server(tmp_path: Path, *args: str):
    """Start the polling server on 127.0.0.1; yield its port and the file of its records."""
    port = free_port()
    records = tmp_path / f"polling-{port}.jsonl"
    with open(records, "wb") as stderr:
        process = subprocess.Popen(
            ["node", str(SERVER), "--port", str(port), *args],
            cwd=HERE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        wait_listening(port, process)
        yield port, records
    finally:
        process.terminate()
        process.wait(timeout=10)


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def proxy_config(tmp_path: Path, port: int, prefix: str = "p") -> Path:
    return write_config(
        tmp_path,
        f'''
[servers.p]
url = "http://127.0.0.1:{port}/mcp"
prefix = "{prefix}"
request_timeout = {REQUEST_TIMEOUT}
''',
        startup_timeout=20.0,
    )


def resumptions(records: list[dict]) -> dict[str, list[tuple[float, dict]]]:
    """Per event stream the server closed: each GET that resumed it, with its delay after the close."""
    found: dict[str, list[tuple[float, dict]]] = {}
    gets = [r for r in records if "get" in r and r["lastEventId"]]
    for stream in {r["stream"] for r in records if "closed" in r}:
        assert stream, records  # the server knew which stream it closed
        closes = [r for r in records if "closed" in r and r["stream"] == stream]
        resumed = [r for r in gets if r["lastEventId"].rpartition("~")[0] == stream]
        assert len(resumed) == len(closes), (closes, resumed)
        for closed, get in zip(closes, resumed, strict=True):
            assert get["get"] > closed["closed"]
            found.setdefault(stream, []).append(((get["get"] - closed["closed"]) / 1000, get))
    assert sum(len(r) for r in found.values()) == len(gets), (found, gets)  # no GET resumed anything else
    return found

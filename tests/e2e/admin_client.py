"""What the admin path tests share: the admin token they configure, one request to an
admin path, and a bounded poll."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import post

ADMIN_TOKEN = "admin-token-for-tests-0123456789"


def get(port, path, headers=None, method="GET"):
    """One request with no body; status, headers and the body (JSON decoded when it is)."""
    status, response_headers, body = post(
        port, None, {"content-type": None, **(headers or {})}, path=path, method=method
    )
    if response_headers.get("content-type", "").startswith("application/json") and body:
        return status, response_headers, json.loads(body)
    return status, response_headers, body


def wait_for(check, seconds=20.0):
    """Poll ``check()`` until it returns something true (at most ``seconds``, every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)

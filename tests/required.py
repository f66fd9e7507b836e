"""Tools the README's test command installs with apt-get (chromium, redis-server, nginx,
haproxy). Where one is missing, the tests that need it are skipped, saying why; on CI
(``AGGREGATOR_REQUIRE_TOOLS`` set, as ``.ci/run`` does) they fail instead, so a missing
install step cannot pass as a green run.
"""

from __future__ import annotations

import os

import pytest

REQUIRED = bool(os.environ.get("AGGREGATOR_REQUIRE_TOOLS"))


def missing(tool: str, hint: str) -> None:
    """``tool`` is not installed: skip the test, or fail it on CI."""
    message = f"{tool} is not installed ({hint})"
    if REQUIRED:
        pytest.fail(f"{message}; CI requires it", pytrace=False)
    pytest.skip(message)

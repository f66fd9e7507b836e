"""Settings for the whole test suite.

Hypothesis profiles, chosen with the ``HYPOTHESIS_PROFILE`` environment variable:
``ci`` (the default) runs each property and fuzz test with 100 examples, so the suite stays
within its time budget; ``thorough`` runs 3,000 each, for a search before a release or
after a change to the codec, the router or a front. Neither has a deadline: a slow example
on a loaded machine is not a failure. A test that needs a fixed count says so with
``@settings(max_examples=...)``, which no profile changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.authserver.harness import AuthServer, start_authserver

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=3000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def authserver() -> Iterator[AuthServer]:
    """An OAuth 2.1 authorization server process on 127.0.0.1 (``tests/authserver``), one per
    test module: users ``alice`` (groups ``admins``, ``dev``) and ``bob``, any resource, the
    ``login_hint`` auto-approval and the test-only admin routes (key rotation, minting) on."""
    with start_authserver("--auto-approve", "--test-admin") as server:
        yield server

"""The modern revision's vocabulary: which request is modern, and the version error."""

from __future__ import annotations

import pytest

from aggregator.mcp import modern
from aggregator.mcp.versions import ALL_VERSIONS, MODERN, SUPPORTED, is_modern, negotiate


@pytest.mark.parametrize(
    ("message", "modern_request"),
    [
        ({"method": "tools/list", "params": {"_meta": {modern.PROTOCOL_VERSION: "2026-07-28"}}}, True),
        # An unknown revision is still a modern request (answered -32022, not as legacy).
        ({"method": "tools/list", "params": {"_meta": {modern.PROTOCOL_VERSION: "1900-01-01"}}}, True),
        ({"method": "tools/list", "params": {"_meta": {"progressToken": 1}}}, False),
        ({"method": "tools/list", "params": {"_meta": None}}, False),
        ({"method": "tools/list", "params": []}, False),
        ({"method": "tools/list"}, False),
    ],
)
def test_request_meta_marks_a_modern_request(message, modern_request):
    assert (modern.request_meta(message) is not None) is modern_request


def test_unsupported_version_lists_every_revision_served():
    error = modern.unsupported_version(7, "1900-01-01")
    assert error["id"] == 7
    assert error["error"]["code"] == modern.UNSUPPORTED_PROTOCOL_VERSION == -32022
    assert error["error"]["data"] == {"supported": list(ALL_VERSIONS), "requested": "1900-01-01"}
    assert "2026-07-28" in error["error"]["message"] and "2025-11-25" in error["error"]["message"]


def test_eras_do_not_overlap_and_initialize_negotiates_only_legacy():
    assert not set(MODERN) & set(SUPPORTED)
    assert is_modern("2026-07-28") and not is_modern("2025-11-25")
    assert negotiate("2026-07-28") == "2025-11-25"  # initialize never selects a modern revision


def test_removed_requests_are_not_modern_requests():
    assert not modern.REMOVED_REQUESTS & modern.CLIENT_REQUESTS
    assert modern.INPUT_REQUIRED_METHODS <= modern.CLIENT_REQUESTS

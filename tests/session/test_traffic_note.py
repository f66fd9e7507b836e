"""What a traffic line says of each kind of message, and what it never says."""

from __future__ import annotations

import logging

import pytest

from aggregator.telemetry import traffic


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"a":"payload"}}',
            "from client 1: request tools/call id=3 (71 bytes)",
        ),
        (
            b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
            "from client 1: notification notifications/progress (63 bytes)",
        ),
        (b'{"jsonrpc":"2.0","id":"x","result":{"text":"payload"}}', "from client 1: response id=x (54 bytes)"),
        (
            b'{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"payload"}}',
            "from client 1: error -32602 id=4 (68 bytes)",
        ),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', "from client 1: batch of 1 (42 bytes)"),
        (b"not json payload", "from client 1: not JSON-RPC (16 bytes)"),
        (
            b'{"id":123456789012345678901234567890,"result":{}}',
            "from client 1: response id=123456789012345678901234567890 (49 bytes)",
        ),
    ],
)
def test_a_line_per_message(caplog, message, expected):
    with caplog.at_level(logging.DEBUG, logger="aggregator.traffic"):
        assert traffic.enabled()
        traffic.note("in", "client 1", message)
    assert [r.getMessage() for r in caplog.records] == [expected]
    assert "payload" not in caplog.text


def test_a_long_method_or_id_is_cut(caplog):
    with caplog.at_level(logging.DEBUG, logger="aggregator.traffic"):
        traffic.note("out", "server a", {"jsonrpc": "2.0", "id": "i" * 5000, "method": "m" * 5000})
    (record,) = caplog.records
    assert record.method == "m" * traffic.SHOWN and record.id == "i" * traffic.SHOWN  # type: ignore[attr-defined]
    assert record.direction == "out" and record.peer == "server a" and record.bytes > 10000  # type: ignore[attr-defined]


def test_off_unless_debug(caplog):
    with caplog.at_level(logging.INFO, logger="aggregator.traffic"):
        assert not traffic.enabled()

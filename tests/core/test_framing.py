"""stdio framing: split on \\n only, at any byte boundary, with a bounded line."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.jsonrpc import LineSplitter, OversizedLine

MESSAGES = [
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
    '{"t":"a\u2028b\u0085c\rd\u2029"}'.encode(),
    b'{"jsonrpc":"2.0","method":"notifications/initialized"}\r',
    '{"emoji":"\U0001f600 caf\u00e9"}'.encode(),
]


def test_every_byte_boundary():
    stream = b"\n".join(MESSAGES) + b"\n"
    for cut in range(len(stream) + 1):
        splitter = LineSplitter(1 << 20)
        lines = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert lines == MESSAGES, cut


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_chunking(cuts):
    stream = b"\n".join(MESSAGES) + b"\n"
    splitter = LineSplitter(1 << 20)
    lines = []
    start = 0
    for cut in sorted(set(c % (len(stream) + 1) for c in cuts)) + [len(stream)]:
        lines += splitter.feed(stream[start:cut])
        start = cut
    assert lines == MESSAGES


def test_blank_lines_are_skipped():
    assert LineSplitter(100).feed(b"\n\n  \r\n{}\n") == [b"{}"]


def test_oversized_line_is_reported_and_the_next_one_still_arrives():
    splitter = LineSplitter(1000)
    out = []
    out += splitter.feed(b'{"id":77,' + b"x" * 600)
    assert splitter.pending > 0
    out += splitter.feed(b"y" * 600)
    assert splitter.pending == 0  # not held in memory
    for _ in range(100):
        out += splitter.feed(b"z" * 10_000)
    out += splitter.feed(b"z\n{}\n")
    assert len(out) == 2
    assert type(out[0]) is OversizedLine
    assert out[0].head.startswith(b'{"id":77,') and out[0].size > 1_000_000
    assert out[1] == b"{}"


def test_oversized_complete_line():
    out = LineSplitter(10).feed(b"x" * 11 + b"\n{}\n")
    assert type(out[0]) is OversizedLine and out[1] == b"{}"


@pytest.mark.parametrize("chunk", [1, 7, 1000, 5000, 100_000])
def test_an_oversized_line_keeps_its_first_and_last_bytes_however_it_arrives(chunk):
    line = b'{"method":"m","params":{"x":"' + bytes(range(97, 123)) * 4000 + b'"},"jsonrpc":"2.0","id":"last"}'
    splitter = LineSplitter(1000)
    data = line + b"\n" + b'{"id":1}\n'
    out = []
    for start in range(0, len(data), chunk):
        out += splitter.feed(data[start : start + chunk])
    [oversized, after] = out
    head, size, tail = oversized
    # The head is what was held when the line passed the limit (at least that much of it).
    assert line.startswith(head) and len(head) > 1000 and (size, tail) == (len(line), line[-1024:])
    assert after == b'{"id":1}'

"""Benchmark: reading one HTTP/1.1 request and framing its answer, h11 against the front's reader.

    python -m tests.bench.parse_bench

The front's reader is ``transports.http_server.RequestReader`` (llhttp through httptools)
with a response head built as ``HttpConnection`` builds it; h11 is what the front used
before. Same request (a ``tools/call`` POST with the headers a client sends), same answer,
keep-alive, interleaved, median of 7 runs of 20,000 cycles each.
"""

from __future__ import annotations

import statistics
import time

import h11

from aggregator.transports.http_server import RequestReader

BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"s0__tool0","arguments":{"x":"hello"}}}'
REQUEST = (
    b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
    b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n"
    b"Mcp-Session-Id: 0123456789abcdef0123456789abcdef\r\nMCP-Protocol-Version: 2025-11-25\r\n\r\n%s"
) % (len(BODY), BODY)
ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}'
CYCLES = 20_000


def with_h11() -> float:
    connection = h11.Connection(h11.SERVER)
    start = time.perf_counter()
    for _ in range(CYCLES):
        connection.receive_data(REQUEST)
        while type(connection.next_event()) is not h11.EndOfMessage:
            pass
        head = h11.Response(
            status_code=200, headers=[("content-type", "application/json")] + [("content-length", str(len(ANSWER)))]
        )
        out = b"".join(connection.send(event) or b"" for event in (head, h11.Data(data=ANSWER), h11.EndOfMessage()))
        assert out.endswith(ANSWER)
        connection.start_next_cycle()
    return (time.perf_counter() - start) / CYCLES * 1e6


def with_reader() -> float:
    reader = RequestReader(4 * 1024 * 1024, 16 * 1024)
    start = time.perf_counter()
    for _ in range(CYCLES):
        reader.feed(REQUEST)
        request = reader.ready.popleft()
        assert request.body == BODY  # type: ignore[union-attr]
        out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            len(ANSWER),
            ANSWER,
        )
        assert out.endswith(ANSWER)
    return (time.perf_counter() - start) / CYCLES * 1e6


def main() -> int:
    runs: dict[str, list[float]] = {"h11": [], "httptools (RequestReader)": []}
    for _ in range(7):
        runs["h11"].append(with_h11())
        runs["httptools (RequestReader)"].append(with_reader())
    for name, figures in runs.items():
        print(f"{name:28} {statistics.median(figures):7.1f} us per request and answer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

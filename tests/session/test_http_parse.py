"""The HTTP front's request reader: strict framing (no request can be read two ways), the
limits, pipelining, and what each refusal says."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from aggregator.transports.http_server import HttpConnection, HttpLimits, Refusal, Request, RequestReader

HEAD = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def read(*parts: bytes, max_body: int = 1000, max_header: int = 1000) -> list[Request | Refusal]:
    reader = RequestReader(max_body, max_header)
    for part in parts:
        reader.feed(part)
    return list(reader.ready)


def refusal(*parts: bytes, **limits: int) -> Refusal:
    items = read(*parts, **limits)
    assert items and isinstance(items[-1], Refusal), items
    return items[-1]


SMUGGLING = [
    ("Content-Length and Transfer-Encoding", b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("Transfer-Encoding and Content-Length", b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
    ("Content-Length twice, same value", b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nab"),
    ("Content-Length twice, different values", b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc"),
    ("Content-Length as a list", b"Content-Length: 2, 2\r\n\r\nab"),
    ("Content-Length with a sign", b"Content-Length: +2\r\n\r\nab"),
    ("Content-Length negative", b"Content-Length: -1\r\n\r\n"),
    ("a space before the colon", b"Content-Length : 2\r\n\r\nab"),
    ("an obs-fold", b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
    ("a bare CR in a value", b"X-A: a\rb\r\nContent-Length: 0\r\n\r\n"),
    ("a NUL in a value", b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    ("a bad chunk size", b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"),
]


@pytest.mark.parametrize(("what", "rest"), SMUGGLING, ids=[case[0] for case in SMUGGLING])
def test_a_request_that_could_be_framed_two_ways_is_refused_with_400(what, rest):
    refused = refusal(HEAD + rest)
    assert refused.status == 400 and "malformed" in refused.reason, what


def test_nothing_after_a_refusal_is_read_not_even_a_smuggled_request():
    smuggled = (
        HEAD + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    items = read(smuggled)
    assert len(items) == 1 and isinstance(items[0], Refusal)


def test_a_bare_lf_line_ending_is_refused():
    assert refusal(b"POST /mcp HTTP/1.1\nHost: x\nContent-Length: 2\n\nab").status == 400


@pytest.mark.parametrize("coding", [b"gzip", b"gzip, chunked", b"chunked, chunked", b"identity"])
def test_a_transfer_coding_other_than_chunked_is_501(coding):
    refused = refusal(HEAD + b"Transfer-Encoding: " + coding + b"\r\n\r\n0\r\n\r\n")
    assert refused.status == 501 and "Transfer-Encoding" in refused.reason


def test_transfer_encoding_twice_is_501():
    refused = refusal(HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert refused.status == 501


def test_a_chunked_body_is_read_and_its_trailers_are_not_taken_for_headers():
    (request,) = read(HEAD + b"Transfer-Encoding: chunked\r\n\r\n2;ext=1\r\nab\r\n1\r\nc\r\n0\r\nX-Late: 1\r\n\r\n")
    assert isinstance(request, Request)
    assert request.body == b"abc" and "x-late" not in request.headers


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2"])
def test_only_http_1_0_and_1_1_are_served(version):
    refused = refusal(b"POST /mcp " + version + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert refused.status == 400


def test_an_http_1_1_request_without_host_is_refused_and_1_0_may_omit_it():
    assert "Host" in refusal(b"POST /mcp HTTP/1.1\r\nContent-Length: 0\r\n\r\n").reason
    (request,) = read(b"POST /mcp HTTP/1.0\r\nContent-Length: 2\r\n\r\nab")
    assert isinstance(request, Request) and request.body == b"ab"
    assert not request.keep_alive and not request.version11


@pytest.mark.parametrize("name", [b"Host", b"Mcp-Session-Id", b"Authorization", b"Content-Type", b"Origin"])
def test_a_header_that_may_appear_once_and_comes_twice_is_400(name):
    head = b"POST /mcp HTTP/1.1\r\n" + (b"Host: x\r\n" if name != b"Host" else b"")
    refused = refusal(head + name + b": a\r\n" + name + b": a\r\nContent-Length: 0\r\n\r\n")
    assert refused.status == 400 and name.decode().lower() in refused.reason


def test_other_repeated_headers_are_joined_and_names_lowered_values_trimmed():
    (request,) = read(HEAD + b"Accept: a\r\nACCEPT:  b \r\nContent-Length: 0\r\n\r\n")
    assert isinstance(request, Request)
    assert request.headers["accept"] == "a, b" and request.headers["host"] == "127.0.0.1"


def test_headers_over_the_limit_are_431_whether_they_arrive_whole_or_drip():
    big = HEAD + b"X-Big: " + b"y" * 2000 + b"\r\n\r\n"
    assert refusal(big, max_header=1000).status == 431
    assert refusal(HEAD + b"X-Big: " + b"y" * 2000, max_header=1000).status == 431  # one read, no end
    drip = [HEAD] + [b"y" * 100] * 30
    drip[1] = b"X-Big: " + drip[1]
    assert refusal(*drip, max_header=1000).status == 431
    assert read(HEAD + b"X-Ok: " + b"y" * 500 + b"\r\nContent-Length: 0\r\n\r\n", max_header=1000)[0].body == b""


def test_a_body_over_the_limit_is_413_from_its_length_before_it_arrives():
    refused = refusal(HEAD + b"Content-Length: 1001\r\n\r\n", max_body=1000)
    assert refused.status == 413
    # A length past 64 bits: llhttp refuses it as malformed before our limit could.
    assert refusal(HEAD + b"Content-Length: 99999999999999999999999\r\n\r\n").status in (400, 413)


def test_a_chunked_body_over_the_limit_is_413_as_it_grows():
    chunk = b"%x\r\n%s\r\n" % (600, b"a" * 600)
    refused = refusal(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunk, chunk, max_body=1000)
    assert refused.status == 413


def test_pipelined_requests_are_all_read_in_order_even_split_anywhere():
    one = HEAD + b"Content-Length: 3\r\n\r\none"
    two = HEAD + b"Content-Length: 3\r\n\r\ntwo"
    data = one + two
    for cut in range(1, len(data)):
        items = read(data[:cut], data[cut:])
        assert [item.body for item in items] == [b"one", b"two"], cut  # type: ignore[union-attr]


def test_an_upgrade_request_is_read_as_an_ordinary_one_body_and_all_and_the_connection_then_closes():
    # curl --http2 on http:// asks for h2c this way, body included: it gets HTTP/1.1.
    head = HEAD + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nContent-Length: 5\r\n\r\n"
    for parts in ([head + b"hello" + HEAD + b"\r\n"], [head + b"he", b"l", b"lo"], [head, b"hello"]):
        reader = RequestReader(1000, 1000)
        for part in parts:
            assert not reader.ready
            reader.feed(part)
        (request,) = reader.ready
        assert isinstance(request, Request) and request.body == b"hello" and not request.keep_alive
        assert reader.done


def test_connect_is_read_as_an_ordinary_request_and_a_chunked_upgrade_is_refused():
    (request,) = read(b"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert isinstance(request, Request) and request.method == "CONNECT" and not request.keep_alive
    chunked = HEAD + b"Connection: upgrade\r\nUpgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert refusal(chunked).status == 400


def test_expect_100_continue_is_noticed_until_the_body_arrives():
    reader = RequestReader(1000, 1000)
    reader.feed(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert reader.expects_continue and reader.head_complete and not reader.ready
    reader.feed(b"ab")
    assert not reader.expects_continue and reader.ready[0].body == b"ab"  # type: ignore[union-attr]


def test_not_http_at_all_is_a_400_that_says_malformed():
    refused = refusal(b"NOT HTTP AT ALL\r\n\r\n")
    assert refused.status == 400 and "malformed" in refused.reason


# --- the connection: what it writes ------------------------------------------------------

LIMITS = HttpLimits(1000, 1000, 5.0)


async def exchange(raw: bytes, answer) -> bytes:
    """Feed ``raw`` to a connection, let ``answer(connection, request)`` answer each
    request; what the connection wrote."""
    client, server = trio.testing.memory_stream_pair()
    connection = HttpConnection(server, LIMITS)

    async def handle(request: Request) -> None:
        await answer(connection, request)

    await client.send_all(raw)
    await client.send_eof()
    with trio.fail_after(5):
        await connection.serve(handle)
        await connection.aclose()
        received = b""
        while data := await client.receive_some(65536):
            received += data
    return received


async def test_keep_alive_requests_are_answered_in_turn_each_with_one_framed_response():
    raw = HEAD + b"Content-Length: 1\r\n\r\na" + HEAD + b"Content-Length: 1\r\n\r\nb"

    async def answer(connection, request):
        await connection.respond(200, [("content-type", "text/plain")], request.body * 3)

    out = await exchange(raw, answer)
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 2 and out.endswith(b"content-length: 3\r\n\r\nbbb")
    assert b"connection: close" not in out


async def test_an_http_1_0_client_gets_connection_close_and_a_stream_it_can_read():
    raw = b"POST /mcp HTTP/1.0\r\nContent-Length: 1\r\n\r\na" + HEAD + b"Content-Length: 1\r\n\r\nb"

    async def answer(connection, request):
        assert await connection.start_stream([])
        assert await connection.send_chunk(b"data: 1\n\n")
        assert await connection.end_stream()

    out = await exchange(raw, answer)
    assert out.count(b"HTTP/1.1 200") == 1 and b"connection: close\r\n" in out
    assert b"transfer-encoding" not in out and out.endswith(b"\r\n\r\ndata: 1\n\n")


async def test_a_stream_to_an_http_1_1_client_is_chunked_and_ends_with_the_last_chunk():
    async def answer(connection, request):
        assert await connection.start_stream([("mcp-session-id", "s")])
        assert await connection.send_chunk(b"")  # nothing: not the last chunk
        assert await connection.send_chunk(b"data: 1\n\n")
        assert await connection.end_stream()

    out = await exchange(HEAD + b"Content-Length: 0\r\n\r\n", answer)
    assert b"transfer-encoding: chunked\r\n" in out and b"mcp-session-id: s\r\n" in out
    assert out.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n")


async def test_expect_100_continue_is_answered_before_the_body_is_read():
    client, server = trio.testing.memory_stream_pair()
    connection = HttpConnection(server, LIMITS)
    await client.send_all(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    async with trio.open_nursery() as nursery:
        got: list[Request | None] = []

        async def read() -> None:
            got.append(await connection.next_request())

        nursery.start_soon(read)
        with trio.fail_after(5):
            assert await client.receive_some(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send_all(b"ok")
    assert got[0] is not None and got[0].body == b"ok"


async def test_a_header_value_holding_a_line_break_is_never_written():
    async def answer(connection, request):
        assert not await connection.respond(200, [("x-injected", "a\r\nset-cookie: evil")], b"")

    out = await exchange(HEAD + b"Content-Length: 0\r\n\r\n", answer)
    assert b"evil" not in out


async def test_a_refused_request_gets_its_status_and_reason_and_the_connection_closes():
    async def answer(connection, request):
        raise AssertionError("a refused request is not handled")

    out = await exchange(HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", answer)
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in out
    assert b"malformed HTTP request" in out


def test_a_small_request_after_a_large_body_in_the_same_read_is_not_taken_for_large_headers():
    first = HEAD + b"Content-Length: 20000\r\n\r\n" + b"x" * 20000
    second = HEAD + b"Content-Length: 2\r\n\r\nok"
    items = read(first + second[:30], second[30:], max_body=30000, max_header=1000)
    assert [type(item) for item in items] == [Request, Request], items
    assert items[1].body == b"ok"  # type: ignore[union-attr]


def test_an_upgrade_request_whose_body_comes_later_waits_for_it():
    reader = RequestReader(1000, 1000)
    reader.feed(HEAD + b"Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 5\r\n\r\n")
    assert not reader.ready and not reader.finished and reader.head_complete
    reader.feed(b"hello")
    assert reader.ready[0].body == b"hello" and reader.finished  # type: ignore[union-attr]
    cut = RequestReader(1000, 1000)
    cut.feed(HEAD + b"Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 5\r\n\r\nhe")
    cut.end()  # the client closed its side before the rest
    assert cut.finished and not cut.ready


def test_trailers_cannot_grow_past_the_limits():
    chunked = HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: "
    refused = refusal(chunked, *[b"a" * 500] * 20, max_body=1000, max_header=1000)
    assert refused.status in (413, 431)


def test_large_chunks_split_anywhere_are_not_taken_for_trailers():
    chunk = b"%x\r\n%s\r\n" % (30000, b"a" * 30000)
    data = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 3 + b"0\r\nX-T: 1\r\n\r\n"
    for size in (7, 1000, 30003, 65536):
        items = read(*[data[i : i + size] for i in range(0, len(data), size)], max_body=100000, max_header=1000)
        assert isinstance(items[-1], Request) and len(items[-1].body) == 90000, size


def test_a_content_length_with_leading_zeros_is_its_value():
    (request,) = read(HEAD + b"Content-Length: 0000000000000000004\r\n\r\nabcd")
    assert isinstance(request, Request) and request.body == b"abcd"

"""Fuzzing the network fronts of a real `aggregator serve --http --ws` process.

Hypothesis generates raw HTTP requests (methods, paths, hostile values of the headers the
proxy reads, duplicates, bodies from valid JSON-RPC to deep nesting and junk) and
sequences of WebSocket frames (text and binary, bad UTF-8, fragments, oversized, control
frames). Each request gets a well-formed HTTP response with a 2xx or 4xx status within a
bound, never a 5xx; each frame sequence that is valid WebSocket leaves the connection
answering, and an invalid one at worst closes that connection. Afterwards the process is
alive, a fresh client can initialize and ping, and its log holds no traceback.

``HYPOTHESIS_PROFILE=thorough`` runs many more examples (see tests/conftest.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import fake, write_config
from tests.loopback import INIT, free_port, wait_listening
from tests.rawhttp import (
    FrameReader,
    Malformed,
    exchange,
    frame,
    read_response,
    request_bytes,
    websocket_handshake,
)

pytestmark = [pytest.mark.e2e]
MAX_BODY = 65536
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@attrs.define
class Served:
    process: subprocess.Popen
    http_port: int
    ws_port: int
    log: object
    session: str = ""

    def alive(self) -> None:
        assert self.process.poll() is None, "the proxy exited:\n" + self.log.read_text()[-3000:]

    def new_session(self) -> str:
        response = exchange(self.http_port, request_bytes("POST", "/mcp", self.headers(), json.dumps(INIT).encode()))
        assert response.status == 200, response
        self.session = response.headers["mcp-session-id"]
        return self.session

    def headers(self) -> dict[str, str]:
        return {
            "host": f"127.0.0.1:{self.http_port}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }

    def assert_healthy(self) -> None:
        """Alive, a fresh HTTP and WebSocket client are served, and no traceback was logged."""
        self.alive()
        session = self.new_session()
        response = exchange(
            self.http_port,
            request_bytes(
                "POST",
                "/mcp",
                {**self.headers(), "mcp-session-id": session},
                b'{"jsonrpc":"2.0","id":"alive","method":"ping"}',
            ),
        )
        assert response.status == 200 and json.loads(response.body)["id"] == "alive"
        with socket.create_connection(("127.0.0.1", self.ws_port), timeout=5) as sock:
            assert websocket_answers(sock, self.ws_port, []), "a fresh WebSocket client is not answered"
        assert "Traceback" not in self.log.read_text(), self.log.read_text()[-5000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    config = write_config(
        tmp,
        fake("a") + "\n[http]\nmax_sessions = 100000\nmax_connections = 4096\n"
        f"header_timeout = 2.0\nbody_timeout = 2.0\nmax_body_bytes = {MAX_BODY}\n",
        startup_timeout=10.0,
    )
    http_port, ws_port = free_port(), free_port()
    log = tmp / "proxy.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator",
                "serve",
                "--http",
                f"127.0.0.1:{http_port}",
                "--ws",
                f"127.0.0.1:{ws_port}",
                "--config",
                str(config),
                "--log-level",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_listening(http_port, process)
            wait_listening(ws_port, process)
            served = Served(process, http_port, ws_port, log)
            served.new_session()
            yield served
        finally:
            process.terminate()
            process.wait(timeout=15)


# --- HTTP ---------------------------------------------------------------------------------------


def utf8(text: str) -> str:
    return text.encode("utf-8").decode("latin-1")


HOSTILE_VALUES = st.sampled_from(
    [
        "\xb2-1",
        "1-\xb2",
        utf8("\u0661-\u0662"),
        utf8("\u0967"),
        "",
        " ",
        "-",
        "1-",
        "-1",
        "0-0",
        "1-2-3",
        "99999999999999999999999-1",
        "1-" + "9" * 400,
        "\xff" * 8,
        "\x7f",
        "\t",
        "null",
        "2025-11-25",
        "2025-06-18",
        "1999-01-01",
        "http://evil.example",
        "http://localhost",
        "null",
        "localhost",
        "127.0.0.1",
        "[::1]",
        "[::1",
        "127.0.0.1:99999",
        "evil.example:80",
        "Bearer",
        "Bearer \xb2",
        "*/*",
        "text/event-stream",
        "application/json",
        "text/html",
        "application/json; charset=\xb2",
        "x" * 9000,
    ]
)
HEADER_VALUE = st.one_of(
    HOSTILE_VALUES,
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40),
    st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"").decode("latin-1")),
)
# The headers the proxy reads, each left as a sensible request has it, dropped, set to a
# generated value, or sent twice; then a few more headers of any name.
READ_HEADERS = [
    "host",
    "origin",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "accept",
    "content-type",
    "authorization",
]
CHANGE = st.one_of(
    st.just(("keep", "")),
    st.just(("keep", "")),
    st.just(("drop", "")),
    st.tuples(st.just("set"), HEADER_VALUE),
    st.tuples(st.just("add"), HEADER_VALUE),
)
CHANGES = st.fixed_dictionaries({name: CHANGE for name in READ_HEADERS})
EXTRA_HEADERS = st.lists(
    st.tuples(
        st.one_of(
            st.sampled_from(["connection", "expect", "upgrade", "cookie", "te", "transfer-encoding"]),
            st.from_regex(r"x-[a-z0-9-]{1,20}", fullmatch=True),
        ),
        HEADER_VALUE,
    ),
    max_size=3,
)
METHOD = st.one_of(
    st.sampled_from(["POST", "GET", "POST", "GET", "DELETE", "PUT", "HEAD", "OPTIONS"]),
    st.from_regex(r"[A-Z]{1,10}", fullmatch=True),
)
PATH = st.one_of(
    st.sampled_from(
        [
            "/mcp",
            "/mcp",
            "/mcp",
            "/sse",
            "/messages",
            "/messages?session_id=",
            "/messages?session_id=x&y",
            "/mcp/",
            "/mcp/nope",
            "/",
            "/mcp?x=1",
            "/mcp/../mcp",
            "*",
            "/%00",
            "/mcp?\xb2",
        ]
    ),
    st.from_regex(r"/[!-~]{0,30}", fullmatch=True),
)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
SAFE_METHODS = st.sampled_from(
    [
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "prompts/list",
        "initialize",
        "logging/setLevel",
        "completion/complete",
        "foo/bar",
        "rpc.x",
        "notifications/initialized",
        "notifications/cancelled",
    ]
)
ID = st.one_of(st.integers(), st.text(max_size=10), st.none(), st.booleans(), st.floats(allow_nan=False))


@st.composite
def messages(draw) -> bytes:
    method = draw(SAFE_METHODS)
    message = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0"])), "method": method}
    if not method.startswith("notifications/") or draw(st.booleans()):
        message["id"] = draw(ID)
    if method == "tools/call":
        message["params"] = {
            "name": draw(st.sampled_from(["a__echo", "a__add", "a__fail", "nope", ""])),
            "arguments": draw(JSON_VALUE),
        }
    elif draw(st.booleans()):
        message["params"] = draw(JSON_VALUE)
    return json.dumps(message).encode()


BODY = st.one_of(
    messages(),
    st.builds(lambda m: b"[" + m + b"]", messages()),
    JSON_VALUE.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.integers(min_value=1, max_value=1100).map(lambda n: b"[" * n + b"]" * n),
    st.integers(min_value=1, max_value=1100).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.just(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"x" * MAX_BODY + b'"}}'),
    st.just(b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}'),
    st.just(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__echo","arguments":{"n":1e400}}}'),
    st.just(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"\\ud800"}}'),
)


@FUZZ
@given(method=METHOD, path=PATH, changes=CHANGES, extra=EXTRA_HEADERS, body=BODY)
def test_generated_http_requests_get_well_formed_2xx_or_4xx(served, method, path, changes, extra, body):
    served.alive()
    sensible = {**served.headers(), "mcp-session-id": served.session, "mcp-protocol-version": "2025-11-25"}
    headers = []
    for name in READ_HEADERS:
        action, value = changes[name]
        if action in ("keep", "add") and name in sensible:
            headers.append((name, sensible[name]))
        if action in ("set", "add"):
            headers.append((name, value))
    headers += extra
    data = request_bytes(method, path, headers, body if method in ("POST", "PUT", "PATCH") else b"")
    try:
        response = exchange(served.http_port, data, timeout=5, head=method == "HEAD")
    except Malformed as exc:
        pytest.fail(f"not a well-formed HTTP response to {data[:300]!r}: {exc}")
    # 501 is the answer RFC 9112 (6.1) asks for to a transfer coding the server does not know.
    not_implemented = response.status == 501 and any(name == "transfer-encoding" for name, _ in headers)
    assert 200 <= response.status < 300 or 400 <= response.status < 500 or not_implemented, (response, data[:500])
    assert b"Traceback" not in response.body
    if method == "DELETE" and response.status == 200:
        served.new_session()  # the fuzzed request ended the session the others use


def on_the_wire(text: str) -> str:
    """A header value as a client would send it: latin-1 if it fits, else its UTF-8 bytes."""
    return text if all(ord(c) < 256 for c in text) else utf8(text)


# Event ids, versions and the like made of digits, some of which Python calls digits
# without int() taking them (superscripts), and digits of other scripts.
DIGITS = st.text(st.sampled_from("0123456789\xb2\xb3\xb9\u0660\u0661\u0966\uff11"), min_size=1, max_size=4)
DIGITISH = st.one_of(st.tuples(DIGITS, DIGITS).map("-".join), DIGITS).map(on_the_wire)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "DELETE"]),
    name=st.sampled_from(READ_HEADERS),
    value=st.one_of(DIGITISH, HOSTILE_VALUES, HEADER_VALUE),
    twice=st.booleans(),
)
def test_one_hostile_header_on_a_live_session_gets_a_4xx_or_its_answer(served, method, name, value, twice):
    """A request that would be served, with one header the proxy reads made hostile."""
    served.alive()
    sensible = {**served.headers(), "mcp-session-id": served.session, "mcp-protocol-version": "2025-11-25"}
    headers = [(k, v) for k, v in sensible.items() if k != name or twice] + [(name, value)]
    body = b'{"jsonrpc":"2.0","id":"fuzz","method":"ping"}' if method == "POST" else b""
    response = exchange(served.http_port, request_bytes(method, "/mcp", headers, body), timeout=5)
    assert 200 <= response.status < 300 or 400 <= response.status < 500, (response, headers)
    if method == "DELETE" and response.status == 200:
        served.new_session()


def test_http_fuzzing_leaves_the_proxy_healthy(served):
    served.assert_healthy()


# --- WebSocket ---------------------------------------------------------------------------------

TEXT, BINARY, CLOSE, PING_OP, PONG = 1, 2, 8, 9, 10


@st.composite
def frame_sequences(draw) -> tuple[list[bytes], bool]:
    """Frames to send, and whether they are valid WebSocket (each message whole and legal)."""
    frames: list[bytes] = []
    valid = True
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        kind = draw(
            st.sampled_from(
                [
                    "message",
                    "message",
                    "junk text",
                    "binary",
                    "bad utf-8",
                    "ping",
                    "pong",
                    "huge",
                    "big control",
                    "stray continuation",
                    "reserved opcode",
                    "close",
                ]
            )
        )
        if kind in ("message", "junk text", "binary", "bad utf-8", "huge"):
            payload = {
                "message": lambda: draw(messages()),
                "junk text": lambda: draw(st.text(max_size=200)).encode(),
                "binary": lambda: draw(st.one_of(messages(), st.binary(max_size=200))),
                "bad utf-8": lambda: draw(st.sampled_from([b"\xff", b"\xc3", b'{"a":"\xed\xa0\x80"}', b"\x80abc"])),
                "huge": lambda: b'"' + b"x" * (MAX_BODY + 10) + b'"',
            }[kind]()
            opcode = BINARY if kind == "binary" else TEXT
            pieces = draw(st.integers(min_value=1, max_value=3)) if len(payload) > 2 else 1
            cuts = (
                sorted(
                    draw(
                        st.lists(
                            st.integers(min_value=1, max_value=len(payload) - 1),
                            min_size=pieces - 1,
                            max_size=pieces - 1,
                            unique=True,
                        )
                    )
                )
                if pieces > 1
                else []
            )
            parts = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
            for index, part in enumerate(parts):
                frames.append(frame(opcode if index == 0 else 0, part, fin=index == len(parts) - 1))
            valid = valid and kind not in ("bad utf-8", "huge")
        elif kind in ("ping", "pong"):
            frames.append(frame(PING_OP if kind == "ping" else PONG, draw(st.binary(max_size=125))))
        elif kind == "big control":
            frames.append(frame(PING_OP, b"p" * 200))
            valid = False
        elif kind == "stray continuation":
            frames.append(frame(0, b"{}"))
            valid = False
        elif kind == "reserved opcode":
            frames.append(frame(draw(st.sampled_from([3, 4, 11, 15])), b"x"))
            valid = False
        else:
            frames.append(frame(CLOSE, b"\x03\xe8"))
            valid = False
    return frames, valid


def websocket_answers(sock: socket.socket, port: int, frames: list[bytes], timeout: float = 5.0) -> bool:
    """Handshake, send the frames and a ping request; True if the ping is answered, False if
    the server closed the connection first. Fails on a malformed answer or a hang."""
    sock.settimeout(timeout)
    sock.sendall(websocket_handshake(port))
    response = read_response(sock, timeout=timeout)
    assert response.status == 101, response
    return _exchange_frames(sock, response, frames, timeout)


def _exchange_frames(sock: socket.socket, response, frames: list[bytes], timeout: float) -> bool:
    reader = FrameReader(response.body)
    probe = json.dumps({"jsonrpc": "2.0", "id": "probe", "method": "ping"}).encode()
    try:
        sock.sendall(b"".join(frames) + frame(TEXT, probe))
    except (BrokenPipeError, ConnectionResetError):
        return False
    deadline = time.monotonic() + timeout
    while True:
        item = reader.next()
        if item is not None:
            opcode, payload = item
            if opcode == CLOSE:
                return False
            if opcode == TEXT and b'"probe"' in payload:
                assert json.loads(payload) == {"jsonrpc": "2.0", "id": "probe", "result": {}}
                return True
            continue
        assert time.monotonic() < deadline, "no answer and no close within the bound"
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return False
        if not data:
            return False
        reader.feed(data)


@FUZZ
@given(sequence=frame_sequences())
def test_generated_websocket_frames_never_hang_or_kill_the_proxy(served, sequence):
    served.alive()
    frames, valid = sequence
    with socket.create_connection(("127.0.0.1", served.ws_port), timeout=5) as sock:
        answered = websocket_answers(sock, served.ws_port, frames)
    assert answered or not valid, "valid frames, yet the connection did not answer"


HANDSHAKE_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "Host",
                "Origin",
                "Sec-WebSocket-Protocol",
                "Sec-WebSocket-Extensions",
                "Connection",
                "Upgrade",
                "Authorization",
                "Sec-WebSocket-Version",
                "X-Other",
            ]
        ),
        HEADER_VALUE,
    ),
    min_size=1,
    max_size=3,
)


@FUZZ
@given(extra=HANDSHAKE_HEADERS, path=PATH)
def test_generated_websocket_handshakes_get_101_or_4xx(served, extra, path):
    served.alive()
    handshake = websocket_handshake(
        served.ws_port,
        path if path.startswith("/") else "/mcp",
        b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in extra),
    )
    with socket.create_connection(("127.0.0.1", served.ws_port), timeout=5) as sock:
        sock.sendall(handshake)
        try:
            response = read_response(sock, timeout=5)
        except Malformed as exc:
            pytest.fail(f"not a well-formed answer to {handshake[:400]!r}: {exc}")
        assert response.status == 101 or 400 <= response.status < 500, (response, handshake[:400])
        if response.status == 101:
            _exchange_frames(sock, response, [], 5)


def test_websocket_fuzzing_leaves_the_proxy_healthy(served):
    served.assert_healthy()

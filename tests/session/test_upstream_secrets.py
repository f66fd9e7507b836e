"""A server's secrets (the values of its ``headers`` and ``env``) never reach the log,
``check`` or a client, even when the connection fails with an exception that quotes one.

The config check refuses a header value the HTTP client would refuse (a line break, a
NUL); these tests build the config past that check, as if a value had slipped through,
and connect for real to a socket listening on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import traceback
from functools import partial
from urllib.parse import quote, quote_plus

import attrs
import httpx
import pytest
import trio
import trio.testing

from aggregator.cli.common import status_lines
from aggregator.config import raw_to_toml, structure_config
from aggregator.config.masking import SecretMask, shown_url
from aggregator.errors import ConfigError
from aggregator.fronts.session import serve_stream_session
from aggregator.hub.hub import Hub
from aggregator.upstreams import network_link
from tests.session.harness import Client

SECRET = "sekrit-token-123"
ENV_SECRET = "env-secret-456"


async def _accept_and_close(stream: trio.SocketStream) -> None:
    with trio.move_on_after(1):
        await stream.receive_some(65536)
    await stream.aclose()


def _config(url: str, headers: dict[str, str]):
    config = structure_config(
        {"proxy": {"startup_timeout": 5.0}, "servers": {"a": {"url": "http://127.0.0.1:9/mcp", "init_timeout": 2.0}}},
        environ={},
    )
    server = attrs.evolve(config.servers["a"], url=url, headers=headers, env={"API_KEY": ENV_SECRET})
    return attrs.evolve(config, servers={"a": server})


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        record.getMessage() + ("".join(traceback.format_exception(*record.exc_info)) if record.exc_info else "")
        for record in caplog.records
    )


@pytest.mark.parametrize("transport, scheme", [("streamable-http", "http"), ("sse", "http"), ("websocket", "ws")])
@pytest.mark.parametrize("value", [f"Bearer {SECRET}\n", f"Bearer {SECRET}\r\nX-Api-Key: {ENV_SECRET}"])
async def test_a_refused_header_value_is_masked_in_the_log_check_and_last_error(caplog, transport, scheme, value):
    caplog.set_level(logging.INFO, logger="httpcore")  # as ``aggregator.cli.logs`` sets it: no traces
    caplog.set_level(logging.DEBUG)  # last: it sets the capturing handler's level too
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, _accept_and_close, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            config = _config(f"{scheme}://127.0.0.1:{port}/mcp", {"Authorization": value})
            config = attrs.evolve(config, servers={"a": attrs.evolve(config.servers["a"], transport=transport)})
            hub = Hub(config)
            await nursery.start(hub.run)
            await hub.startup_done.wait()
            upstream = hub.upstreams["a"]
            assert upstream.state == "down" and upstream.last_error

            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_stream_session, hub, theirs, theirs)
            client = Client(ours)
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__x", "arguments": {}})
            nursery.cancel_scope.cancel()
    last_error = answer["error"]["data"]["lastError"]
    check = "\n".join(status_lines(hub))
    logged = _log_text(caplog)
    for text in (last_error, check, logged):
        assert SECRET not in text and ENV_SECRET not in text
    # The failure itself is still told (the value refused, shown as ***), not swallowed.
    assert "***" in last_error and "***" in check and "***" in logged, (last_error, check)


def test_the_mask_covers_a_value_as_an_exception_quotes_it():
    mask = SecretMask([f"Bearer {SECRET}\n", "abc", ENV_SECRET])
    assert mask(f"Illegal header value b'Bearer {SECRET}\\n'") == "Illegal header value b'***'"
    assert mask(f"value 'Bearer {SECRET}\\n' refused") == "value '***' refused"
    assert mask(f"first line: Bearer {SECRET}") == "first line: ***"  # a message cut at the line break
    assert mask(f"{ENV_SECRET} and abc") == "*** and abc"  # shorter than 4: not a secret


URL_KEY = "url-key-7f3a9c"
TRANSPORTS = [("streamable-http", "http"), ("sse", "http"), ("websocket", "ws")]
URL_PASSWORD = "pw-51b2e8d"


async def _failed_server(url: str, transport: str, handler, caplog) -> tuple[str, str, str]:
    """Run a hub whose server ``a`` has ``url`` (with {port}) on a real 127.0.0.1 socket served
    by ``handler``; a client calls it. Its lastError, the ``check`` lines and the log."""
    caplog.set_level(logging.INFO, logger="httpcore")  # as ``aggregator.cli.logs`` sets it: no traces
    caplog.set_level(logging.DEBUG)  # last: it sets the capturing handler's level too
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            raw = {
                "proxy": {"startup_timeout": 5.0},
                "servers": {"a": {"url": url.format(port=port), "transport": transport, "init_timeout": 2.0}},
            }
            config = structure_config(raw, environ={"KEY": URL_KEY, "PW": URL_PASSWORD})
            hub = Hub(config)
            await nursery.start(hub.run)
            await hub.startup_done.wait()
            for _ in range(100):  # a WebSocket handshake may still be failing
                if hub.upstreams["a"].last_error:
                    break
                await trio.sleep(0.05)
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_stream_session, hub, theirs, theirs)
            client = Client(ours)
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__x", "arguments": {}})
            nursery.cancel_scope.cancel()
    return answer["error"]["data"]["lastError"], "\n".join(status_lines(hub)), _log_text(caplog)


@pytest.mark.parametrize("transport, scheme", [("streamable-http", "http"), ("sse", "http"), ("websocket", "ws")])
@pytest.mark.parametrize(
    "url",
    [
        "{scheme}://127.0.0.1:{port}/mcp?api_key=${{KEY}}&x=1",
        "{scheme}://user:${{PW}}@127.0.0.1:{port}/mcp?sig=${{KEY}}",
        "{scheme}://127.0.0.1:{port}/mcp?k=pre-${{KEY}}",  # interpolated into part of a value
    ],
)
async def test_the_credentials_of_a_url_are_masked_in_the_log_check_and_last_error(caplog, transport, scheme, url):
    url = url.replace("{scheme}", scheme)
    last_error, check, logged = await _failed_server(url, transport, _refuse_handshake, caplog)
    for text in (last_error, check, logged):
        assert URL_KEY not in text and URL_PASSWORD not in text, text
    assert "403" in last_error, last_error  # the failure is still told
    # The clients' own lines name the URL too (httpx at info, trio-websocket at debug), masked.
    client_line = "Connecting to ws://127.0.0.1:" if scheme == "ws" else "HTTP Request: "
    assert client_line in logged and "=***" in logged.partition(client_line)[2].splitlines()[0], logged
    if transport != "streamable-http":  # (its refusal does not name the URL)
        assert "127.0.0.1" in last_error and "***" in last_error, last_error


async def _refuse_handshake(stream: trio.SocketStream) -> None:
    with trio.move_on_after(1):
        await stream.receive_some(65536)
    await stream.send_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 15\r\nconnection: close\r\n\r\nbad credentials")
    await stream.aclose()


async def test_a_refused_websocket_handshake_says_what_the_server_answered(caplog):
    last_error, check, _ = await _failed_server("ws://127.0.0.1:{port}/mcp", "websocket", _refuse_handshake, caplog)
    assert "HTTP 403 Forbidden: bad credentials" in last_error, last_error
    assert "HTTP 403 Forbidden" in check


def test_a_url_for_humans_hides_its_password_and_query_values():
    assert shown_url("https://u:p@h.example:8/x?a=1&b=&c=xyz#f") == "https://u:***@h.example:8/x?a=***&b=***&c=***#f"
    assert shown_url("http://h/x") == "http://h/x"
    mask = SecretMask.of(structure_config({"servers": {"a": {"url": "http://u:p%40ss@h/x?k=ab%2Fcd"}}}).servers["a"])
    assert mask("p%40ss p@ss ab%2Fcd ab/cd") == "*** *** *** ***"


def test_every_interpolated_value_of_a_server_is_a_secret():
    raw = {
        "servers": {
            "a": {"command": "srv", "args": ["--key", "${A}"], "cwd": "/tmp/${B}", "env": {"X": "${C}"}},
            "b": {"command": "srv"},
        }
    }
    config = structure_config(raw, environ={"A": "arg-secret", "B": "cwd-secret", "C": "env-secret"})
    mask = SecretMask.of(config.servers["a"])
    assert mask("arg-secret cwd-secret env-secret") == "*** *** ***"
    assert SecretMask.of(config.servers["b"]).forms == ()
    # Loading sets it; a config cannot.
    with pytest.raises(ConfigError, match=r"servers\.a\.interpolated: unknown key"):
        structure_config({"servers": {"a": {"command": "srv", "interpolated": []}}}, environ={})


# A stdio server that prints its secrets to stderr, spelt as it pleases, and exits.
LEAKY_CHILD = r"""
import json, os, sys, urllib.parse
secret = os.environ["API_KEY"]
print("plain", secret, file=sys.stderr)
print("argv", sys.argv[1:], file=sys.stderr)
print("urlenc", urllib.parse.quote(secret, safe=""), file=sys.stderr)
print("json-utf8", json.dumps({"k": secret}, ensure_ascii=False), file=sys.stderr)
print("json", json.dumps({"k": secret, "a": sys.argv[1:]}), file=sys.stderr)
sys.exit(1)
"""
# With what JSON and repr escape (quote, backslash), a space, and non-ASCII; each holds S3CR3T.
LEAKY_ENV = 'env"S3CR3T\\val%2F/9 é'
LEAKY_ARG = 'arg"S3CR3T\\x 55'


def _leaky_config(startup_timeout: float = 5.0) -> dict:
    return {
        "proxy": {"startup_timeout": startup_timeout},
        "servers": {
            "l": {"command": sys.executable, "args": ["-c", LEAKY_CHILD, "${ARG}"], "env": {"API_KEY": "${ENV}"}}
        },
    }


async def test_every_stderr_line_of_a_stdio_server_is_masked_in_the_log_check_and_last_error(caplog):
    environ = {"ARG": LEAKY_ARG, "ENV": LEAKY_ENV}
    last_error, check, logged, _tail = await _failure_of(_leaky_config(), environ, caplog)
    stderr_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[stderr] ")]
    # Every line was logged live, each masked; the kept tail (check) too, the JSON dump included.
    assert [line.split()[1] for line in stderr_lines[:5]] == ["plain", "argv", "urlenc", "json-utf8", "json"]
    assert '[stderr] json {"k": "***", "a": ["***"]}' in check, check
    assert "[stderr] plain ***" in logged and "[stderr] urlenc ***" in logged, logged
    for text in (logged, check, last_error):
        assert "S3CR3T" not in text, text


def test_a_secret_spelt_in_json_is_masked_in_check_and_tools_json(tmp_path):
    # The console script as a user runs it: the stderr tail of a server that did not start is
    # shown by ``check`` and by ``tools --json`` (on its stderr), its JSON dump included.
    path = tmp_path / "leaky.toml"
    path.write_text(raw_to_toml(_leaky_config(startup_timeout=2.0)))
    environ = {**os.environ, "ARG": LEAKY_ARG, "ENV": LEAKY_ENV}
    for command in (["check"], ["tools", "--json"]):
        out = subprocess.run(
            [sys.executable, "-m", "aggregator", *command, "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env=environ,
            stdin=subprocess.DEVNULL,
        )
        shown = out.stdout + out.stderr
        assert '[stderr] json {"k": "***", "a": ["***"]}' in shown, shown
        assert "S3CR3T" not in shown, shown


def test_the_mask_covers_a_value_as_json_and_percent_encoding_spell_it():
    secret = 'p"w\\x é/?% 1'  # "&" would end a query value; the rest an HTTP client encodes or not
    mask = SecretMask([secret])
    for spelt in (
        json.dumps(secret),
        json.dumps(secret, ensure_ascii=False),
        quote(secret, safe=""),
        quote_plus(secret),
        str(httpx.URL("http://h/x?k=" + secret)).partition("k=")[2],  # its spaces and quotes only
    ):
        assert mask(f"<{spelt}>").strip('<>"') == "***", spelt


@pytest.mark.parametrize(
    "transport, url",
    [
        *(
            (transport, f"{scheme}://127.0.0.1:{{port}}/mcp/${{{{KEY}}}}") for transport, scheme in TRANSPORTS
        ),  # its path
        # Its user name (without a password) and fragment: only httpx names them.
        *((transport, "http://${{KEY}}@127.0.0.1:{port}/mcp") for transport in ("streamable-http", "sse")),
        *((transport, "http://127.0.0.1:{port}/mcp#${{KEY}}") for transport in ("streamable-http", "sse")),
    ],
)
async def test_a_secret_anywhere_in_a_url_is_masked_in_the_clients_log_lines(caplog, transport, url):
    scheme = url.partition(":")[0]
    last_error, check, logged = await _failed_server(url, transport, _refuse_handshake, caplog)
    for text in (last_error, check, logged):
        assert URL_KEY not in text, text
    client_line = "Connecting to ws://127.0.0.1:" if scheme == "ws" else "HTTP Request: "
    assert client_line in logged, logged
    if "/mcp/" in url:
        assert logged.partition(client_line)[2].splitlines()[0].split()[-1 if scheme == "ws" else 1].endswith("/***")
    # The connection ended: its mask no longer applies to the clients' lines.
    assert network_link._client_masks == {} and network_link._client_mask is None


async def _stdio_failure(code: str, environ: dict[str, str], caplog) -> tuple[str, str, str, tuple[str, ...]]:
    """A stdio server running ``code`` with env API_KEY=${ENV}, that exits: its lastError, the
    ``check`` lines, the log and its stderr tail, once its failure is told."""
    raw = {"proxy": {"startup_timeout": 5.0}, "servers": {"l": {"command": sys.executable, "args": ["-c", code]}}}
    raw["servers"]["l"]["env"] = {"API_KEY": "${ENV}"}
    return await _failure_of(raw, environ, caplog)


async def _failure_of(raw: dict, environ: dict[str, str], caplog) -> tuple[str, str, str, tuple[str, ...]]:
    """Server ``l`` of ``raw`` exits at once: its lastError, the ``check`` lines, the log and
    its stderr tail, once its failure is told."""
    caplog.set_level(logging.INFO)
    config = structure_config(raw, environ=environ)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            hub = Hub(config)
            await nursery.start(hub.run)
            await hub.startup_done.wait()
            upstream = hub.upstreams["l"]
            for _ in range(200):  # it exits at once: its first failure is soon told
                if upstream.last_error and upstream.last_stderr:
                    break
                await trio.sleep(0.05)
            check = "\n".join(status_lines(hub))
            last_error, last_stderr = upstream.last_error, upstream.last_stderr
            nursery.cancel_scope.cancel()
    return last_error, check, _log_text(caplog), last_stderr


SPELLING_CHILD = r"""
import json, os, re, sys, urllib.parse
secret = os.environ["API_KEY"]
lower_hex = lambda text: re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), text)
print("quote", urllib.parse.quote(secret), file=sys.stderr)
print("quote-lower", lower_hex(urllib.parse.quote(secret, safe="")), file=sys.stderr)
print("plus-lower", lower_hex(urllib.parse.quote_plus(secret)), file=sys.stderr)
print("jsonjson", json.dumps(json.dumps(secret)), file=sys.stderr)
inner = json.dumps({"k": secret}, ensure_ascii=False)
print("jsonjson-utf8", json.dumps({"m": inner}, ensure_ascii=False), file=sys.stderr)
sys.exit(1)
"""
SPELT_SECRET = 'S3CR3T/é"\\ x+y'  # "/" (kept by quote), a hex escape with a letter (%C3%A9), JSON escapes


async def test_a_secret_percent_encoded_with_slashes_or_lowercase_hex_or_json_in_json_is_masked(caplog):
    last_error, check, logged, tail = await _stdio_failure(SPELLING_CHILD, {"ENV": SPELT_SECRET}, caplog)
    labels = ["quote", "quote-lower", "plus-lower", "jsonjson", "jsonjson-utf8"]
    assert [line.split()[0] for line in tail] == labels, tail
    for text in (logged, check, last_error, *tail):
        assert "S3CR3T" not in text, text
    assert tail[0] == "quote ***" and tail[1] == "quote-lower ***" and tail[3] == 'jsonjson "\\"***\\""', tail


def test_the_mask_covers_quote_lowercase_hex_and_json_in_json():
    secret = 'p"w\\x é/?% 1'
    mask = SecretMask([secret])
    lower_hex = partial(re.sub, "%[0-9A-F]{2}", lambda match: match.group().lower())
    for spelt in (
        quote(secret),
        lower_hex(quote(secret, safe="")),
        lower_hex(quote(secret)),
        lower_hex(quote_plus(secret)),
        json.dumps(json.dumps(secret))[3:-3],
        json.dumps(json.dumps(secret, ensure_ascii=False), ensure_ascii=False)[3:-3],
    ):
        assert mask(f"<{spelt}>") == "<***>", spelt


async def test_the_last_stderr_line_without_a_newline_is_logged_and_kept_masked(caplog):
    code = 'import os, sys; sys.stderr.write("first line\\nfatal: bad key " + os.environ["API_KEY"]); sys.exit(1)'
    last_error, check, logged, tail = await _stdio_failure(code, {"ENV": "the-key-8d21"}, caplog)
    assert tail == ("first line", "fatal: bad key ***"), tail
    assert "[stderr] fatal: bad key ***" in check and "[stderr] fatal: bad key ***" in logged, (check, logged)
    for text in (logged, check, last_error):
        assert "the-key-8d21" not in text, text


@pytest.mark.parametrize(
    ("server_list", "global_list", "variable"),
    [(["GH_TOKEN"], [], "GH_TOKEN"), ([], ["GH_*"], "GH_TOKEN"), ([], ["OPENAI_*"], "OPENAI_API_KEY")],
)
def test_a_value_passed_through_the_environment_is_masked_in_check(tmp_path, server_list, global_list, variable):
    # A variable the proxy passes through to a server (its own list or proxy.env_passthrough,
    # names or prefixes) is a secret like its env: the stderr tail check shows hides it.
    secret = "ghp_passthroughsecret123"
    path = tmp_path / "pt.toml"
    path.write_text(
        f"[proxy]\nstartup_timeout = 2.0\nenv_passthrough = {json.dumps(global_list)}\n"
        f'[servers.leak]\ncommand = "sh"\nargs = ["-c", "echo my token is ${variable} >&2; exit 1"]\n'
        f"env_passthrough = {json.dumps(server_list)}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, variable: secret},
        stdin=subprocess.DEVNULL,
    )
    shown = out.stdout + out.stderr
    assert "[stderr] my token is ***" in shown, shown
    assert "passthroughsecret" not in shown, shown

"""Each kind of refused request is logged at the same level on every network front: what
the access check refuses (a foreign Host or Origin, no token, a wrong token) at WARNING, a
client at the wrong place (a path that is no endpoint, a profile its token does not give)
at DEBUG. Real sockets on 127.0.0.1; one row per refusal kind and front."""

from __future__ import annotations

import base64
import logging
import os

import pytest
import trio

from tests.loopback import INIT
from tests.rawhttp import read_response_async, request_bytes
from tests.session.fronts import running_fronts

TOKEN = "a-default-token-of-sixteen-characters"
WORK_TOKEN = "a-work-token-of-sixteen-characters"
PROFILES = {"work": {"tokens": [WORK_TOKEN]}, "other": {}}

# (refusal kind, path, headers beyond Host (None: a foreign Host), status, level)
REFUSALS = [
    ("a foreign Host", "/mcp", None, 421, logging.WARNING),
    (
        "a foreign Origin",
        "/mcp",
        {"origin": "http://evil.example", "authorization": f"Bearer {TOKEN}"},
        403,
        logging.WARNING,
    ),
    ("no token", "/mcp", {}, 401, logging.WARNING),
    ("a wrong token", "/mcp", {"authorization": "Bearer not-a-token-of-ours-at-all"}, 401, logging.WARNING),
    ("a path that is no endpoint", "/nowhere", {"authorization": f"Bearer {TOKEN}"}, 404, logging.DEBUG),
    ("a token for another profile", "/mcp/other", {"authorization": f"Bearer {WORK_TOKEN}"}, 403, logging.DEBUG),
    # The access check comes first on every front: a request that fails it learns nothing,
    # not even that a path is no endpoint.
    ("a foreign Host, at no endpoint", "/nowhere", None, 421, logging.WARNING),
    ("no token, at no endpoint", "/nowhere", {}, 401, logging.WARNING),
]


def head(port: int, extra: dict[str, str] | None) -> dict[str, str]:
    host = "evil.example" if extra is None else f"127.0.0.1:{port}"
    return {"host": host, **(extra or {})}


async def refused_over_http(fronts, path: str, extra: dict[str, str] | None) -> int:
    headers = {
        **head(fronts.http_port, extra),
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
    }
    response = await fronts.request("POST", path, headers, INIT)
    return response.status


async def refused_over_websocket(fronts, path: str, extra: dict[str, str] | None) -> int:
    headers = {
        **head(fronts.ws_port, extra),
        "upgrade": "websocket",
        "connection": "Upgrade",
        "sec-websocket-version": "13",
        "sec-websocket-key": base64.b64encode(os.urandom(16)).decode(),
    }
    stream = await trio.open_tcp_stream("127.0.0.1", fronts.ws_port)
    try:
        await stream.send_all(request_bytes("GET", path, headers))
        return (await read_response_async(stream)).status
    finally:
        await stream.aclose()


@pytest.mark.parametrize("front", ["http", "websocket"])
@pytest.mark.parametrize(("kind", "path", "extra", "status", "level"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_each_refusal_is_logged_at_its_level_on_every_front(caplog, front, kind, path, extra, status, level):
    caplog.set_level(logging.DEBUG, logger="aggregator")
    async with running_fronts(profiles=PROFILES, auth_tokens=[TOKEN]) as fronts:
        caplog.clear()
        with trio.fail_after(10):
            refuse = refused_over_http if front == "http" else refused_over_websocket
            assert await refuse(fronts, path, extra) == status, kind
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert [r.levelno for r in refusals] == [level], [(r.levelname, r.getMessage()) for r in refusals]
        assert TOKEN not in caplog.text and WORK_TOKEN not in caplog.text


@pytest.mark.parametrize("front", ["http", "websocket"])
async def test_a_flood_of_junk_tokens_is_one_warning_then_one_per_interval(caplog, front, monkeypatch):
    from aggregator.fronts import access

    now = [0.0]
    monkeypatch.setattr(access.LogSummary, "__init__", _with_clock(access.LogSummary.__init__, lambda: now[0]))
    caplog.set_level(logging.DEBUG, logger="aggregator")
    junk = {"authorization": "Bearer junk-junk-junk-junk"}
    refuse = refused_over_http if front == "http" else refused_over_websocket
    async with running_fronts(auth_tokens=[TOKEN]) as fronts:
        caplog.clear()
        with trio.fail_after(20):
            for _ in range(2):
                for _ in range(6):
                    assert await refuse(fronts, "/mcp", junk) == 401
                assert await refuse(fronts, "/mcp", None) == 421  # another kind: logged at once
                now[0] += access.REFUSAL_LOG_INTERVAL
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 4, refusals
    assert "5 more like it" in refusals[2] and "more like it" not in refusals[3], refusals


def _with_clock(init, clock):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.clock = clock

    return patched

"""Kept results shared between replicas (``aggregator.core.catalogs.result_budget``, shared):
a cut rest is handed to the trio layer to write (``ShareKept``, with the answer it sends once
the store has the rest), a read
this replica cannot serve asks for it (``FetchKept``) and is answered when the store has
said (``KeptFetched``). Two routers stand for two replicas; the test carries the store."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs import result_budget
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.result_budget import RESULTS
from aggregator.core.commands import FetchKept, ShareKept, ToClient
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    KeptFetched,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.settings import Discovery
from tests.core.helpers import Clock, decoded, msg, new_router

BUDGET = 500
TTL = 60.0


def replica(shared: bool = True, clock: Clock | None = None):
    servers = [ServerConfig(name="s", command="x")]
    discovery = {"default": Discovery(max_result_tokens=BUDGET, keep_results_for=TTL)}
    router = new_router(
        Catalog(servers, "__", 50),
        servers,
        clock=clock or Clock(),
        discovery=discovery,
        share_kept_results=shared,
    )
    router.handle(ServerReady("s", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("s", "tools", [{"name": "big", "inputSchema": {"type": "object"}}]))
    router.handle(StartupCompleted())
    return router


def join(router, key: int, **kind: Any) -> None:
    router.handle(ClientConnected(key, **kind))
    if kind.get("stateless"):
        return
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    router.handle(ClientMessage(key, msg(id=0, method="initialize", params=initialize)))
    router.handle(ClientMessage(key, msg(method="notifications/initialized")))


def words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "m", "version": "1"},
}


def call(router, key: int, text: str, modern: bool = False) -> list[Any]:
    """A tools/call whose server answers with ``text``: the commands of that answer."""
    params: dict[str, Any] = {"name": "s__big", **({"_meta": META} if modern else {})}
    out = router.handle(ClientMessage(key, msg(id="q", method="tools/call", params=params)))
    upstream_id = decoded(next(c for c in out if c.__class__.__name__ == "ToServer").message)["id"]
    return router.handle(ServerMessage("s", msg(id=upstream_id, result={"content": [{"type": "text", "text": text}]})))


def read(router, key: int, uri: str, id: Any = "r") -> list[Any]:
    return router.handle(ClientMessage(key, msg(id=id, method="resources/read", params={"uri": uri})))


def link_of(answer: ToClient) -> str:
    return decoded(answer.message)["result"]["content"][-1]["uri"]


def text_of(commands: list[Any]) -> str:
    [answer] = commands
    assert type(answer) is ToClient
    return str(decoded(answer.message)["result"]["contents"][0]["text"])


def test_a_cut_rest_is_written_before_its_answer_leaves_and_read_back_elsewhere():
    one, two = replica(), replica()
    join(one, 1, shared_name="n" * 32)
    join(two, 7, shared_name="n" * 32)  # the same session, adopted by another replica
    text = words(2000)
    [share] = call(one, 1, text)
    answer = share.answer
    assert type(share) is ShareKept and type(answer) is ToClient and answer.session == 1
    uri = link_of(answer)
    assert share.token == uri[len(RESULTS) :] and share.owner == "session:" + "n" * 32
    assert share.ttl == TTL and share.page_bytes == BUDGET * 4 and text.endswith(share.text)
    [fetch] = read(two, 7, uri + "?page=2", id=41)
    assert fetch == FetchKept(7, 41, share.token, share.owner, uri + "?page=2", 2)
    found = two.handle(KeptFetched(fetch, share.text, share.page_bytes, 30.0))
    assert text_of(found) == text_of(read(one, 1, uri + "?page=2"))
    assert decoded(found[0].message)["id"] == 41
    # Kept there now, for the rest of its time: its other pages need no second read.
    assert text_of(read(two, 7, uri)) == text_of(read(one, 1, uri))


def test_what_the_store_did_not_have_gets_the_answer_a_missing_rest_gets():
    one, two = replica(), replica()
    join(one, 1, shared_name="a" * 32)
    join(two, 1, shared_name="a" * 32)
    [share] = call(one, 1, words(2000))
    uri = link_of(share.answer)
    [fetch] = read(two, 1, uri)
    [missing] = two.handle(KeptFetched(fetch, None))  # missing, expired, another's, or the store down
    local = replica()
    join(local, 1)
    [unknown] = local.handle(ClientMessage(1, msg(id="r", method="resources/read", params={"uri": uri})))
    assert decoded(missing.message) == decoded(unknown.message)
    assert decoded(missing.message)["error"]["code"] == -32602
    # A page past the rest's last, once it is found, is as unknown.
    [fetch] = read(two, 1, uri + "?page=99")
    [past] = two.handle(KeptFetched(fetch, share.text, share.page_bytes, 30.0))
    assert "Unknown resource" in decoded(past.message)["error"]["message"]


def test_a_read_whose_caller_left_meanwhile_is_answered_to_nobody():
    two = replica()
    join(two, 3, shared_name="b" * 32)
    [fetch] = read(two, 3, RESULTS + "t" * 24)
    two.handle(ClientDisconnected(3))
    assert two.handle(KeptFetched(fetch, "text", 100, 30.0)) == []


@pytest.mark.parametrize(
    ("kind", "owner"),
    [
        ({"principal": 3}, "token:3"),
        ({"stateless": True}, "anonymous"),
        ({"shared_name": "c" * 32}, "session:" + "c" * 32),
    ],
)
def test_each_caller_is_named_alike_on_every_replica(kind, owner):
    one = replica()
    join(one, 1, **kind)
    [share] = call(one, 1, words(2000), modern="stateless" in kind)
    assert share.owner == owner


def test_an_access_tokens_principal_is_its_issuer_and_subject():
    class Principal:
        issuer, subject = "https://issuer", "alice"

    one = replica()
    join(one, 1, principal=Principal())
    [share] = call(one, 1, words(2000))
    assert share.owner == "principal:14:https://issueralice"


def test_nothing_is_shared_of_a_session_known_here_alone_nor_without_a_store():
    one = replica()
    join(one, 1)  # no sealed id: its session lives on this replica alone
    [answer] = call(one, 1, words(2000))
    assert "error" in decoded(read(one, 1, RESULTS + "x" * 24)[0].message)
    alone = replica(shared=False)
    join(alone, 1, principal=3)
    [answer] = call(alone, 1, words(2000))
    [missed] = read(alone, 1, RESULTS + "x" * 24)
    assert "Unknown resource" in decoded(missed.message)["error"]["message"]
    assert "result" in decoded(read(alone, 1, link_of(answer))[0].message)


def test_calls_that_cut_nothing_and_reads_served_here_ask_nothing_of_the_store():
    one = replica()
    join(one, 1, principal=3)
    [answer] = call(one, 1, "short")
    assert type(answer) is ToClient
    [share] = call(one, 1, words(2000))
    assert [type(c) for c in read(one, 1, link_of(share.answer))] == [ToClient]


def test_only_the_shape_of_a_minted_token_is_looked_up():
    two = replica()
    join(two, 1, principal=3)
    for token in ("", "short", "x" * 25, "x" * 23 + "/", "x" * 23 + "\u00e9"):
        [refused] = read(two, 1, RESULTS + token)
        assert type(refused) is ToClient and "Unknown resource" in decoded(refused.message)["error"]["message"]
    [refused] = read(two, 1, RESULTS + "x" * 24 + "?page=0")
    assert type(refused) is ToClient


def test_a_shared_rest_is_bounded_and_the_same_pages_are_served_everywhere(monkeypatch):
    monkeypatch.setattr(result_budget, "SHARED_KEPT_BYTES", 5000)
    one, two = replica(), replica()
    join(one, 1, principal=3)
    join(two, 1, principal=3)
    [share] = call(one, 1, words(4000))
    assert len(share.text.encode()) <= 5000
    uri = link_of(share.answer)
    note = decoded(share.answer.message)["result"]["content"][-2]["text"]
    assert "3 pages" in note  # of what is kept, here as everywhere
    [fetch] = read(two, 1, uri + "?page=3")
    assert text_of(two.handle(KeptFetched(fetch, share.text, share.page_bytes, 30.0))) == text_of(
        read(one, 1, uri + "?page=3")
    )


def test_a_modern_callers_fetched_page_is_stamped_as_its_other_answers():
    one, two = replica(), replica()
    join(one, 1, stateless=True)
    [share] = call(one, 1, words(2000), modern=True)
    two.handle(ClientConnected(5, stateless=True))
    params = {"uri": link_of(share.answer), "_meta": META}
    out = two.handle(ClientMessage(5, msg(id=9, method="resources/read", params=params)))
    fetch = next(c for c in out if type(c) is FetchKept)
    [page] = two.handle(KeptFetched(fetch, share.text, share.page_bytes, 30.0))
    result = decoded(page.message)["result"]
    assert result["resultType"] == "complete" and result["contents"][0]["text"]

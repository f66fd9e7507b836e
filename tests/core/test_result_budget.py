"""Result budgets (``aggregator.core.catalogs.result_budget``): a tool result over its profile's
``max_result_tokens`` is cut, the rest kept for its caller alone, paged back with
resources/read, gone when it expires or its session ends; memory bounded."""

from __future__ import annotations

from typing import Any

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.kept_results import KeptResults
from aggregator.core.catalogs.result_budget import RESULTS, cut_result, over_budget
from aggregator.core.catalogs.tokens import tokens_of
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.settings import Discovery
from tests.core.helpers import Clock, connect, msg, new_router, unpack

BUDGET = 500


def build(budget: int = BUDGET, ttl: float = 60.0):
    servers = [ServerConfig(name="s", command="x")]
    clock = Clock()
    discovery = {"default": Discovery(max_result_tokens=budget, keep_results_for=ttl)}
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, discovery=discovery)
    router.handle(ServerReady("s", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("s", "tools", [{"name": "big", "inputSchema": {"type": "object"}}]))
    router.handle(StartupCompleted())
    return router, clock


def call_with_result(router, key: int, result: dict[str, Any], id: Any = "q") -> dict[str, Any]:
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(key, msg(id=id, method="tools/call", params={"name": "s__big"})))
    )
    [(kind, to, answer)] = unpack(router.handle(ServerMessage("s", msg(id=sent["id"], result=result))))
    assert (kind, to) == ("ToClient", key)
    return answer


def read(router, key: int, uri: str) -> dict[str, Any]:
    [(_, _, answer)] = unpack(
        router.handle(ClientMessage(key, msg(id="r", method="resources/read", params={"uri": uri})))
    )
    return answer


def words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def test_a_small_result_passes_untouched():
    router, _ = build()
    connect(router, 1)
    result = {"content": [{"type": "text", "text": "short"}], "structuredContent": {"a": 1}}
    assert call_with_result(router, 1, result)["result"] == result


def test_a_large_result_is_cut_with_a_note_and_a_link_and_paged_back_whole():
    router, _ = build()
    connect(router, 1)
    text = words(2000)  # about 3,500 tokens
    answer = call_with_result(router, 1, {"content": [{"type": "text", "text": text}]})
    content = answer["result"]["content"]
    shown, note, link = content
    assert tokens_of(shown["text"]) <= BUDGET and text.startswith(shown["text"])
    assert "cut to fit" in note["text"] and link["uri"] in note["text"]
    assert link["type"] == "resource_link" and link["uri"].startswith(RESULTS) and link["mimeType"] == "text/plain"
    assert tokens_of(content) <= BUDGET + 100  # the whole answer stays near its budget
    pages, uri = [], link["uri"]
    for _ in range(100):
        page = read(router, 1, uri)["result"]["contents"][0]["text"]
        body, _, rest = page.partition("\n\n[aggregator: page ")
        pages.append(body)
        if not rest:
            break
        uri = rest.split("the next is ", 1)[1].rstrip("]")
        assert tokens_of(page) <= BUDGET + 60
    assert shown["text"] + "".join(pages) == text  # nothing lost, nothing repeated


def test_only_the_caller_reads_the_rest_and_it_expires():
    router, clock = build(ttl=30)
    connect(router, 1)
    connect(router, 2)
    answer = call_with_result(router, 1, {"content": [{"type": "text", "text": words(2000)}]})
    uri = answer["result"]["content"][-1]["uri"]
    other = read(router, 2, uri)
    assert other["error"]["code"] == -32602 and "Unknown resource" in other["error"]["message"]
    assert "result" in read(router, 1, uri)
    assert "error" in read(router, 1, uri + "?page=999")
    for odd in ("?page=\u00b2", "?page=" + "9" * 5000, "?page=\u0663", "?page=-1", "?x=1"):
        refused = read(router, 1, uri + odd)
        assert refused["error"]["code"] == -32602, (odd, refused)
    clock.now += 31
    assert "Unknown resource" in read(router, 1, uri)["error"]["message"]


def test_the_owner_reads_the_rest_under_any_spelling_of_its_scheme_and_host():
    router, _ = build()
    connect(router, 1)
    connect(router, 2)
    uri = call_with_result(router, 1, {"content": [{"type": "text", "text": words(2000)}]})["result"]["content"][-1][
        "uri"
    ]
    token = uri[len(RESULTS) :]
    first = read(router, 1, uri)["result"]["contents"][0]["text"]
    for spelling in ("AGGREGATOR://results/", "Aggregator://RESULTS/", "aggregator://Results/"):
        assert read(router, 1, spelling + token)["result"]["contents"][0]["text"] == first, spelling
        assert "Unknown resource" in read(router, 2, spelling + token)["error"]["message"]
    # The token is a path: its case is its own, as in every URI.
    assert "Unknown resource" in read(router, 1, RESULTS + token.swapcase())["error"]["message"]
    assert read(router, 1, "AGGREGATOR://results/ x")["error"]["code"] == -32602


def test_no_uri_of_the_proxys_own_scheme_reaches_a_server_that_keeps_its_uris():
    """A server with an empty prefix owns every URI no other server claims: not these."""
    servers = [ServerConfig(name="u", command="x", prefix="")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock())
    router.handle(
        ServerReady("u", {"protocolVersion": "2025-11-25", "capabilities": {"resources": {"subscribe": True}}})
    )
    router.handle(ServerItems("u", "resources", [{"uri": "file:///a"}]))
    router.handle(StartupCompleted())
    connect(router, 1)
    assert unpack(router.handle(ClientMessage(1, msg(id=1, method="resources/read", params={"uri": "file:///b"}))))[0][
        0
    ] == ("ToServer")  # the server's own, unlisted: routed to it
    token = "t" * 24
    for other in ("aggregator://results:0/", "aggregator://results./", "aggregator:/results/", "aggregator:x/"):
        for method in ("resources/read", "resources/subscribe"):
            [(kind, _, answer)] = unpack(
                router.handle(ClientMessage(1, msg(id=2, method=method, params={"uri": other + token})))
            )
            assert kind == "ToClient" and "Unknown resource" in answer["error"]["message"], (method, other)


def test_a_session_owned_rest_goes_with_its_session():
    router, _ = build()
    connect(router, 1)
    call_with_result(router, 1, {"content": [{"type": "text", "text": words(2000)}]})
    assert router.budgets.kept.items
    router.handle(ClientDisconnected(1))
    assert not router.budgets.kept.items and router.budgets.kept.bytes == 0


def test_a_principal_reads_its_rest_from_another_session():
    router, _ = build()
    for key in (1, 2, 3):
        router.handle(ClientConnected(key, principal=7 if key < 3 else 8))
        router.handle(
            ClientMessage(
                key, msg(id=0, method="initialize", params={"protocolVersion": "2025-11-25", "capabilities": {}})
            )
        )
    uri = call_with_result(router, 1, {"content": [{"type": "text", "text": words(2000)}]})["result"]["content"][-1]
    assert "result" in read(router, 2, uri["uri"])  # the same bearer token
    assert "error" in read(router, 3, uri["uri"])  # another one


def test_older_clients_get_the_note_without_a_resource_link():
    router, _ = build()
    router.handle(ClientConnected(1))
    router.handle(
        ClientMessage(1, msg(id=0, method="initialize", params={"protocolVersion": "2025-03-26", "capabilities": {}}))
    )
    content = call_with_result(router, 1, {"content": [{"type": "text", "text": words(2000)}]})["result"]["content"]
    assert [item["type"] for item in content] == ["text", "text"]


def test_images_stay_and_later_text_moves_to_the_rest():
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    result = {"content": [{"type": "text", "text": words(2000)}, image, {"type": "text", "text": "tail"}]}
    rest, shown, total = cut_result(result, BUDGET)
    assert image in result["content"] and all(item.get("text") != "tail" for item in result["content"])
    assert rest.endswith("tail") and shown <= BUDGET < total


def test_structured_content_passes_whole_and_does_not_count():
    result = {"content": [{"type": "text", "text": words(2000)}], "structuredContent": {"rows": [words(300)]}}
    rest, _, _ = cut_result(result, BUDGET)
    assert result["structuredContent"] == {"rows": [words(300)]} and "rows" not in rest
    assert not over_budget({"content": [], "structuredContent": {"rows": [words(3000)]}}, BUDGET)


def test_kept_memory_is_bounded_oldest_first():
    kept = KeptResults(max_bytes=10_000, per_owner=6_000)
    first, _ = kept.keep("a", "x" * 4000, 1000, 100.0, 0.0)
    second, _ = kept.keep("a", "y" * 4000, 1000, 100.0, 0.0)  # over a's share: its oldest goes
    assert first not in kept.items and second in kept.items
    kept.keep("b", "z" * 5000, 1000, 100.0, 0.0)
    kept.keep("c", "w" * 5000, 1000, 100.0, 0.0)  # over the total: the oldest of all goes
    assert kept.bytes <= 10_000 and second not in kept.items
    token, big = kept.keep("d", "v" * 50_000, 1000, 100.0, 0.0)
    assert big.size <= 6_000 and kept.bytes <= 10_000


def test_pages_never_split_a_character():
    kept = KeptResults()
    _, rest = kept.keep("a", "é" * 1001, 7, 100.0, 0.0)
    assert "".join(rest.pages) == "é" * 1001
    assert all(len(page.encode()) <= 7 for page in rest.pages)


def test_a_rest_is_paged_in_one_pass_and_the_books_stay_balanced(monkeypatch):
    """Paging a rest encodes it once (not once per page), and many rests keep the per-owner
    and expiry bookkeeping exact: what made a 16 MB result freeze the proxy, and calls slow
    down with the number of rests kept."""
    from aggregator.core.catalogs import kept_results

    encoded = []
    real = kept_results.cut_utf8
    monkeypatch.setattr(kept_results, "cut_utf8", lambda text, size: encoded.append(size) or real(text, size))
    kept = KeptResults(max_bytes=1 << 20, per_owner=1 << 19)
    _, big = kept.keep("a", "y" * (4 << 20), 100, 5000.0, 0.0)
    assert len(encoded) == 1 and len(big.pages) == (1 << 19) // 100 + 1  # cut to its share once, paged in one pass
    for i in range(2000):
        kept.keep(f"o{i % 7}", "x" * 800, 100, 1000.0 + i, 0.0)
    owned = {}
    for item in kept.items.values():
        owned[item.owner] = owned.get(item.owner, 0) + item.size
    assert owned == kept._owner_bytes and kept.bytes == sum(owned.values()) <= 1 << 20
    assert len(kept._expiry) <= 2 * len(kept.items) + 64
    kept.expire(6000.0)
    assert not kept.items and kept.bytes == 0 and not kept._owner_bytes


def test_an_empty_text_before_the_cut_stays():
    result = {"content": [{"type": "text", "text": ""}, {"type": "text", "text": words(2000)}]}
    cut_result(result, BUDGET)
    assert result["content"][0] == {"type": "text", "text": ""}

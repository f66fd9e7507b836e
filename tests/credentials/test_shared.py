"""Users' grants and authorization flows in the shared store (``credentials.shared``), on the
embedded store and a real redis-server: rows sealed with the vault key (no token in the
clear), removed once, a refresh lock that a second replica waits for, and flows sealed
under the key ring, opened by every key of it, taken once."""

from __future__ import annotations

import os

import pytest
import trio

from aggregator.cluster.keys import FLOWS, KeyRing
from aggregator.cluster.store import MemoryStore, Store
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.shared import VAULT, SharedFlows, StoreVault
from aggregator.credentials.tokens import ClientCredentials, TokenSet
from aggregator.credentials.vault import Grant
from tests.loopback import free_port

ALICE = Principal(issuer="https://id.example", subject="alice")
BOB = Principal(issuer="https://id.example", subject="bob")
ONE, TWO = "one-cluster-key-" + "1" * 24, "two-cluster-key-" + "2" * 24


def grant(principal: Principal, server: str = "docs", access: str = "at-secret-1") -> Grant:
    return Grant(
        principal=principal,
        server=server,
        tokens=TokenSet(access_token=access, refresh_token="rt-secret-1", expires_at=None, scope="mcp"),
        token_endpoint="https://as.example/token",
        client=ClientCredentials(client_id="c", client_secret="client-secret-1"),
        resource="https://docs.example/mcp",
    )


async def test_rows_are_sealed_read_listed_and_removed(store: Store):
    key = os.urandom(32)
    one, other = StoreVault(store, key, lock_seconds=5), StoreVault(store, key, lock_seconds=5)
    with trio.fail_after(10):
        await one.put(grant(ALICE))
        await one.put(grant(ALICE, "wiki"))
        await one.put(grant(BOB))
        assert await other.get(ALICE, "docs") == grant(ALICE)  # another replica reads it
        raw = b"".join((await store.hgetall(VAULT)).values())
        for secret in (b"at-secret-1", b"rt-secret-1", b"client-secret-1"):
            assert secret not in raw
        listed = [(entry.principal.subject, entry.server, entry.refreshable) for entry in await other.entries()]
        assert listed == [("alice", "docs", True), ("alice", "wiki", True), ("bob", "docs", True)]
        taken = await other.take("alice", "docs")
        assert [(g.principal, g.server) for g in taken] == [(ALICE, "docs")]
        assert await one.get(ALICE, "docs") is None  # gone for every replica, at once
        assert await other.take("alice", "docs") == []
        await one.forget(BOB, "docs")
        assert [entry.server for entry in await one.entries()] == ["wiki"]


async def test_a_row_sealed_with_another_vault_key_is_no_grant(store: Store, caplog):
    with trio.fail_after(10):
        await StoreVault(store, os.urandom(32), lock_seconds=5).put(grant(ALICE))
        mine = StoreVault(store, os.urandom(32), lock_seconds=5)
        assert await mine.get(ALICE, "docs") is None
        [entry] = await mine.entries()
        assert entry.opens is False
    assert "sealed with another key" in caplog.text


async def test_a_second_replica_waits_for_the_first_ones_refresh(store: Store):
    key = os.urandom(32)
    one, other = StoreVault(store, key, lock_seconds=5), StoreVault(store, key, lock_seconds=5)
    order: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                async with one.refreshing(ALICE, "docs"):
                    order.append("first holds")
                    await trio.sleep(0.3)
                    order.append("first lets go")

            async def second() -> None:
                await trio.sleep(0.05)
                async with other.refreshing(ALICE, "docs"):
                    order.append("second holds")

            nursery.start_soon(first)
            nursery.start_soon(second)
    assert order == ["first holds", "first lets go", "second holds"]


async def test_a_lock_whose_holder_died_expires(store: Store):
    vault = StoreVault(store, os.urandom(32), lock_seconds=0.3)
    await store.set_new("vault-refresh:" + "0" * 64, b"a replica that died", ttl=0.3)
    with trio.fail_after(5):
        async with vault._held("0" * 64):
            pass


async def test_flows_are_sealed_under_the_key_ring_and_taken_once(store: Store):
    old, rotated = KeyRing([ONE]), KeyRing([TWO, ONE])
    flows = SharedFlows(store, old.keys_for(FLOWS))
    with trio.fail_after(10):
        await flows.put("oauth-flow:x", {"verifier": "pkce-secret"}, ttl=60)
        assert b"pkce-secret" not in (await store.get("oauth-flow:x") or b"")
        # Another replica with the keys rotated (the new key first, the old one kept) opens it;
        # a ring without the key does not; nor does the record under another name.
        assert await SharedFlows(store, rotated.keys_for(FLOWS)).get("oauth-flow:x") == {"verifier": "pkce-secret"}
        assert await SharedFlows(store, KeyRing([TWO]).keys_for(FLOWS)).get("oauth-flow:x") is None
        await store.set("oauth-flow:y", await store.get("oauth-flow:x") or b"", ttl=60)
        assert await flows.get("oauth-flow:y") is None
        # Taken once, by one of several at once.
        taken: list[object] = []

        async def take() -> None:
            taken.append(await SharedFlows(store, rotated.keys_for(FLOWS)).take("oauth-flow:x"))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(take)
        assert taken.count(None) == 3 and {"verifier": "pkce-secret"} in taken


async def test_a_link_made_on_one_replica_is_granted_on_another(tmp_path, auth_server, mcp, monkeypatch):
    """Two replicas' credentials on one store, the browser sent back to B: a link made on A is
    consented on B, A then uses the grant, a replayed callback is refused on A, and what one
    user may begin in the store is bounded."""
    import httpx

    from aggregator.cluster.keys import BROWSER
    from aggregator.credentials import authorization
    from aggregator.credentials.service import UserCredentials
    from tests.credentials.harness import consent, make_config, proxy_listener

    shared = MemoryStore(prefix="t")
    ring = KeyRing([ONE])
    port_b = free_port()
    back = f"http://127.0.0.1:{port_b}/oauth/callback"
    servers = {"docs": {"url": mcp.url, "auth": "oauth"}}
    config_a = make_config(tmp_path, servers, redirect_uri=back)
    config_b = make_config(tmp_path, servers, port_b, redirect_uri=back)
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        await nursery.start(shared.run)
        a, b = [
            await UserCredentials.open(
                config,
                client,
                environ={},
                store=shared,
                browser_key=ring.keys_for(BROWSER).signing[1],
                flow_keys=ring.keys_for(FLOWS),
            )
            for config in (config_a, config_b)
        ]
        async with proxy_listener(config_b, b):
            from aggregator.credentials import ConsentRequired

            with pytest.raises(ConsentRequired) as asked:
                await a.authorization(ALICE, config_a.servers["docs"])
            assert asked.value.url.startswith(f"http://127.0.0.1:{port_b}/oauth/connect?flow=")
            done = await consent(asked.value.url)
            assert done.status_code == 200, done.text
            assert (await a.authorization(ALICE, config_a.servers["docs"])).startswith("Bearer ")
            assert not (tmp_path / "tokens.db").exists()
            async with proxy_listener(config_a, a):
                replayed = await client.get(
                    str(done.request.url).replace(str(port_b), config_a.http.listen.split(":")[1])
                )
            assert replayed.status_code == 400 and "already used" in replayed.text
            assert auth_server.counts["authorization_code"] == 1
            # At most MAX_PENDING begun by one user within consent_timeout, on any replica.
            monkeypatch.setattr(authorization, "MAX_PENDING", 2)
            for replica in (a, b):
                with pytest.raises(ConsentRequired):
                    await replica.authorization(BOB, config_a.servers["docs"])
            with pytest.raises(CredentialError, match="too many authorizations"):
                await a.authorization(BOB, config_a.servers["docs"])
            with pytest.raises(ConsentRequired):  # another user is not held back
                await b.authorization(Principal(issuer=ALICE.issuer, subject="carol"), config_a.servers["docs"])
        nursery.cancel_scope.cancel()

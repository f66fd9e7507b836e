"""Sealed session ids in the Streamable HTTP front (``fronts.http.sessions``): two proxies in
one process with the same ``[cluster] keys`` stand for two replicas behind a balancer. A
session opened on one is adopted by the other; what does not open under the keys, or is
bound to another principal or profile, is not found, as an unknown id always was."""

from __future__ import annotations

import json

import trio

from aggregator.cluster.store import MemoryStore
from aggregator.core.events import DrainingStarted
from tests.loopback import INIT
from tests.session.fronts import Fronts, running_fronts

ONE, TWO = "k" * 32, "z" * 40
CALL = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}


async def post(fronts: Fronts, session: str, body: dict, path: str = "/mcp", **headers: str):
    return await fronts.request("POST", path, headers=fronts.headers(mcp_session_id=session, **headers), body=body)


async def test_without_keys_ids_are_random_and_stay_with_their_proxy():
    async with running_fronts() as a, running_fronts() as b:
        session = await a.initialize()
        assert not session.startswith("ag1.")
        assert (await post(b, session, CALL)).status == 404


async def test_a_session_opened_on_one_replica_is_served_by_another():
    async with running_fronts(cluster={"keys": [ONE]}) as a, running_fronts(cluster={"keys": [ONE]}) as b:
        session = await a.initialize()
        assert session.startswith("ag1.") and len(session) <= 1024
        response = await post(b, session, CALL)
        assert response.status == 200, response
        assert [tool["name"] for tool in json.loads(response.body)["result"]["tools"]]
        [key] = [s.key for s in b.http.sessions.by_id.values()]
        info = b.hub.session_info(key)
        assert info is not None and info.protocol_version == INIT["params"]["protocolVersion"]
        # The same id, again on B: the session it adopted, not another one.
        assert (await b.ping(session))["result"] == {}
        assert len(b.http.sessions.by_id) == 1 and b.hub.admission.sessions == 1
        # The adopted client is initialized: initialize again reaches the router, refused.
        [client] = [c for c in b.hub.router.clients.values()]
        assert client.initialized and client.client_info == INIT["params"]["clientInfo"]


async def test_what_does_not_open_is_not_found():
    async with (
        running_fronts(cluster={"keys": [ONE]}) as a,
        running_fronts(cluster={"keys": [TWO]}) as other_keys,
        running_fronts(cluster={"keys": [TWO, ONE]}) as rotated,
        running_fronts(cluster={"keys": [ONE]}) as b,
    ):
        session = await a.initialize()
        head, key_id, body = session.split(".")
        flipped = body[:20] + ("A" if body[20] != "A" else "B") + body[21:]
        for bad in (f"{head}.{key_id}.{flipped}", f"{head}.{key_id}.{body[:-3]}", f"{head}.AAAAAA.{body}"):
            response = await post(b, bad, CALL)
            assert response.status == 404 and b"Session not found" in response.body, (bad, response)
        assert (await post(other_keys, session, CALL)).status == 404  # sealed with a key it does not have
        assert (await post(rotated, session, CALL)).status == 200  # the old key still opens it
        new = await rotated.initialize()
        assert new.split(".")[1] != key_id and (await post(other_keys, new, CALL)).status == 200
        assert (await post(b, new, CALL)).status == 404  # sealed with the new key, which it lacks
        assert b.http.sessions.by_id == {} and b.hub.admission.sessions == 0


async def test_a_session_is_bound_to_its_principal_and_profile():
    tokens = ["t" * 24, "u" * 24]
    profiles = {"work": {"tokens": ["w" * 24]}}
    config = {"cluster": {"keys": [ONE]}, "auth_tokens": tokens, "profiles": profiles}
    async with running_fronts(**config) as a, running_fronts(**config) as b:
        opened = await a.request("POST", headers=a.headers(authorization=f"Bearer {tokens[0]}"), body=INIT)
        session = opened.headers["mcp-session-id"]
        assert (await post(b, session, CALL, authorization=f"Bearer {tokens[1]}")).status == 404
        assert (await post(b, session, CALL)).status == 401
        assert (await post(b, session, CALL, authorization=f"Bearer {tokens[0]}")).status == 200
        # A profile's session: not adopted under another profile's path.
        work = await a.request("POST", "/mcp/work", headers=a.headers(authorization=f"Bearer {'w' * 24}"), body=INIT)
        work_session = work.headers["mcp-session-id"]
        bearer = f"Bearer {'w' * 24}"
        assert (await post(b, work_session, CALL, "/mcp/default", authorization=bearer)).status in (403, 404)
        assert (await post(b, work_session, CALL, "/mcp/work", authorization=bearer)).status == 200


async def test_a_session_deleted_here_is_not_adopted_again_here():
    async with running_fronts(cluster={"keys": [ONE]}) as a, running_fronts(cluster={"keys": [ONE]}) as b:
        session = await a.initialize()
        assert (await b.ping(session))["result"] == {}
        deleted = await b.request("DELETE", headers=b.headers(mcp_session_id=session))
        assert deleted.status == 200
        assert (await post(b, session, CALL)).status == 404
        assert b.hub.admission.sessions == 0


async def test_a_deleted_sessions_tombstone_lives_as_long_as_its_id_could_be_adopted():
    """The tombstone outlives the sealed id (``session_lifetime`` from its issue), and no
    more: one kept for a fixed month would stay in the store long after every id it stops."""
    cluster = {"keys": [ONE], "session_lifetime": 3600.0}
    async with running_fronts(cluster=cluster) as a:
        session = await a.initialize()
        assert (await a.request("DELETE", headers=a.headers(mcp_session_id=session))).status == 200
        store = a.hub.store
        assert isinstance(store, MemoryStore)
        [(key, (_, expires_at))] = [(k, v) for k, v in store._values.items() if ":ended:" in k]
        assert 3590 <= expires_at - trio.current_time() <= 3600, key


async def test_a_draining_replica_sends_a_session_it_does_not_know_elsewhere():
    async with running_fronts(cluster={"keys": [ONE]}) as a, running_fronts(cluster={"keys": [ONE]}) as b:
        session = await a.initialize()
        b.hub.router.handle(DrainingStarted())
        response = await post(b, session, CALL)
        assert response.status == 503 and response.headers["retry-after"] == "1", response
        assert b.http.sessions.by_id == {} and b.hub.admission.sessions == 0
        assert (await post(a, session, CALL)).status == 200  # still served where it is known


async def test_a_sealed_id_past_its_lifetime_is_not_adopted():
    cluster = {"keys": [ONE], "session_lifetime": 3600.0}
    async with running_fronts(cluster=cluster) as a, running_fronts(cluster=cluster) as b:
        session = await a.initialize()
        now = b.http.sessions.wall_clock()
        b.http.sessions.wall_clock = lambda: now + 3601
        response = await post(b, session, CALL)
        assert response.status == 404 and b"Session not found" in response.body
        assert b.http.sessions.by_id == {} and b.hub.admission.sessions == 0
        b.http.sessions.wall_clock = lambda: now + 3500
        assert (await post(b, session, CALL)).status == 200
        # Once held, it goes on while in use: the lifetime is for adopting an id.
        b.http.sessions.wall_clock = lambda: now + 7200
        assert (await post(b, session, CALL)).status == 200


async def test_any_session_id_may_be_as_long_as_a_sealed_one():
    async with running_fronts() as a, running_fronts(cluster={"keys": [ONE]}) as b:
        for fronts in (a, b):
            unknown = await post(fronts, "x" * 1000, CALL)
            assert unknown.status == 404 and b"Session not found" in unknown.body, unknown
            too_long = await post(fronts, "x" * 1025, CALL)
            assert too_long.status == 400 and b"1 to 1024 visible ASCII characters" in too_long.body

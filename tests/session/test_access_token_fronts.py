"""OAuth access tokens on every network front (Streamable HTTP with sessions and stateless
requests, legacy SSE, WebSocket, the admin paths), against an in-test authorization
server: the challenge a refused request gets, the metadata it points at, the principal a
session is bound to, the profile its claims choose, and no token anywhere it should not be."""

from __future__ import annotations

import json
import logging

import pytest
import trio
import trio_websocket

from aggregator.mcp.modern import CLIENT_CAPABILITIES, PROTOCOL_VERSION
from tests.loopback import INIT
from tests.oauth import RESOURCE, AuthServer, auth_table
from tests.rawhttp import read_response_async, request_bytes
from tests.session.fronts import EventStream, running_fronts

METADATA_URL = "http://127.0.0.1/.well-known/oauth-protected-resource/mcp"
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
UPGRADE = {
    "upgrade": "websocket",
    "connection": "Upgrade",
    "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    "sec-websocket-version": "13",
}
TOOLS_LIST = {
    "jsonrpc": "2.0",
    "id": 5,
    "method": "tools/list",
    "params": {"_meta": {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}}},
}


async def status_of(port: int, method: str, path: str, headers: dict[str, str]) -> int:
    """The status a request on a new connection gets."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(request_bytes(method, path, headers))
        with trio.fail_after(5):
            return (await read_response_async(stream)).status
    finally:
        await stream.aclose()


@pytest.fixture
def server():
    server = AuthServer()
    yield server
    server.close()


def bearer(fronts, token: str | None, **extra: str) -> dict[str, str]:
    headers = fronts.headers(**extra)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers


def challenge_of(response) -> str:
    return response.headers["www-authenticate"]


async def test_the_protected_resource_metadata_is_served_to_anyone(server):
    async with running_fronts(auth=auth_table(server)) as fronts:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            response = await fronts.request("GET", path, headers=fronts.headers(origin="https://elsewhere.example"))
            assert response.status == 200, response
            assert json.loads(response.body) == {
                "resource": RESOURCE,
                "authorization_servers": [server.issuer],
                "scopes_supported": ["mcp", "admin"],
                "bearer_methods_supported": ["header"],
            }
            assert response.headers["access-control-allow-origin"] == "*"
        assert (await fronts.request("POST", "/.well-known/oauth-protected-resource")).status == 405


async def test_refused_tokens_get_a_challenge_that_names_the_metadata(server, caplog):
    caplog.set_level(logging.DEBUG)  # every refusal line, whatever its level
    cases = [
        ("no token", None, 401, None),
        ("a bad token", "not-a-jwt-at-all", 401, "invalid_token"),
        ("a token for another resource", server.mint(aud="https://other.example/mcp"), 401, "invalid_token"),
        ("expired", server.mint(lifetime=-3600), 401, "invalid_token"),
        ("another issuer", server.mint(iss="https://evil.example"), 401, "invalid_token"),
        ("without the required scope", server.mint(scope="other"), 403, "insufficient_scope"),
    ]
    async with running_fronts(auth=auth_table(server)) as fronts:
        for what, token, status, error in cases:
            response = await fronts.request("POST", headers=bearer(fronts, token), body=INIT)
            assert response.status == status, (what, response)
            challenge = challenge_of(response)
            assert challenge.startswith("Bearer ") and f'resource_metadata="{METADATA_URL}"' in challenge, what
            assert 'scope="mcp"' in challenge, what
            assert (f'error="{error}"' in challenge) if error else ("error=" not in challenge), (what, challenge)
        # A token in the URL is refused even beside a good one in the header, and not logged.
        in_url = server.mint()
        response = await fronts.request(
            "POST", f"/mcp?access_token={in_url}", headers=bearer(fronts, server.mint()), body=INIT
        )
        assert response.status == 401 and 'error="invalid_request"' in challenge_of(response)
    for token in [in_url, *(token for _, token, _, _ in cases)]:
        assert token is None or token not in caplog.text


async def test_a_good_token_opens_a_session_bound_to_its_principal(server):
    alice, bob = server.mint(sub="alice"), server.mint(sub="bob")
    async with running_fronts(auth=auth_table(server)) as fronts:
        response = await fronts.request("POST", headers=bearer(fronts, alice), body=INIT)
        assert response.status == 200, response
        session = response.headers["mcp-session-id"]
        fresh = server.mint(sub="alice", scope="mcp admin")  # the same user, a refreshed token
        for token, status in ((alice, 200), (fresh, 200), (bob, 404), (None, 401)):
            response = await fronts.request("POST", headers=bearer(fronts, token, mcp_session_id=session), body=PING)
            assert response.status == status, (token, response)
        # GET and DELETE are bound to the principal too.
        response = await fronts.request("DELETE", headers=bearer(fronts, bob, mcp_session_id=session))
        assert response.status == 404
        response = await fronts.request("DELETE", headers=bearer(fronts, alice, mcp_session_id=session))
        assert response.status in (200, 204)


async def test_a_stateless_modern_request_needs_a_token_too(server):
    async with running_fronts(auth=auth_table(server)) as fronts:
        modern = fronts.headers(mcp_protocol_version="2026-07-28", mcp_method="tools/list")
        response = await fronts.request("POST", headers=modern, body=TOOLS_LIST)
        assert response.status == 401 and "resource_metadata" in challenge_of(response)
        headers = {**modern, "authorization": f"Bearer {server.mint()}"}
        response = await fronts.request("POST", headers=headers, body=TOOLS_LIST)
        assert response.status == 200, response
        assert "result" in json.loads(response.body)


async def test_legacy_sse_needs_a_token_and_binds_its_session(server):
    alice, bob = server.mint(sub="alice"), server.mint(sub="bob")
    async with running_fronts(auth=auth_table(server)) as fronts:
        response = await fronts.request("GET", "/sse", headers=bearer(fronts, None, accept="text/event-stream"))
        assert response.status == 401 and "resource_metadata" in challenge_of(response)
        stream = await fronts.connect()
        response = await fronts.send(stream, "GET", "/sse", headers=bearer(fronts, alice, accept="text/event-stream"))
        events = EventStream(stream, response)
        with trio.fail_after(5):
            _, endpoint = await events.next()
        path = endpoint.decode()
        assert (await fronts.request("POST", path, headers=bearer(fronts, bob), body=PING)).status == 404
        assert (await fronts.request("POST", path, headers=bearer(fronts, None), body=PING)).status == 401
        assert (await fronts.request("POST", path, headers=bearer(fronts, alice), body=PING)).status == 202
        with trio.fail_after(5):
            _, data = await events.next()
        assert json.loads(data) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        await stream.aclose()


def introspected(server, **more):
    """An [auth] table whose issuer introspects opaque tokens."""
    issuer = {"issuer": server.issuer, "introspection_endpoint": f"{server.issuer}/introspect"}
    return auth_table(server, issuers=[issuer], **more)


async def test_each_legacy_sse_post_shows_its_token_and_never_changes_whom_the_session_acts_for(server):
    server.opaque["alice-1"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    server.opaque["alice-2"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    server.opaque["bob-1"] = {"active": True, "sub": "bob", "aud": RESOURCE, "scope": "mcp"}
    async with running_fronts(auth=introspected(server, introspection_cache_seconds=0.5)) as fronts:
        stream = await fronts.connect()
        opening = bearer(fronts, "alice-1", accept="text/event-stream")
        response = await fronts.send(stream, "GET", "/sse", headers=opening)
        events = EventStream(stream, response)
        with trio.fail_after(5):
            _, endpoint = await events.next()
        path = endpoint.decode()
        (caller,) = fronts.hub.callers.by_key.values()
        assert caller.token == "alice-1"
        # Another user's good token: not this session (404), and it acts for alice still.
        assert (await fronts.request("POST", path, headers=bearer(fronts, "bob-1"), body=PING)).status == 404
        assert caller.token == "alice-1" and caller.principal.subject == "alice"
        # Alice's refreshed token: accepted, and the one a token exchange trades from now on.
        assert (await fronts.request("POST", path, headers=bearer(fronts, "alice-2"), body=PING)).status == 202
        assert caller.token == "alice-2" and caller.principal.subject == "alice"
        with trio.fail_after(5):
            _, data = await events.next()
        assert json.loads(data) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        # The token it opened with, revoked since: refused, though its stream is open.
        server.opaque["alice-1"] = {"active": False}
        await trio.sleep(0.6)  # past what an introspection answer is trusted for
        response = await fronts.request("POST", path, headers=bearer(fronts, "alice-1"), body=PING)
        assert response.status == 401 and 'error="invalid_token"' in challenge_of(response)
        await stream.aclose()


async def test_a_websocket_session_ends_when_its_introspected_token_is_revoked(server, caplog):
    server.opaque["opaque-alice"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    async with running_fronts(auth=introspected(server, introspection_cache_seconds=1.0)) as fronts:
        with trio.fail_after(15), caplog.at_level(logging.INFO):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{fronts.ws_port}/mcp", extra_headers=[("authorization", "Bearer opaque-alice")]
            ) as socket:
                await socket.send_message(ping)
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
                asked = server.count("/introspect")
                # The issuer cannot be asked for a while: the session goes on meanwhile.
                server.mode = "error"
                for _ in range(100):  # until it has been asked twice more, and failed
                    if server.count("/introspect") >= asked + 2:
                        break
                    await trio.sleep(0.1)
                server.mode = "ok"
                await socket.send_message(ping)
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
                server.opaque["opaque-alice"] = {"active": False}
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await socket.get_message()
                assert closed.value.reason.code == 1008
                assert closed.value.reason.reason == "the access token is no longer accepted"
    said = [record.getMessage() for record in caplog.records if "no longer accepted" in record.getMessage()]
    assert said and "not active" in said[0] and "opaque-alice" not in caplog.text


async def test_a_websocket_session_with_a_jwt_is_not_asked_about_again(server):
    async with running_fronts(auth=introspected(server, introspection_cache_seconds=1.0)) as fronts:
        with trio.fail_after(10):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{fronts.ws_port}/mcp", extra_headers=[("authorization", f"Bearer {server.mint()}")]
            ) as socket:
                await trio.sleep(2.5)
                await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert server.count("/introspect") == 0


async def test_a_websocket_upgrade_needs_a_token(server):
    async with running_fronts(auth=auth_table(server)) as fronts:
        port = fronts.ws_port
        base = {"host": f"127.0.0.1:{port}", **UPGRADE}
        assert await status_of(port, "GET", "/mcp", base) == 401
        assert await status_of(port, "GET", "/mcp", {**base, "authorization": "Bearer nope"}) == 401
        forbidden = {**base, "authorization": f"Bearer {server.mint(scope='other')}"}
        assert await status_of(port, "GET", "/mcp", forbidden) == 403
        query = {**base, "authorization": f"Bearer {server.mint()}"}
        assert await status_of(port, "GET", f"/mcp?access_token={server.mint()}", query) == 401
        with trio.fail_after(10):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{port}/mcp", extra_headers=[("authorization", f"Bearer {server.mint()}")]
            ) as socket:
                await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_a_websocket_session_ends_when_its_access_token_does(server):
    async with running_fronts(auth=auth_table(server, leeway=0.0)) as fronts:
        token = server.mint(lifetime=2)
        with trio.fail_after(10):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{fronts.ws_port}/mcp", extra_headers=[("authorization", f"Bearer {token}")]
            ) as socket:
                await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await socket.get_message()
                assert closed.value.reason.code == 1008
                assert closed.value.reason.reason == "the access token expired"


async def test_the_profile_is_chosen_by_the_claims_and_the_status_shows_the_subject(server):
    profiles = {"admins": {"match": {"groups": ["admins"]}}, "readers": {}}
    admin = server.mint(sub="root", groups=["admins"], scope="mcp aggregator:admin")
    async with running_fronts(auth=auth_table(server), profiles=profiles) as fronts:
        response = await fronts.request("POST", headers=bearer(fronts, admin), body=INIT)
        assert response.status == 200, response
        response = await fronts.request("POST", headers=bearer(fronts, server.mint(sub="plain")), body=INIT)
        assert response.status == 200, response
        # A profile's path its claims do not give is a 403; one they give is served.
        plain = bearer(fronts, server.mint(sub="plain"))
        assert (await fronts.request("POST", "/mcp/admins", headers=plain, body=INIT)).status == 403
        assert (await fronts.request("POST", "/mcp/admins", headers=bearer(fronts, admin), body=INIT)).status == 200
        status = await fronts.request("GET", "/status.json", headers=bearer(fronts, admin))
        assert status.status == 200, status
        rows = json.loads(status.body)["sessions"]
        seen = {(row["profile"], row.get("principal")) for row in rows}
        assert ("admins", f"root ({server.issuer})") in seen
        assert ("default", f"plain ({server.issuer})") in seen
        assert admin.encode() not in status.body
        assert (await fronts.request("GET", "/status.json", headers=bearer(fronts, None))).status == 401


async def test_a_profile_path_the_token_does_not_give_names_the_scopes_to_ask_for(server):
    profiles = {"admins": {"scopes": ["mcp:admin"]}}
    async with running_fronts(auth=auth_table(server), profiles=profiles) as fronts:
        refused = await fronts.request("POST", "/mcp/admins", headers=bearer(fronts, server.mint()), body=INIT)
        assert refused.status == 403, refused
        assert 'error="insufficient_scope"' in challenge_of(refused) and 'scope="mcp:admin"' in challenge_of(refused)
        assert f'resource_metadata="{METADATA_URL}"' in challenge_of(refused)
        admin = bearer(fronts, server.mint(scope="mcp mcp:admin"))
        assert (await fronts.request("POST", "/mcp/admins", headers=admin, body=INIT)).status == 200


async def test_an_access_token_opens_the_admin_paths_only_with_the_admin_scopes(server):
    async with running_fronts(auth=auth_table(server)) as fronts:
        user = bearer(fronts, server.mint(sub="user"))  # the MCP endpoint's scope, no more
        for path in ("/status.json", "/metrics", "/status"):
            refused = await fronts.request("GET", path, headers=user)
            if path == "/status":  # the empty page, as without a token: no data
                assert refused.status == 200 and b"aggregator:admin" not in refused.body and b"user" not in refused.body
                continue
            assert refused.status == 403, (path, refused)
            assert b"aggregator:admin" in refused.body and b"sessions" not in refused.body
            assert 'error="insufficient_scope"' in challenge_of(refused)
            assert 'scope="aggregator:admin"' in challenge_of(refused)
        for probe in ("/healthz", "/readyz"):  # the probes: as before, any accepted token
            assert (await fronts.request("GET", probe, headers=user)).status in (200, 503), probe
        operator = bearer(fronts, server.mint(sub="operator", scope="mcp aggregator:admin"))
        assert (await fronts.request("GET", "/status.json", headers=operator)).status == 200
    async with running_fronts(auth=auth_table(server, admin_scopes=[])) as fronts:  # the operator's choice
        assert (await fronts.request("GET", "/status.json", headers=bearer(fronts, server.mint()))).status == 200


async def test_a_key_set_that_cannot_be_had_is_a_503_not_a_hang(server, caplog):
    server.mode = "slow"
    async with running_fronts(auth=auth_table(server, fetch_timeout=0.3)) as fronts:
        token = server.mint()
        with caplog.at_level(logging.ERROR), trio.fail_after(5):
            response = await fronts.request("POST", headers=bearer(fronts, token), body=INIT)
        assert response.status == 503 and "retry-after" in response.headers, response
        assert "cannot be fetched" in caplog.text and token not in caplog.text


async def test_static_tokens_keep_working_beside_access_tokens(server):
    static = "a-static-token-of-sixteen-characters"
    async with running_fronts(auth=auth_table(server), auth_tokens=[static]) as fronts:
        assert (await fronts.request("POST", headers=bearer(fronts, static), body=INIT)).status == 200
        assert (await fronts.request("POST", headers=bearer(fronts, server.mint()), body=INIT)).status == 200
        assert (await fronts.request("POST", headers=bearer(fronts, "x" * 40), body=INIT)).status == 401


async def test_a_session_serves_only_tokens_that_still_give_its_profile_on_its_own_path(server):
    profiles = {"admins": {"match": {"groups": ["admins"]}}}
    admin, former = server.mint(sub="alice", groups=["admins"]), server.mint(sub="alice", groups=[])
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x__y", "arguments": {}}}
    async with running_fronts(auth=auth_table(server), profiles=profiles) as fronts:
        opened = await fronts.request("POST", "/mcp/admins", headers=bearer(fronts, admin), body=INIT)
        assert opened.status == 200, opened
        session = opened.headers["mcp-session-id"]
        for body in (TOOLS_LIST | {"params": {}}, call, PING):
            # The same user, whose token no longer carries the group that chose the profile.
            refused = await fronts.request(
                "POST", "/mcp/admins", headers=bearer(fronts, former, mcp_session_id=session), body=body
            )
            assert refused.status == 403, (body, refused)
            assert 'error="insufficient_scope"' in challenge_of(refused)
        # Its id on another profile's path (the MCP endpoint's own) is unknown there.
        for token in (former, admin):
            elsewhere = await fronts.request("POST", headers=bearer(fronts, token, mcp_session_id=session), body=PING)
            assert elsewhere.status == 404, elsewhere
        get = bearer(fronts, former, mcp_session_id=session, accept="text/event-stream")
        assert (await fronts.request("GET", "/mcp/admins", headers=get)).status == 403
        # A token that still gives it (a refreshed one too) is served, as before.
        for token in (admin, server.mint(sub="alice", groups=["admins"], scope="mcp admin")):
            served = await fronts.request(
                "POST", "/mcp/admins", headers=bearer(fronts, token, mcp_session_id=session), body=PING
            )
            assert served.status == 200, served
        # A session opened on /mcp, whose token chose the profile, loses it the same way.
        opened = await fronts.request("POST", headers=bearer(fronts, admin), body=INIT)
        session = opened.headers["mcp-session-id"]
        served = await fronts.request("POST", headers=bearer(fronts, admin, mcp_session_id=session), body=PING)
        assert served.status == 200, served
        refused = await fronts.request("POST", headers=bearer(fronts, former, mcp_session_id=session), body=PING)
        assert refused.status == 403 and 'error="insufficient_scope"' in challenge_of(refused), refused


async def test_an_introspected_token_asked_every_time_gets_in_on_every_front_and_is_asked_each_request(server):
    # introspection_cache_seconds = 0: the answer is trusted for no time at all, yet the
    # request it was asked for goes on with it (its profile, its session); the next asks again.
    server.opaque["opaque-alice"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    async with running_fronts(auth=introspected(server, introspection_cache_seconds=0)) as fronts:
        headers = bearer(fronts, "opaque-alice")
        response = await fronts.request("POST", headers=headers, body=INIT)
        assert response.status == 200, response
        session = response.headers["mcp-session-id"]
        asked = server.count("/introspect")
        response = await fronts.request(
            "POST", headers=bearer(fronts, "opaque-alice", mcp_session_id=session), body=PING
        )
        assert response.status == 200, response
        assert server.count("/introspect") == asked + 1  # asked again for the next request
        modern = fronts.headers(mcp_protocol_version="2026-07-28", mcp_method="tools/list")
        response = await fronts.request(
            "POST", headers={**modern, "authorization": "Bearer opaque-alice"}, body=TOOLS_LIST
        )
        assert response.status == 200, response
        stream = await fronts.connect()
        response = await fronts.send(
            stream, "GET", "/sse", headers=bearer(fronts, "opaque-alice", accept="text/event-stream")
        )
        assert response.status == 200, response
        await stream.aclose()
        with trio.fail_after(10):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{fronts.ws_port}/mcp", extra_headers=[("authorization", "Bearer opaque-alice")]
            ) as socket:
                await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
        # Revoked: the next request asks, and is refused.
        server.opaque["opaque-alice"] = {"active": False}
        response = await fronts.request(
            "POST", headers=bearer(fronts, "opaque-alice", mcp_session_id=session), body=PING
        )
        assert response.status == 401, response


async def open_get_stream(fronts, token: str) -> tuple[EventStream, str]:
    """A session opened with ``token``, and its GET stream."""
    response = await fronts.request("POST", headers=bearer(fronts, token), body=INIT)
    assert response.status == 200, response
    session = response.headers["mcp-session-id"]
    stream = await fronts.connect()
    headers = bearer(fronts, token, accept="text/event-stream", mcp_session_id=session)
    return EventStream(stream, await fronts.send(stream, "GET", headers=headers)), session


async def test_a_get_stream_ends_when_its_access_token_expires_and_the_session_stays(server, caplog):
    async with running_fronts(auth=auth_table(server, leeway=0.0)) as fronts:
        token = server.mint(lifetime=2)
        with caplog.at_level(logging.INFO), trio.fail_after(10):
            events, session = await open_get_stream(fronts, token)
            started = trio.current_time()
            await events.wait_closed()
            assert events.ended and trio.current_time() - started > 1  # ended cleanly, at its exp
            assert "its GET stream ended: its access token expired" in caplog.text
            # The client comes back with its new token: the same session, a new stream.
            fresh = server.mint()
            stream = await fronts.connect()
            headers = bearer(fronts, fresh, accept="text/event-stream", mcp_session_id=session)
            response = await fronts.send(stream, "GET", headers=headers)
            assert response.status == 200, response
            await stream.aclose()
    assert token not in caplog.text and fresh not in caplog.text


async def test_a_get_stream_ends_when_its_introspected_token_is_revoked(server, caplog):
    server.opaque["opaque-alice"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    async with running_fronts(auth=introspected(server, introspection_cache_seconds=1.0)) as fronts:
        with caplog.at_level(logging.INFO), trio.fail_after(10):
            events, _ = await open_get_stream(fronts, "opaque-alice")
            await trio.sleep(1.5)  # asked again meanwhile: still good, the stream goes on
            assert not events.ended
            server.opaque["opaque-alice"] = {"active": False}
            await events.wait_closed()
            assert events.ended
    said = [record.getMessage() for record in caplog.records if "GET stream ended" in record.getMessage()]
    assert len(said) == 1 and said[0].endswith("its access token is no longer accepted (the token is not active)")
    assert "opaque-alice" not in caplog.text


@pytest.mark.parametrize("how", ["expires", "revoked"])
async def test_a_legacy_sse_stream_ends_when_its_access_token_does(server, caplog, how):
    server.opaque["opaque-alice"] = {"active": True, "sub": "alice", "aud": RESOURCE, "scope": "mcp"}
    auth = introspected(server, introspection_cache_seconds=1.0, leeway=0.0)
    token = server.mint(lifetime=2) if how == "expires" else "opaque-alice"
    async with running_fronts(auth=auth) as fronts:
        with caplog.at_level(logging.INFO), trio.fail_after(10):
            stream = await fronts.connect()
            response = await fronts.send(
                stream, "GET", "/sse", headers=bearer(fronts, token, accept="text/event-stream")
            )
            events = EventStream(stream, response)
            _, endpoint = await events.next()
            if how == "revoked":
                server.opaque["opaque-alice"] = {"active": False}
            await events.wait_closed()
            assert events.ended
            # Its session is gone with it.
            response = await fronts.request("POST", endpoint.decode(), headers=bearer(fronts, server.mint()), body=PING)
            assert response.status == 404
    expected = "its access token expired" if how == "expires" else "no longer accepted (the token is not active)"
    assert "legacy sse session" in caplog.text and expected in caplog.text
    assert token not in caplog.text

"""Each user's own grants on two replicas (``aggregator serve --http`` processes with the same
``[cluster] keys`` and ``store``, a real redis-server) behind a round-robin balancer with no
stickiness (``round_robin``): the connect link, the sign-in's return, the consent button and
the callback each land on either replica; the grant is used by both; a revoke through the
CLI holds on both; a grant about to expire, used on both at once, is refreshed once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.cluster.redis_server import RedisServer, needs_redis, redis_server
from tests.credentials.peers import JwtIssuer, ProtectedMcp
from tests.e2e.conftest import ROOT, http_proxy, write_config
from tests.e2e.identity import RESOURCE, VAULT_KEY, Session, claims_of, sign_in, token_of
from tests.e2e.round_robin import round_robin
from tests.loopback import free_port

pytestmark = [pytest.mark.e2e, needs_redis]
KEY = "cluster-key-" + "k" * 32


@pytest.fixture
def protected(authserver):
    server = ProtectedMcp(JwtIssuer(authserver.issuer))
    yield server
    server.close()


def replica(tmp_path: Path, name: str, authserver, protected, store: RedisServer, public: int) -> Path:
    """Replica ``name``'s config (its own directory: its own log, and a vault file it must
    not use): the users' grants in the store, the browser sent back to the balancer."""
    directory = tmp_path / name
    directory.mkdir()
    return write_config(
        directory,
        f'''
[auth]
resource = "{RESOURCE}"
scopes_supported = ["mcp"]

[[auth.issuers]]
issuer = "{authserver.issuer}"

[credentials]
vault = "tokens.db"
vault_key = "{VAULT_KEY}"
redirect_uri = "http://127.0.0.1:{public}/oauth/callback"

[servers.docs]
url = "{protected.url}"
auth = "oauth"

[cluster]
keys = ["{KEY}"]
replica = "{name}"
store = "{store.url}"
prefix = "creds"
''',
        startup_timeout=5.0,
    )


def redis_cli(store: RedisServer, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(store.port), "--raw", *args], capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def grants(store: RedisServer) -> dict[str, dict]:
    """The rows in the store, by field: what is not secret in the clear, the tokens sealed."""
    lines = redis_cli(store, "HGETALL", "creds:vault").strip().splitlines()
    return {field: json.loads(value) for field, value in zip(lines[::2], lines[1::2], strict=True)}


def test_a_grant_given_through_one_replica_is_used_revoked_and_refreshed_on_both(tmp_path, authserver, protected):
    public = free_port()
    alice_token = token_of(authserver, "alice")
    with redis_server(tmp_path) as store:
        config_a = replica(tmp_path, "a", authserver, protected, store, public)
        config_b = replica(tmp_path, "b", authserver, protected, store, public)
        with (
            http_proxy(config_a) as (port_a, log_a),
            http_proxy(config_b) as (port_b, log_b),
            round_robin([port_a, port_b], public) as (_, balancer),  # (/readyz wants a token with [auth])
        ):
            on_a, on_b = Session(port_a, alice_token), Session(port_b, alice_token)
            # The link is made on A; it names the balancer, not a replica.
            url = on_a.whoami()["error"]["data"]["url"]
            assert url.startswith(f"http://127.0.0.1:{public}/oauth/connect?flow=")
            # Alice goes the whole way through the balancer: the connect page, the sign-in's
            # return, the consent page, its button and the callback alternate between A and B.
            # (One request first, so that the callback is B's: the link was made on A.)
            assert httpx.get(f"http://127.0.0.1:{public}/oauth/connect?flow=made-up").status_code == 400
            done = sign_in(url, "alice")
            assert done.status_code == 200, done.text
            # connect (B), signed-in (A), connect (B), the button (A), the callback (B)
            assert [(index, verb) for index, verb, _ in balancer.seen[1:]] == [
                (1, "GET"),
                (0, "GET"),
                (1, "GET"),
                (0, "POST"),
                (1, "GET"),
            ], balancer.seen
            # The callback landed on one replica; both use her grant.
            assert claims_of(on_a.whoami())["sub"] == "alice"
            assert claims_of(on_b.whoami())["sub"] == "alice"
            # In the store, sealed: no token in the clear; the vault file is not used.
            [row] = grants(store).values()
            assert row["subject"] == "alice" and row["server"] == "docs"
            raw = redis_cli(store, "HGETALL", "creds:vault")
            for header in protected.seen:
                assert not header or header[7:] not in raw
            assert not (tmp_path / "a" / "tokens.db").exists() and not (tmp_path / "b" / "tokens.db").exists()
            # `aggregator auth list` reads the store.
            listed = subprocess.run(
                [sys.executable, "-m", "aggregator", "auth", "list", "--config", str(config_b)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert listed.returncode == 0 and "alice" in listed.stdout and "refreshable" in listed.stdout, listed

            # About to expire, and used on both replicas at once: one refresh (the refresh
            # token rotates: a second refresh would spend a used one, and lose the grant).
            sessions = [Session(port, alice_token) for port in (port_a, port_b, port_a, port_b)]  # one call each
            [(field, row)] = grants(store).items()
            redis_cli(store, "HSET", "creds:vault", field, json.dumps({**row, "expires_at": 0}))
            answers: list[dict] = []

            def call(session: Session) -> None:
                answers.append(session.whoami())

            threads = [threading.Thread(target=call, args=(session,)) for session in sessions]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert [claims_of(answer)["sub"] for answer in answers] == ["alice"] * 4
            refreshed = log_a.read_text().count("refreshed the token of") + log_b.read_text().count(
                "refreshed the token of"
            )
            assert refreshed == 1
            [row] = grants(store).values()
            assert row["expires_at"] > 0

            # Revoked through the CLI (on A's config): both replicas ask again at once.
            revoke = subprocess.run(
                [sys.executable, "-m", "aggregator", "auth", "revoke", "alice", "docs", "--config", str(config_a)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert revoke.returncode == 0, revoke.stderr
            assert "removed" in revoke.stdout
            assert grants(store) == {}
            assert on_a.whoami()["error"]["data"]["reason"] == "unauthorized"
            assert on_b.whoami()["error"]["data"]["reason"] == "unauthorized"
        text = log_a.read_text() + log_b.read_text()
    assert "Traceback" not in text, text[-3000:]
    for header in protected.seen:
        assert not header or header[7:] not in text
    assert alice_token not in text and "code=" not in text and "state=" not in text

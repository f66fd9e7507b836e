"""The token vault: encrypted at rest, refreshed once however many ask, revoked at the
authorization server, and the commands that list and revoke."""

from __future__ import annotations

import base64
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time

import attrs
import pytest
import trio

from aggregator.credentials import CredentialError, Principal
from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.keeper import UserTokens
from aggregator.credentials.tokens import ClientCredentials, TokenSet
from aggregator.credentials.vault import Grant, Sealer, TokenVault, VaultFailed
from tests.credentials.harness import KEY
from tests.credentials.peers import AuthServer

ALICE = Principal(issuer="https://idp.example", subject="alice")
OTHER_KEY = b"k" * 32


def _key() -> bytes:
    import base64

    return base64.b64decode(KEY)


def _grant(auth: AuthServer, resource: str = "https://docs.example/mcp", expires_in: float = 3600) -> Grant:
    """A grant as the flow leaves it, with tokens the authorization server knows."""
    issued = auth._issue("alice", resource, "mcp", "configured-client")
    return Grant(
        principal=ALICE,
        server="docs",
        tokens=TokenSet(
            access_token=issued["access_token"],
            refresh_token=issued["refresh_token"],
            expires_at=time.time() + expires_in,
            scope="mcp",
        ),
        token_endpoint=f"{auth.issuer}/token",
        revocation_endpoint=f"{auth.issuer}/revoke",
        client=ClientCredentials(client_id="configured-client"),
        resource=resource,
    )


async def test_no_token_is_stored_in_plain_text(tmp_path, auth_server):
    path = str(tmp_path / "tokens.db")
    vault = await TokenVault.open(path, _key())
    grant = _grant(auth_server)
    secret_client = attrs.evolve(
        grant, server="other", client=ClientCredentials(client_id="c", client_secret="sekrit-value")
    )
    await vault.put(grant)
    await vault.put(secret_client)
    assert await vault.get(ALICE, "docs") == grant
    await vault.aclose()
    raw = (tmp_path / "tokens.db").read_bytes()
    for secret in (grant.tokens.access_token, grant.tokens.refresh_token, "sekrit-value"):
        assert secret.encode() not in raw
    assert b"alice" in raw and b"docs" in raw  # who and which server are not secret
    assert (tmp_path / "tokens.db").stat().st_mode & 0o077 == 0


async def test_another_key_or_a_moved_value_does_not_open(tmp_path, auth_server):
    path = str(tmp_path / "tokens.db")
    vault = await TokenVault.open(path, _key())
    await vault.put(_grant(auth_server))
    await vault.aclose()
    with pytest.raises(CredentialError, match="does not open with credentials.vault_key"):
        await TokenVault.open(path, OTHER_KEY)  # refused whole, at once (no row opens with it)
    with sqlite3.connect(path) as db:  # a vault made before it kept a key check: its rows tell
        db.execute("DELETE FROM key_check")
    with pytest.raises(CredentialError, match="does not open with credentials.vault_key"):
        await TokenVault.open(path, OTHER_KEY)
    vault = await TokenVault.open(path, _key())  # the right key: marks it again
    await vault.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM key_check").fetchone() == (1,)
    with sqlite3.connect(path) as db:  # a row's sealed tokens copied under another user
        db.execute("UPDATE grants SET subject = 'mallory'")
    vault = await TokenVault.open(path, _key())
    assert await vault.get(Principal(issuer=ALICE.issuer, subject="mallory"), "docs") is None
    await vault.aclose()


def _under_other_key(vault: TokenVault) -> TokenVault:
    """The same vault file, writing rows sealed with another key (rows copied from another
    vault, or written by a proxy given another key before the vault kept a key check)."""
    return TokenVault(vault._db, Sealer(OTHER_KEY), vault.path)


async def test_a_row_sealed_with_another_key_is_no_grant_and_is_replaced(tmp_path, auth_server, caplog):
    path = str(tmp_path / "tokens.db")
    grant = _grant(auth_server)
    vault = await TokenVault.open(path, _key())  # the vault's key check opens; these rows do not
    await _under_other_key(vault).put(grant)
    await _under_other_key(vault).put(attrs.evolve(grant, principal=Principal(issuer=ALICE.issuer, subject="bob")))
    with caplog.at_level(logging.INFO, logger="aggregator.credentials.vault"):
        assert await vault.get(ALICE, "docs") is None
        assert await vault.get(Principal(issuer=ALICE.issuer, subject="bob"), "docs") is None
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text  # once per server
    assert path in warnings[0].getMessage() and "credentials.vault_key" in warnings[0].getMessage()
    assert grant.tokens.access_token not in caplog.text
    assert [entry.opens for entry in await vault.entries()] == [False, False]
    assert TokenVault.unopened(path, _key()) == 2
    await vault.put(grant)  # granted again: the row is replaced
    assert await vault.get(ALICE, "docs") == grant
    assert [entry.opens for entry in await vault.entries()] == [True, False]
    await vault.aclose()
    assert TokenVault.unopened(path, _key()) == 1


async def test_two_callers_at_once_refresh_once(tmp_path):
    auth = AuthServer(refresh_delay=0.3)
    try:
        vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
        stale = _grant(auth, expires_in=10)  # within the refresh margin
        await vault.put(stale)
        async with _fetcher() as fetcher:
            tokens = UserTokens(vault, fetcher, margin=60)
            got: list[str | None] = []

            async def ask() -> None:
                got.append(await tokens.access_token(ALICE, "docs"))

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(ask)
            assert auth.counts["refresh_token"] == 1 and tokens.refreshes == 1
            assert len(set(got)) == 1 and got[0] != stale.tokens.access_token
            stored = await vault.get(ALICE, "docs")
            assert stored is not None and stored.tokens.access_token == got[0]
            assert stored.tokens.refresh_token != stale.tokens.refresh_token  # rotated, and kept
            # Fresh now: asked again, no refresh.
            assert await tokens.access_token(ALICE, "docs") == got[0]
            assert auth.counts["refresh_token"] == 1
        await vault.aclose()
    finally:
        auth.close()


async def test_a_refused_refresh_forgets_the_grant(tmp_path, auth_server):
    vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
    stale = _grant(auth_server, expires_in=-5)
    auth_server.refresh.clear()  # revoked at the authorization server
    await vault.put(stale)
    async with _fetcher() as fetcher:
        assert await UserTokens(vault, fetcher, margin=60).access_token(ALICE, "docs") is None
    assert await vault.get(ALICE, "docs") is None
    await vault.aclose()


async def test_revoke_removes_and_revokes_at_the_authorization_server(tmp_path, auth_server):
    vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
    grant = _grant(auth_server)
    await vault.put(grant)
    await vault.put(attrs.evolve(grant, server="wiki", revocation_endpoint=None))
    async with _fetcher() as fetcher:
        done = await UserTokens(vault, fetcher, margin=60).revoke("alice", "docs")
    assert [(g.server, outcome) for g, outcome in done] == [("docs", "removed and revoked")]
    assert auth_server.revoked == [grant.tokens.refresh_token, grant.tokens.access_token]
    assert await vault.get(ALICE, "docs") is None and await vault.get(ALICE, "wiki") is not None
    await vault.aclose()


def _fetcher():
    import httpx

    class Opened:
        async def __aenter__(self) -> Fetcher:
            self.client = httpx.AsyncClient()
            return Fetcher(self.client, timeout=5, max_bytes=65536)

        async def __aexit__(self, *exc: object) -> None:
            await self.client.aclose()

    return Opened()


def _config_file(tmp_path, auth: AuthServer) -> str:
    path = tmp_path / "aggregator.toml"
    path.write_text(
        f'[credentials]\nvault = "tokens.db"\nvault_key = "{KEY}"\n'
        '[servers.docs]\nurl = "https://docs.example/mcp"\nauth = "oauth"\n'
        '[servers.wiki]\nurl = "https://wiki.example/mcp"\nauth = "oauth"\n'
    )
    return str(path)


def aggregator(*args: str) -> subprocess.CompletedProcess[str]:
    """The command, as a user runs it."""
    env = {key: value for key, value in os.environ.items() if key != "AGGREGATOR_VAULT_KEY"}
    argv = [sys.executable, "-m", "aggregator", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_auth_list_shows_no_secret_and_revoke_empties_it(tmp_path, auth_server):
    config = _config_file(tmp_path, auth_server)
    grant = _grant(auth_server)

    async def fill() -> None:
        vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
        await vault.put(grant)
        await vault.put(attrs.evolve(grant, server="wiki"))
        await vault.aclose()

    trio.run(fill)
    listed = aggregator("auth", "list", "--config", config)
    assert listed.returncode == 0, listed.stderr
    assert "alice" in listed.stdout and "docs" in listed.stdout and "wiki" in listed.stdout
    assert "refreshable" in listed.stdout
    assert grant.tokens.access_token not in listed.stdout and grant.tokens.refresh_token not in listed.stdout
    checked = aggregator("check", "--config", config)
    assert "sealed with another key" not in checked.stdout + checked.stderr
    revoked = aggregator("auth", "revoke", "alice", "docs", "--config", config)
    assert revoked.returncode == 0 and "server docs: removed and revoked" in revoked.stdout, revoked.stderr
    listed = aggregator("auth", "list", "--config", config)
    assert "wiki" in listed.stdout and "\tdocs\t" not in listed.stdout
    assert aggregator("auth", "revoke", "alice", "--config", config).returncode == 0
    again = aggregator("auth", "revoke", "alice", "--config", config)
    assert again.returncode == 1 and "nothing to revoke" in again.stdout
    unknown = aggregator("auth", "revoke", "alice", "nosuch", "--config", config)
    assert unknown.returncode == 2 and "servers.nosuch: no such server" in unknown.stderr


def test_auth_list_and_check_tell_of_rows_sealed_with_another_key(tmp_path, auth_server):
    config = _config_file(tmp_path, auth_server)
    grant = _grant(auth_server)

    async def fill() -> None:
        vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
        await vault.put(grant)
        await _under_other_key(vault).put(attrs.evolve(grant, server="wiki"))
        await vault.aclose()

    trio.run(fill)
    listed = aggregator("auth", "list", "--config", config)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("\t")[2]: line for line in listed.stdout.splitlines()[1:]}
    assert "refreshable" in rows["docs"] and "sealed with another key" in rows["wiki"], listed.stdout
    checked = aggregator("check", "--config", config)
    assert "warning: the token vault" in checked.stdout and "1 user grant(s) sealed with another key" in checked.stdout
    assert "credentials.vault_key" in checked.stdout, checked.stdout


def test_a_config_with_an_oauth_server_and_no_vault_key_is_refused(tmp_path):
    path = tmp_path / "aggregator.toml"
    path.write_text('[servers.docs]\nurl = "https://docs.example/mcp"\nauth = "oauth"\n')
    for command in ("check", "serve"):
        refused = aggregator(command, "--config", str(path))
        assert refused.returncode == 2, refused.stderr
        assert "credentials.vault_key: required" in refused.stderr and "AGGREGATOR_VAULT_KEY" in refused.stderr


def test_a_vault_that_cannot_be_opened_is_a_config_error_for_check_and_serve(tmp_path):
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("these are notes, not an SQLite file\n" * 50)
    for vault, reason in ((tmp_path / "no-such-dir" / "tokens.db", "No such file"), (not_a_database, "not a database")):
        path = tmp_path / "aggregator.toml"
        path.write_text(
            f'[credentials]\nvault = "{vault}"\nvault_key = "{KEY}"\n'
            '[servers.f]\nurl = "http://127.0.0.1:9/mcp"\nauth = "oauth"\n'
        )
        with socket.socket() as probe:  # a free port: the vault is refused before any listener opens
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        for command in (["check"], ["serve", "--http", f"127.0.0.1:{port}"]):
            refused = aggregator(*command, "--config", str(path))
            assert refused.returncode == 2, refused.stderr
            assert "credentials.vault: cannot open the token vault" in refused.stderr and reason in refused.stderr
            assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 2, refused.stderr


def test_a_vault_that_fails_at_start_is_a_config_error_naming_the_file(tmp_path):
    made = tmp_path / "made.db"
    TokenVault.check(str(made), _key())  # a vault made with KEY
    directory = tmp_path / "a-directory"
    directory.mkdir()
    other_key = base64.b64encode(OTHER_KEY).decode()
    cases = [
        (directory, KEY, "cannot open the token vault", "Is a directory"),
        ("/dev/full", KEY, "cannot open the token vault", "disk is full"),  # every write fails
        (made, other_key, "does not open with credentials.vault_key", "AGGREGATOR_VAULT_KEY"),
    ]
    for vault, key, said, reason in cases:
        path = tmp_path / "aggregator.toml"
        path.write_text(
            f'[credentials]\nvault = "{vault}"\nvault_key = "{key}"\n'
            '[servers.f]\nurl = "http://127.0.0.1:9/mcp"\nauth = "oauth"\n'
        )
        refused = aggregator("check", "--config", str(path))
        assert refused.returncode == 2, refused.stderr
        assert "credentials.vault: " in refused.stderr and said in refused.stderr, refused.stderr
        assert refused.stderr.count(str(vault)) == 1 and f"token vault {vault}" in refused.stderr, refused.stderr
        assert reason in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 2, refused.stderr


async def test_a_full_disk_fails_that_one_write_and_the_vault_goes_on(tmp_path, auth_server, caplog):
    path = str(tmp_path / "tokens.db")
    vault = await TokenVault.open(path, _key())
    grant = _grant(auth_server)
    await vault.put(grant)
    pages = vault._db.execute("PRAGMA page_count").fetchone()[0]
    vault._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full: no page more
    big = attrs.evolve(grant, server="wiki", client=ClientCredentials(client_id="c", client_secret="s" * 20_000))
    with caplog.at_level(logging.ERROR), pytest.raises(VaultFailed) as failed:
        await vault.put(big)
    assert path not in str(failed.value) and "s" * 100 not in caplog.text
    assert f"the token vault {path} (credentials.vault) failed" in caplog.text and "full" in caplog.text
    assert await vault.get(ALICE, "docs") == grant  # what it held is still served
    assert await vault.get(ALICE, "wiki") is None
    vault._db.execute("PRAGMA max_page_count = 1073741823")  # room again: the next write succeeds
    await vault.put(big)
    assert await vault.get(ALICE, "wiki") == big
    await vault.aclose()


async def test_a_refresh_the_vault_cannot_keep_is_kept_in_memory_until_the_vault_takes_it(
    tmp_path, auth_server, caplog
):
    # The authorization server rotates refresh tokens: the old one is dead once it answered.
    # Dropping its answer because the vault cannot store it would make the user grant again.
    vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
    old = _grant(auth_server, expires_in=10)  # within the refresh margin
    await vault.put(old)
    vault._db.execute("PRAGMA query_only = 1")  # every write fails, as on a full disk
    now = [time.time()]
    async with _fetcher() as fetcher:
        tokens = UserTokens(vault, fetcher, margin=60, clock=lambda: now[0])
        with caplog.at_level(logging.INFO), trio.fail_after(10):
            first = await tokens.access_token(ALICE, "docs")
            assert first is not None and first != old.tokens.access_token  # served: refreshed
            assert "cannot be stored" in caplog.text and "kept in memory" in caplog.text
            assert await tokens.access_token(ALICE, "docs") == first  # from memory, not refreshed again
            now[0] += 60  # its retry is due; the vault still fails
            assert await tokens.access_token(ALICE, "docs") == first
            assert "still not stored" in caplog.text
            assert tokens.refreshes == 1
            assert (await vault.get(ALICE, "docs")).tokens == old.tokens  # nothing was written
            vault._db.execute("PRAGMA query_only = 0")  # the vault takes writes again
            assert await tokens.access_token(ALICE, "docs") == first  # not due yet: in memory still
            now[0] += 60
            assert await tokens.access_token(ALICE, "docs") == first
            assert "is stored now" in caplog.text
        stored = await vault.get(ALICE, "docs")
        assert stored is not None and stored.tokens.access_token == first
        assert stored.tokens.refresh_token not in (None, old.tokens.refresh_token)  # the rotated one
        assert stored.tokens.refresh_token in auth_server.refresh  # ... which still works
        assert tokens.refreshes == 1
    for token in (first, stored.tokens.refresh_token, old.tokens.refresh_token):
        assert token not in caplog.text
    await vault.aclose()


async def test_a_refreshed_grant_kept_in_memory_is_dropped_when_revoked(tmp_path, auth_server):
    vault = await TokenVault.open(str(tmp_path / "tokens.db"), _key())
    await vault.put(_grant(auth_server, expires_in=10))
    vault._db.execute("PRAGMA query_only = 1")
    async with _fetcher() as fetcher:
        tokens = UserTokens(vault, fetcher, margin=60)
        with trio.fail_after(10):
            assert await tokens.access_token(ALICE, "docs") is not None
            vault._db.execute("PRAGMA query_only = 0")
            await tokens.revoke("alice", "docs")
            assert await tokens.access_token(ALICE, "docs") is None
    assert await vault.get(ALICE, "docs") is None  # never written back
    await vault.aclose()

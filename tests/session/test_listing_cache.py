"""The listing cache (``upstreams.listing_cache``) on a real directory, and the config keys
that choose lazy start and idle stop: a kept listing reads back, another configuration is
another key, anything not a valid listing is no cache, writes are atomic and bounded."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import attrs
import pytest

from aggregator.config import ServerConfig, structure_config
from aggregator.config.model import Config, ProxyConfig
from aggregator.errors import ConfigError
from aggregator.upstreams import listing_cache

SERVER = ServerConfig(name="files", command="npx", args=("server-files", "/tmp"), env={"TOKEN": "s3cret"})
LISTING = {"tools": [{"name": "read", "inputSchema": {"type": "object"}, "x": 1.50}], "prompts": []}


def test_a_kept_listing_reads_back(tmp_path: Path) -> None:
    listing_cache.write(tmp_path, SERVER, LISTING)
    back = listing_cache.read(tmp_path, SERVER)
    assert back is not None and back["tools"][0]["name"] == "read" and back["prompts"] == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert b"s3cret" not in listing_cache.cache_path(tmp_path, SERVER).read_bytes()  # env values are not in it


@pytest.mark.parametrize(
    "changed",
    [
        {"command": "uvx"},
        {"args": ("server-files", "/home")},
        {"env": {"TOKEN": "s3cret", "MORE": "1"}},
        {"command": None, "url": "http://127.0.0.1:9/mcp"},
    ],
)
def test_another_configuration_is_another_key(tmp_path: Path, changed: dict[str, object]) -> None:
    listing_cache.write(tmp_path, SERVER, LISTING)
    assert listing_cache.read(tmp_path, attrs.evolve(SERVER, **changed)) is None


def test_an_env_value_is_no_part_of_the_key(tmp_path: Path) -> None:
    listing_cache.write(tmp_path, SERVER, LISTING)
    assert listing_cache.read(tmp_path, attrs.evolve(SERVER, env={"TOKEN": "rotated"})) is not None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"version": 1}',
        b'{"version": 99, "key": "KEY", "listing": {}}',
        b'{"version": 1, "key": "other", "listing": {}}',
        b'{"version": 1, "key": "KEY", "listing": []}',
        b'{"version": 1, "key": "KEY", "listing": {"widgets": []}}',
        b'{"version": 1, "key": "KEY", "listing": {"tools": {}}}',
        b'{"version": 1, "key": "KEY", "listing": {"tools": [{"title": "no name"}]}}',
        b'{"version": 1, "key": "KEY", "listing": {"resources": [{"uri": 5}]}}',
        b'{"version": 1, "key": "KEY", "listing": {"tools": [' + b"[" * 200 + b"]" * 200 + b"]}}",
    ],
)
def test_what_is_not_a_valid_listing_is_no_cache(tmp_path: Path, body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    path = listing_cache.cache_path(tmp_path, SERVER)
    path.write_bytes(body.replace(b"KEY", listing_cache.cache_key(SERVER).encode()))
    assert listing_cache.read(tmp_path, SERVER) is None
    assert "is not used" in caplog.text


def test_a_listing_too_large_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing_cache.write(tmp_path, SERVER, LISTING)
    monkeypatch.setattr(listing_cache, "MAX_BYTES", 64)
    listing_cache.write(tmp_path, SERVER, LISTING)
    assert listing_cache.read(tmp_path, SERVER) is None  # the old one went too
    assert not listing_cache.cache_path(tmp_path, SERVER).exists()


def test_a_directory_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    listing_cache.write(blocked / "sub", SERVER, LISTING)
    assert "cannot cache its listing" in caplog.text


def test_the_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert listing_cache.cache_dir(Config()) == tmp_path / "mcp-aggregator" / "listings"
    relative = Config(proxy=ProxyConfig(cache_dir="cache"), directory=str(tmp_path / "conf"))
    assert listing_cache.cache_dir(relative) == tmp_path / "conf" / "cache"
    assert os.path.isabs(listing_cache.cache_dir(Config(proxy=ProxyConfig(cache_dir="/var/c"))))


def load(text: str) -> Config:
    return structure_config(tomllib.loads(text), environ={})


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("10m", 600.0), ("30s", 30.0), ("1.5h", 5400.0), ("1d", 86400.0), ("500ms", 0.5), ("off", 0.0), (90, 90.0)],
)
def test_idle_stop_after_takes_a_duration(given: object, seconds: float) -> None:
    value = f'"{given}"' if isinstance(given, str) else given
    config = load(f'[proxy]\nidle_stop_after = {value}\n[servers.a]\ncommand = "x"\n')
    assert config.idle_stop_after(config.servers["a"]) == seconds


def test_a_server_overrides_the_proxy_defaults_and_per_session_servers_never_stop() -> None:
    config = load(
        '[proxy]\nstart = "lazy"\nidle_stop_after = "10m"\n'
        '[servers.a]\ncommand = "x"\n'
        '[servers.b]\ncommand = "x"\nstart = "eager"\nidle_stop_after = "off"\n'
        '[servers.c]\ncommand = "x"\nisolation = "per-session"\n'
    )
    a, b, c = (config.servers[name] for name in "abc")
    assert (config.starts_lazily(a), config.idle_stop_after(a)) == (True, 600.0)
    assert (config.starts_lazily(b), config.idle_stop_after(b)) == (False, 0.0)
    assert config.idle_stop_after(c) == 0.0
    assert not load('[servers.a]\ncommand = "x"\n').starts_lazily(a)  # eager by default


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('[proxy]\nstart = "later"', "proxy.start: expected eager or lazy, got the string 'later'"),
        ('[proxy]\nidle_stop_after = "soon"', "proxy.idle_stop_after: expected a duration"),
        ("[proxy]\nidle_stop_after = -1", "proxy.idle_stop_after: must be"),
        ('[servers.a]\ncommand = "x"\nidle_stop_after = "5x"', "servers.a.idle_stop_after: expected a duration"),
        ('[servers.a]\ncommand = "x"\nstart = true', "servers.a.start: expected eager or lazy"),
    ],
)
def test_bad_values_are_reported_by_key(table: str, problem: str) -> None:
    text = table if "[servers." in table else table + '\n[servers.a]\ncommand = "x"\n'
    with pytest.raises(ConfigError) as info:
        load(text)
    assert problem in str(info.value)


def test_a_fifo_where_the_cache_file_should_be_is_no_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Opened without blocking and refused: a FIFO there once held the start-up forever."""
    os.mkfifo(listing_cache.cache_path(tmp_path, SERVER))
    assert listing_cache.read(tmp_path, SERVER) is None
    assert "not a regular file" in caplog.text

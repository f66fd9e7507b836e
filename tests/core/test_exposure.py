"""The rule checked before any listener opens: nothing beyond loopback without tokens,
unless the config says the network is trusted (``aggregator.fronts.access.check_exposure``)."""

from __future__ import annotations

import pytest

from aggregator.config import HttpConfig
from aggregator.errors import ConfigError
from aggregator.fronts.access import check_exposure

TOKEN = "a-token-of-sixteen-or-more-characters"
OPEN = HttpConfig()
WITH_TOKENS = HttpConfig(auth_tokens=(TOKEN,))
TRUSTED = HttpConfig(allow_unauthenticated_remote=True)


@pytest.mark.parametrize("listen", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "8000", "127.9.9.9:1"])
@pytest.mark.parametrize("config", [OPEN, WITH_TOKENS, TRUSTED], ids=["open", "tokens", "trusted"])
def test_loopback_is_always_served(listen, config):
    check_exposure(config, listen)


@pytest.mark.parametrize(
    ("listen", "host"),
    [
        ("0.0.0.0:8000", "0.0.0.0"),
        ("[::]:8000", "::"),
        ("192.168.1.5:8000", "192.168.1.5"),
        ("example.com:443", "example.com"),  # a name other than localhost is not known to be loopback
    ],
)
def test_beyond_loopback_without_tokens_is_refused(listen, host):
    with pytest.raises(ConfigError) as caught:
        check_exposure(OPEN, listen, "--ws")
    assert caught.value.problems == [
        f"refusing to serve on {host} without authentication: set http.auth_tokens, or"
        " http.allow_unauthenticated_remote = true if the network is trusted"
    ]


@pytest.mark.parametrize("config", [WITH_TOKENS, TRUSTED], ids=["tokens", "trusted"])
def test_beyond_loopback_with_tokens_or_trust_is_served(config):
    check_exposure(config, "0.0.0.0:8000")


@pytest.mark.parametrize("option", ["--http", "http.websocket_listen"])
def test_an_unreadable_address_is_named_by_where_it_came_from(option):
    with pytest.raises(ConfigError) as caught:
        check_exposure(OPEN, "nowhere", option)
    assert caught.value.problems == [f"{option}: expected HOST:PORT such as 127.0.0.1:8000, got 'nowhere'"]

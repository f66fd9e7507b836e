"""``aggregator serve`` with a server that takes users' own tokens: the vault is opened and
the callback path is served on the HTTP listener, without the proxy's bearer token."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.credentials.harness import KEY
from tests.e2e.conftest import http_proxy, write_config

pytestmark = pytest.mark.e2e


def test_serve_opens_the_vault_and_answers_the_callback(tmp_path, mcp):
    config = write_config(
        tmp_path,
        f'''
[credentials]
vault = "tokens.db"
vault_key = "{KEY}"

[http]
auth_tokens = ["{"t" * 32}"]

[servers.docs]
url = "{mcp.url}"
auth = "oauth"
''',
        startup_timeout=5.0,
    )
    with http_proxy(config) as (port, log):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/oauth/callback?code=c&state=forged", timeout=10)
        assert refused.value.code == 400 and b"unknown, already used or expired" in refused.value.read()
        assert (tmp_path / "tokens.db").exists()
    assert "forged" not in log.read_text()

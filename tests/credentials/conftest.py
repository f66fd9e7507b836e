"""The peers of the credentials tests, real HTTP on 127.0.0.1: an authorization server and
an MCP server that wants its tokens (``peers``)."""

from __future__ import annotations

import pytest

from tests.cluster.conftest import redis, store  # noqa: F401 - each store in turn, for the shared vault
from tests.credentials.peers import AuthServer, ProtectedMcp


@pytest.fixture
def auth_server():
    server = AuthServer()
    yield server
    server.close()


@pytest.fixture
def mcp(auth_server):
    server = ProtectedMcp(auth_server)
    yield server
    server.close()

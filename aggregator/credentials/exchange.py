"""Token exchange (RFC 8693): the caller's own access token, traded at an authorization
server for one whose audience is a given server, so the proxy never passes the caller's
token on (the MCP spec forbids token passthrough).

The caller's token is the resource server's, kept for the client session in memory only;
it is sent to the configured authorization server and nowhere else. What comes back is
kept in memory per (principal, server) until it is about to expire, one exchange at a time
per key; at most ``MAX_CACHED`` are kept (the oldest go first).

An exchange has ``credentials.fetch_timeout`` or, when shorter, ``INIT_SHARE`` of the
server's ``init_timeout``, so that a slow token endpoint ends the exchange with its own
error (the caller hears why, reason ``unauthorized``) before the connection's handshake
times out for want of it. An exchange that fails (the client refused, an HTTP error, an oversized answer, no answer
in time) fails the call, which tells its user why; the log gets a warning naming the server
and the reason (never a token), once per server per ``FAILURE_LOG_INTERVAL`` with a count.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import trio

from aggregator.config import ServerConfig
from aggregator.credentials.discovery import authorization_server, canonical_resource
from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.tokens import ClientCredentials, TokenSet, request_tokens
from aggregator.log_summary import LogSummary

log = logging.getLogger(__name__)

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
MAX_CACHED = 4096
FAILURE_LOG_INTERVAL = 60.0  # seconds: at most one warning per server this often
INIT_SHARE = 0.8  # of a server's init_timeout: the longest an exchange for it may take


class TokenExchange:
    def __init__(self, fetcher: Fetcher, *, margin: float, clock: Callable[[], float] = time.time) -> None:
        self.fetcher = fetcher
        self.margin = margin
        self.clock = clock
        self._cache: OrderedDict[tuple[Principal, str], TokenSet] = OrderedDict()
        self._endpoints: dict[str, str] = {}  # issuer -> its token endpoint
        self._locks: dict[tuple[Principal, str], trio.Lock] = {}
        self.exchanges = 0  # exchange requests made
        self.failures = LogSummary(log, logging.WARNING, FAILURE_LOG_INTERVAL)

    async def token_for(self, principal: Principal, subject_token: str, server: ServerConfig) -> str:
        """An access token for ``server`` on behalf of ``principal``, whose own access token
        is ``subject_token``."""
        key = (principal, server.name)
        cached = self._cache.get(key)
        if cached is not None and cached.fresh(self.clock(), self.margin):
            return cached.access_token
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                cached = self._cache.get(key)
                if cached is not None and cached.fresh(self.clock(), self.margin):
                    return cached.access_token
                try:
                    limit = min(self.fetcher.timeout, server.init_timeout * INIT_SHARE)
                    with trio.move_on_after(limit) as deadline:
                        tokens = await self._exchange(subject_token, server)
                    if deadline.cancelled_caught:
                        late = f"server {server.name!r}: token exchange: no whole answer within {limit:g}s"
                        raise CredentialError(late)
                except CredentialError as exc:  # the caller is told; the operator is told here
                    self.failures.log(server.name, "server %s: the token exchange failed: %s", server.name, exc)
                    raise
                self._cache[key] = tokens
                self._cache.move_to_end(key)
                while len(self._cache) > MAX_CACHED:
                    self._cache.popitem(last=False)
                return tokens.access_token
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)

    def forget(self, principal: Principal, server: str | None = None) -> None:
        """Drop what is cached for ``principal`` (its session ended, or a server refused it)."""
        for key in [key for key in self._cache if key[0] == principal and server in (None, key[1])]:
            del self._cache[key]

    async def _endpoint(self, server: ServerConfig) -> str:
        oauth = server.oauth
        if oauth.token_endpoint is not None:
            return oauth.token_endpoint
        assert oauth.issuer is not None  # checked at load
        endpoint = self._endpoints.get(oauth.issuer)
        if endpoint is None:
            endpoint = (await authorization_server(self.fetcher, oauth.issuer)).token_endpoint
            self._endpoints[oauth.issuer] = endpoint
        return endpoint

    async def _exchange(self, subject_token: str, server: ServerConfig) -> TokenSet:
        assert server.url is not None and server.oauth.client_id is not None
        self.exchanges += 1
        resource = canonical_resource(server.url)
        form = {
            "grant_type": GRANT_TYPE,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
            "audience": server.oauth.audience or resource,
            "resource": resource,
        }
        if server.oauth.scopes:
            form["scope"] = " ".join(server.oauth.scopes)
        client = ClientCredentials(client_id=server.oauth.client_id, client_secret=server.oauth.client_secret)
        return await request_tokens(
            self.fetcher,
            await self._endpoint(server),
            form,
            client,
            f"server {server.name!r}: token exchange",
            now=self.clock(),
        )

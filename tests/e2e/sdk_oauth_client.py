"""Log in to the proxy as a user's client would, with the official Python SDK's OAuth client:
``python sdk_oauth_client.py SPEC``, SPEC a JSON object:

- ``url``: the proxy's endpoint; ``user``: whom to log in as (sent as ``login_hint``, which
  the suite's authorization server approves at once under ``--auto-approve``);
- ``mode``: ``2026-07-28`` or ``legacy`` with SDK 2.x (``mcp.Client``), absent with 1.x
  (``ClientSession``);
- ``pause``: seconds to wait between listing the tools and calling one (past the access
  token's lifetime, so the next request needs a refreshed one);
- ``stored``: ``{"tokens": ..., "client": ...}`` the storage starts with (a token granted
  earlier, and the registration it was granted to);
- ``tool`` and ``arguments``: the tool to call (``up__whoami`` with none by default).

The SDK does the rest: the proxy's 401 names its metadata, the metadata the authorization
server, whose metadata gives the registration, authorization and token endpoints; it
registers, runs the code flow with PKCE and ``resource``, and retries with the token. The
redirect handler follows the authorization URL with a plain GET (no browser) and hands the
redirect's ``code``, ``state`` and ``iss`` to the callback handler. Prints one JSON object:
the tools listed, what the tool answered, each authorization URL's ``scope`` and
``resource``, how many registrations, the grant type of every token request, and how many
sessions the MCP requests named; or the error.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio

REDIRECT = "http://127.0.0.1:1/callback"


class Seen:
    """What the flow did, as the client saw it."""

    def __init__(self) -> None:
        self.authorizations: list[dict[str, str | None]] = []
        self.registrations = 0
        self.grants: list[str] = []
        self.sessions: set[str] = set()
        self.redirected: dict[str, str] = {}

    def request(self, path: str, headers: Any, body: bytes) -> None:
        """Note a token request's grant type, and the session an MCP request belongs to."""
        if path.endswith("/token"):
            self.grants.append(parse_qs(body.decode()).get("grant_type", ["?"])[0])
        elif path.endswith("/mcp") and headers.get("mcp-session-id"):
            self.sessions.add(headers["mcp-session-id"])


def storage_for(seen: Seen, stored: dict[str, Any], token_model: Any, client_model: Any) -> Any:
    class Storage:
        def __init__(self) -> None:
            self.tokens = token_model.model_validate(stored["tokens"]) if "tokens" in stored else None
            self.client = client_model.model_validate(stored["client"]) if "client" in stored else None

        async def get_tokens(self) -> Any:
            return self.tokens

        async def set_tokens(self, tokens: Any) -> None:
            self.tokens = tokens

        async def get_client_info(self) -> Any:
            return self.client

        async def set_client_info(self, client_info: Any) -> None:
            seen.registrations += 1
            self.client = client_info

    return Storage()


def redirect_handler(seen: Seen, user: str, http_get: Any) -> Any:
    """Follow the authorization URL as a browser would once the user approved, and keep what
    came back to the redirect URI for the callback handler."""

    async def redirect(url: str) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        seen.authorizations.append({"scope": query.get("scope"), "resource": query.get("resource")})
        status, location = await http_get(f"{url}&{urlencode({'login_hint': user})}")
        if status != 302:
            raise RuntimeError(f"the authorization endpoint answered {status}, not a redirect")
        seen.redirected = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
        if "code" not in seen.redirected:
            raise RuntimeError(f"the authorization was refused: {seen.redirected}")

    return redirect


async def with_sdk2(spec: dict[str, Any], seen: Seen) -> dict[str, Any]:
    import httpx2
    from mcp.client import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    async def http_get(url: str) -> tuple[int, str]:
        async with httpx2.AsyncClient() as plain:
            answer = await plain.get(url)
            return answer.status_code, answer.headers.get("location", "")

    redirect = redirect_handler(seen, spec["user"], http_get)

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(
            code=seen.redirected["code"], state=seen.redirected.get("state"), iss=seen.redirected.get("iss")
        )

    provider = OAuthClientProvider(
        server_url=spec["url"],
        client_metadata=OAuthClientMetadata(
            client_name="sdk2 oauth client",
            redirect_uris=[REDIRECT],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            token_endpoint_auth_method="none",
        ),
        storage=storage_for(seen, spec.get("stored", {}), OAuthToken, OAuthClientInformationFull),
        redirect_handler=redirect,
        callback_handler=callback,
    )

    async def hook(request: httpx2.Request) -> None:
        seen.request(request.url.path, request.headers, request.content)

    http = httpx2.AsyncClient(auth=provider, event_hooks={"request": [hook]}, timeout=30.0)
    transport = streamable_http_client(spec["url"], http_client=http)
    async with http, Client(transport, mode=spec["mode"], cache=None) as client:
        return await list_and_call(client, spec)


async def with_sdk1(spec: dict[str, Any], seen: Seen) -> dict[str, Any]:
    import httpx
    from mcp import ClientSession
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamablehttp_client
    from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    async def http_get(url: str) -> tuple[int, str]:
        async with httpx.AsyncClient() as plain:
            answer = await plain.get(url)
            return answer.status_code, answer.headers.get("location", "")

    redirect = redirect_handler(seen, spec["user"], http_get)

    async def callback() -> tuple[str, str | None]:
        return seen.redirected["code"], seen.redirected.get("state")

    provider = OAuthClientProvider(
        server_url=spec["url"],
        client_metadata=OAuthClientMetadata(
            client_name="sdk1 oauth client",
            redirect_uris=[REDIRECT],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            token_endpoint_auth_method="none",
        ),
        storage=storage_for(seen, spec.get("stored", {}), OAuthToken, OAuthClientInformationFull),
        redirect_handler=redirect,
        callback_handler=callback,
    )

    async def hook(request: httpx.Request) -> None:
        seen.request(request.url.path, request.headers, request.content)

    def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(headers=headers, timeout=timeout, auth=auth, event_hooks={"request": [hook]})

    async with streamablehttp_client(spec["url"], auth=provider, httpx_client_factory=factory) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return await list_and_call(session, spec)


async def list_and_call(client: Any, spec: dict[str, Any]) -> dict[str, Any]:
    tools = sorted(tool.name for tool in (await client.list_tools()).tools)
    await anyio.sleep(spec.get("pause", 0))
    called = await client.call_tool(spec.get("tool", "up__whoami"), spec.get("arguments", {}))
    return {"tools": tools, "called": getattr(called.content[0], "text", "")}


async def main(spec: dict[str, Any]) -> None:
    seen = Seen()
    try:
        with anyio.fail_after(60):
            out = await (with_sdk2(spec, seen) if spec.get("mode") else with_sdk1(spec, seen))
    except Exception as exc:  # noqa: BLE001 - what failed is the output
        out = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    out.update(
        authorizations=seen.authorizations,
        registrations=seen.registrations,
        grants=seen.grants,
        sessions=len(seen.sessions),
    )
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))

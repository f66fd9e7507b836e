"""Finding a server's authorization server: the challenge of its 401 (``WWW-Authenticate``,
RFC 6750 and RFC 9728 section 5.1), its protected resource metadata (RFC 9728) and the
authorization server's metadata (RFC 8414, then OpenID Connect Discovery), in the order the
MCP authorization spec gives.

Every URL a document names is checked (``urls.url_refusal``) when the document is read,
so a bad one is refused before anything is fetched from it or shown to a user; a document
whose ``resource`` or ``issuer`` is not the one asked for is not used (RFC 9728 3.3,
RFC 8414 3.3).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs

from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.problems import CredentialError, UnsafeUrl
from aggregator.credentials.urls import url_refusal

# auth-param = token BWS "=" BWS ( token / quoted-string ) (RFC 9110 11.2)
_PARAM = re.compile(r'([A-Za-z0-9!#$%&\'*+.^_`|~-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)')
MAX_CHALLENGE = 8192


def parse_challenge(header: str | None) -> dict[str, str]:
    """The parameters of the Bearer challenge in a ``WWW-Authenticate`` header (lower-cased
    names: ``resource_metadata``, ``scope``, ``error``); empty when there is none."""
    if not header or len(header) > MAX_CHALLENGE:
        return {}
    at = re.search(r"(?:^|,)\s*bearer(?:\s+|$)", header, re.IGNORECASE)
    if at is None:
        return {}
    params: dict[str, str] = {}
    rest = header[at.end() :]
    for match in _PARAM.finditer(rest):
        name, value = match.group(1).lower(), match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params.setdefault(name, value)
        after = rest[match.end() :].lstrip()
        # Another scheme starts ("..., Basic realm=..."): the Bearer challenge is over.
        if after.startswith(",") and re.match(r",\s*[A-Za-z0-9_-]+\s+[A-Za-z0-9_-]+\s*=", after):
            break
    return params


def canonical_resource(url: str) -> str:
    """A server's URL as its resource indicator (RFC 8707): lower-case scheme and host, no
    fragment, no trailing slash on the path."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/") if parts.path != "/" else ""
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


@attrs.frozen(kw_only=True)
class ResourceMetadata:
    resource: str
    authorization_servers: tuple[str, ...]
    scopes_supported: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ServerMetadata:
    """What the proxy uses of an authorization server's metadata."""

    issuer: str
    authorization_endpoint: str | None
    token_endpoint: str
    registration_endpoint: str | None = None
    revocation_endpoint: str | None = None
    code_challenge_methods: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] = ()
    client_id_metadata_documents: bool = False
    iss_parameter: bool = False  # RFC 9207: the authorization response carries ``iss``


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


def _url(document: dict[str, Any], key: str, what: str, *, required: bool) -> str | None:
    value = document.get(key)
    if value is None and not required:
        return None
    if value is None:
        raise CredentialError(f"{what}: {key} is missing")
    refusal = url_refusal(value)
    if refusal is not None:
        raise UnsafeUrl(f"{what}: {key} {refusal}")
    assert isinstance(value, str)
    return value


def resource_metadata_urls(server_url: str) -> list[str]:
    """RFC 9728's well-known URLs of a server, path-inserted first, then at the root."""
    parts = urlsplit(server_url)
    root = urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource", "", ""))
    path = parts.path.rstrip("/")
    return [root + path, root] if path else [root]


def server_metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 and OpenID Connect Discovery URLs of an issuer, in the MCP spec's order."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(well_known: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, well_known, "", ""))

    if not path:
        return [at("/.well-known/oauth-authorization-server"), at("/.well-known/openid-configuration")]
    return [
        at(f"/.well-known/oauth-authorization-server{path}"),
        at(f"/.well-known/openid-configuration{path}"),
        at(f"{path}/.well-known/openid-configuration"),
    ]


async def protected_resource(fetcher: Fetcher, server_url: str, challenge: dict[str, str]) -> ResourceMetadata:
    """The server's protected resource metadata: from its challenge's ``resource_metadata``
    when it gave one, else from the well-known URLs in order."""
    given = challenge.get("resource_metadata")
    candidates = [given] if given else resource_metadata_urls(server_url)
    last = "no metadata found"
    for url in candidates:
        what = "the server's resource metadata"
        answer = await fetcher.get_json(url, what)
        if answer.status != 200:
            last = f"{what}: HTTP {answer.status}"
            continue
        document = answer.body
        resource = document.get("resource")
        if not isinstance(resource, str) or canonical_resource(resource) != canonical_resource(server_url):
            raise CredentialError(f"{what}: its resource is not this server's URL, so it is not used")
        servers = _strings(document.get("authorization_servers"))
        if not servers:
            raise CredentialError(f"{what}: it names no authorization server")
        for index, issuer in enumerate(servers):
            if (refusal := url_refusal(issuer)) is not None:
                raise UnsafeUrl(f"{what}: authorization_servers[{index}] {refusal}")
        return ResourceMetadata(
            resource=resource,
            authorization_servers=servers,
            scopes_supported=_strings(document.get("scopes_supported")),
        )
    raise CredentialError(last)


async def authorization_server(fetcher: Fetcher, issuer: str) -> ServerMetadata:
    """An authorization server's metadata, from the first of its well-known URLs that has
    one; a document naming another issuer is refused."""
    if (refusal := url_refusal(issuer)) is not None:
        raise UnsafeUrl(f"the authorization server's issuer {refusal}")
    last = "no metadata found"
    what = "the authorization server's metadata"
    for url in server_metadata_urls(issuer):
        answer = await fetcher.get_json(url, what)
        if answer.status != 200:
            last = f"{what}: HTTP {answer.status} at each well-known URL"
            continue
        document = answer.body
        if document.get("issuer") != issuer:
            raise CredentialError(f"{what}: its issuer is not the one asked for, so it is not used")
        token_endpoint = _url(document, "token_endpoint", what, required=True)
        assert token_endpoint is not None
        return ServerMetadata(
            issuer=issuer,
            authorization_endpoint=_url(document, "authorization_endpoint", what, required=False),
            token_endpoint=token_endpoint,
            registration_endpoint=_url(document, "registration_endpoint", what, required=False),
            revocation_endpoint=_url(document, "revocation_endpoint", what, required=False),
            code_challenge_methods=_strings(document.get("code_challenge_methods_supported")),
            scopes_supported=_strings(document.get("scopes_supported")),
            client_id_metadata_documents=document.get("client_id_metadata_document_supported") is True,
            iss_parameter=document.get("authorization_response_iss_parameter_supported") is True,
        )
    raise CredentialError(last)

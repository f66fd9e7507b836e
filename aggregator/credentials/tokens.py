"""Token endpoint requests (RFC 6749 section 3.2): the grant types the proxy uses (an
authorization code with its PKCE verifier, a refresh token, an RFC 8693 exchange), and
revocation (RFC 7009). A client with a secret authenticates with HTTP Basic, one without
sends its ``client_id`` in the form (a public client).

The answer's ``error`` code is told (it is a fixed word); its description is cut short
(``MAX_DESCRIPTION``) and anything in it that looks like a token (a long unbroken run of
token characters, or any value the proxy sent) is blanked: an authorization server may echo
what it was sent, the caller's own token among it. Tokens never appear in an error or a log line.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

import attrs

from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.problems import CredentialError

MAX_TOKEN = 16 * 1024  # characters of an access or refresh token
MAX_DESCRIPTION = 120  # characters of an error_description told on
# A run of characters of tokens (JWT, base64url, hex) this long is not prose.
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9._~+/=-]{24,}")
_BLANKED = "[...]"


@attrs.frozen(kw_only=True)
class ClientCredentials:
    """How the proxy is known to one authorization server."""

    client_id: str
    client_secret: str | None = attrs.field(default=None, repr=False)


@attrs.frozen(kw_only=True)
class TokenSet:
    access_token: str = attrs.field(repr=False)
    refresh_token: str | None = attrs.field(default=None, repr=False)
    expires_at: float | None = None  # wall-clock seconds; None: the server did not say
    scope: str = ""

    def fresh(self, now: float, margin: float) -> bool:
        """Whether it is good for at least ``margin`` more seconds."""
        return self.expires_at is None or self.expires_at - margin > now


class TokenRefused(CredentialError):
    """The token endpoint answered with an OAuth error (``code``: ``invalid_grant``, ...)."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.code = code


def described(description: object, sent: Mapping[str, str]) -> str:
    """``": <description>"`` to add to an error, or "": printable text only, every value of
    ``sent`` (the form: tokens, codes) and anything token-like blanked, cut short."""
    if not isinstance(description, str) or not description:
        return ""
    text = description  # (bounded by the answer's size limit; cut only once blanked)
    for value in sent.values():
        if len(value) >= 8:
            text = text.replace(value, _BLANKED)
    text = _TOKEN_LIKE.sub(_BLANKED, text)
    if not text.isprintable():
        return ""
    return f": {text[:MAX_DESCRIPTION]}" + ("..." if len(text) > MAX_DESCRIPTION else "")


def _token(value: object, what: str, key: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN or not value.isprintable():
        raise CredentialError(f"{what}: {key} is missing or not a usable token")
    return value


async def request_tokens(
    fetcher: Fetcher,
    endpoint: str,
    form: Mapping[str, str],
    client: ClientCredentials,
    what: str,
    *,
    keep_refresh: str | None = None,
    now: float | None = None,
) -> TokenSet:
    """POST ``form`` to a token endpoint; the tokens it gave. ``keep_refresh``: the refresh
    token to keep when a refresh answer brings no new one."""
    body = dict(form)
    basic = None
    if client.client_secret is not None:
        basic = (client.client_id, client.client_secret)
    else:
        body["client_id"] = client.client_id
    answer = await fetcher.post_form(endpoint, body, what, basic=basic)
    document = answer.body
    if answer.status != 200:
        code = document.get("error")
        code = code if isinstance(code, str) and code.isascii() and len(code) < 64 else "error"
        said = described(document.get("error_description"), form)
        raise TokenRefused(f"{what}: refused (HTTP {answer.status}, {code}){said}", code)
    access = _token(document.get("access_token"), what, "access_token")
    token_type = document.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() not in ("bearer", "n_a"):
        raise CredentialError(f"{what}: token_type is not Bearer")
    refresh = document.get("refresh_token")
    expires_in = document.get("expires_in")
    at = time.time() if now is None else now
    expires_at = (
        at + float(expires_in)
        if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and 0 < expires_in < 10**9
        else None
    )
    scope = document.get("scope")
    return TokenSet(
        access_token=access,
        refresh_token=_token(refresh, what, "refresh_token") if refresh is not None else keep_refresh,
        expires_at=expires_at,
        scope=scope if isinstance(scope, str) else form.get("scope", ""),
    )


async def revoke(fetcher: Fetcher, endpoint: str, token: str, hint: str, client: ClientCredentials) -> bool:
    """Ask the authorization server to revoke ``token`` (RFC 7009); whether it said so."""
    body = {"token": token, "token_type_hint": hint}
    basic = None
    if client.client_secret is not None:
        basic = (client.client_id, client.client_secret)
    else:
        body["client_id"] = client.client_id
    answer = await fetcher.post_form(endpoint, body, "token revocation", basic=basic)
    return answer.status == 200

"""Each user's own credentials for the servers that require them: the token vault, token
exchange, and the OAuth client that gets a user's grant.

A server with ``auth = "static"`` gets its configured headers, the same for everyone; this
package is for the other two (``config.upstream_auth``). With ``"token-exchange"`` the
caller's own access token is traded for one meant for the server (RFC 8693,
``exchange``); with ``"oauth"`` the user grants the proxy access at the server's
authorization server (authorization code with PKCE, ``authorization``), and the tokens are
kept, encrypted, in the vault (``vault``) and refreshed before they expire (``keeper``).
The proxy is then an OAuth client of the server: it finds its authorization server
(``discovery``), checking every URL a stranger's metadata names before it uses it
(``urls``), through one bounded HTTP path (``fetching``); token endpoint requests are in
``tokens``, the callback path on the HTTP listener in ``callback``, and the object the rest
of the proxy uses in ``service`` (``UserCredentials``).

Nothing here logs a token, a code or a secret. Per-user credentials make a server
per-session (``isolation``), so one user's token never serves another.

Floor 4 (tests/core/test_layering.py): may import ``errors``, ``jsonrpc``, ``mcp``,
``config`` and ``transports``; ``upstreams`` and ``cli`` use it.

Importing the package costs nothing: the vault (sqlite, cryptography) and the OAuth client
are imported from their modules by whoever uses them (``service.UserCredentials``).
"""

from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import ConsentRequired, CredentialError, UnsafeUrl

__all__ = ["ConsentRequired", "CredentialError", "Principal", "UnsafeUrl"]

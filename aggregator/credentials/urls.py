"""Which URLs the proxy will fetch or show a user when it acts as an OAuth client (RFC 9728,
RFC 8414 and OpenID Connect metadata, registration, token and revocation endpoints, and the
authorization URL a user is sent to). Pure: no DNS, no I/O; ``fetching`` also checks what
a host name resolves to.

The rules: http or https only (never ``javascript:``, ``data:``, ``file:`` or anything
that reaches a shell); https except on loopback; no user name or password in the URL; a
host that is no private, link-local, unique-local, multicast, unspecified or cloud
metadata address. Metadata is written by a server the proxy does not trust (mcp-remote
CVE-2025-6514 ran an ``authorization_endpoint``), so every URL in it is checked here before
it is used in any way.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

MAX_URL = 2048
LOOPBACK_NAMES = ("localhost",)
# Names of cloud metadata services (their addresses are link-local, refused anyway).
METADATA_NAMES = ("metadata.google.internal", "metadata", "instance-data", "metadata.azure.internal")
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_refusal(address: IpAddress) -> str | None:
    """Why an address may not be fetched (None: it may). Loopback is allowed."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "an address that is not a host's"
    if isinstance(address, ipaddress.IPv6Address) and address in ipaddress.ip_network("fd00:ec2::/32"):
        return "a cloud metadata address"
    if address.is_private or not address.is_global:
        return "a private address"
    return None


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_refusal(url: object) -> str | None:
    """Why ``url`` may not be fetched nor shown to a user as a link; None if it may. The
    reason never quotes the URL past its scheme (it came from a stranger)."""
    if not isinstance(url, str):
        return "is not a string"
    if len(url) > MAX_URL:
        return f"longer than {MAX_URL} characters"
    if not url.isascii() or any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        return "holds whitespace, a control character or a character outside ASCII"
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        shown = f"the {scheme!r} scheme" if scheme.isalnum() and len(scheme) < 20 else "no usable scheme"
        return f"has {shown} (only http and https are used)"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return "cannot be parsed (a bad port or [IPv6] address)"
    if not host or not parts.netloc:
        return "has no host"
    if "@" in parts.netloc:
        return "holds a user name or password"
    if host in METADATA_NAMES:
        return "names a cloud metadata service"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and (refused := address_refusal(address)) is not None:
        return f"names {refused}"
    if scheme == "http" and not is_loopback(host):
        return "is plain http: https is required (http only on loopback)"
    return None

"""What the commands that talk to a running proxy, or show what a server wrote, share: the
admin endpoint's URL made from what the user typed (``--admin``), refused in one line when
it cannot be used, and text made safe for the operator's terminal.

A server's stderr is the server's, not ours: a terminal escape sequence in it (a title, a
colour, a cursor move) must reach the terminal as text, never as a command to it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from aggregator.errors import AggregatorError

# C0 controls, DEL and C1 controls: each shown as \xNN (so ESC is \x1b, BEL \x07).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character (tab and line breaks included) shown as ``\\xNN``."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def bearer(token: str, source: str) -> str:
    """The ``Authorization`` header value for ``token`` (which came from ``source``);
    AggregatorError, one line that does not show the token, when a header cannot carry it."""
    if any(ord(char) < 33 or ord(char) > 126 for char in token):
        raise AggregatorError(
            f"the admin token ({source}) cannot be sent in an HTTP header: it holds a space, a control"
            " character or a character outside ASCII (it is not shown)"
        )
    return f"Bearer {token}"


def admin_base(address: str, option: str = "--admin") -> str:
    """The admin endpoint's base URL (no trailing ``/``) from ``address``: an http(s) URL,
    ``HOST:PORT`` or a bare port (on 127.0.0.1). AggregatorError, one line naming
    ``option``, when it is not a URL one can ask; never the password it carries."""
    shown = printable(address)
    if address.isdigit():
        address = f"127.0.0.1:{address}"
    if "://" not in address:
        address = f"http://{address}"
    if _CONTROL.search(address) or " " in address:
        raise AggregatorError(f"{option} {shown}: a URL cannot hold spaces or control characters")
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        raise AggregatorError(f"{option} {_without_password(shown)}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise AggregatorError(f"{option} {_without_password(shown)}: expected an http:// or https:// URL or HOST:PORT")
    if "@" in parts.netloc:
        raise AggregatorError(
            f"{option} {_without_password(shown)}: a user or password in the URL is not used;"
            " give the token in AGGREGATOR_ADMIN_TOKEN"
        )
    if not parts.hostname:
        raise AggregatorError(f"{option} {shown}: the URL names no host")
    if port == 0:
        raise AggregatorError(f"{option} {shown}: port 0 is not a port one can connect to")
    if parts.query or parts.fragment:
        raise AggregatorError(f"{option} {shown}: the URL of the admin endpoint takes no query or fragment")
    return address.rstrip("/")


def _without_password(address: str) -> str:
    """``address`` with what stands between the scheme's ``//`` user and ``@`` hidden."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", address)

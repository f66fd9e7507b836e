"""Masking a server's secrets in text that others see: its stderr lines, and why its
connection failed (the log, ``check``, the ``lastError`` its callers are told, the error a
request gets when the server cannot be reached).

A server's secrets are the values of its ``env`` and ``headers`` (tokens, keys), the
credentials in its ``url`` (the password of its user info and every query value), and every
value that ``${VAR}`` interpolation put anywhere in its config (``ServerConfig.interpolated``),
and the value of every variable its ``env_passthrough`` (with ``proxy.env_passthrough``) hands it.
The one rule for all of them: every secret of at least ``MIN_SECRET`` characters becomes
``***``, as it is, as an exception's text shows it (escaped, or a line of it), as JSON
shows it (a value dumped in a message or a log line, or JSON dumped in that) and
percent-encoded (wholly, with ``/`` kept as ``quote`` keeps it, or as an HTTP client encodes
a query; with upper or lowercase hex digits). A value the server itself transforms (base64,
upper case, split across lines) cannot be recognised. A URL shown to humans goes through ``shown_url``,
which hides its credentials whatever their length.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

# The metadata of a config field that holds secrets (keys, tokens, passwords, a server's env
# and headers): a problem with its type or shape never quotes its value (``structuring``).
SECRET: Mapping[str, bool] = {"secret": True}

MIN_SECRET = 4
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_HEX_ESCAPE = re.compile(r"%[0-9A-F]{2}")
# What an HTTP client leaves as it is when it percent-encodes a URL's query (WHATWG, as httpx
# and browsers do): visible ASCII but ``"#<>``; spaces, controls and non-ASCII are encoded.
_QUERY_SAFE = "".join(char for char in map(chr, range(0x21, 0x7F)) if char not in '"#<>')


def _lower(match: re.Match[str]) -> str:
    return match.group().lower()


def _url_parts(url: str) -> tuple[str | None, list[str]]:
    """The raw (still percent-encoded) password of a URL's user info and its query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None, []
    userinfo = parts.netloc.rpartition("@")[0]
    password = userinfo.partition(":")[2] if ":" in userinfo else None
    values = [field.partition("=")[2] for field in re.split(r"[&;]", parts.query) if "=" in field]
    return password, [value for value in values if value]


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries, as written and decoded."""
    password, values = _url_parts(url)
    raw = [*([password] if password else []), *values]
    return [*raw, *(unquote(value) for value in raw), *(unquote(value.replace("+", " ")) for value in raw)]


def shown_url(url: str) -> str:
    """The URL for humans: its password and query values replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that cannot be parsed)"
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = re.sub(r"=[^&;]*", "=***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def passed_through(names: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the variables ``names`` (a name, or a prefix and ``*``) pass to a child."""
    environ = os.environ if environ is None else environ
    exact = {name for name in names if not name.endswith("*")}
    prefixes = tuple(name[:-1] for name in names if name.endswith("*"))
    return [value for key, value in environ.items() if key in exact or (prefixes and key.startswith(prefixes))]


class SecretMask:
    """Replaces the given secrets in a text by ***."""

    __slots__ = ("forms",)

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET:
                continue
            forms.add(secret)
            forms.add(repr(secret)[1:-1])  # as an exception shows a str ('...\n')
            forms.add(repr(secret.encode("utf-8", "replace"))[2:-1])  # ... or bytes (b'...\n')
            for ascii_only in (True, False):
                # In JSON: a message, ``check``, ``tools --json``; and JSON in a JSON string.
                once = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
                forms.update((once, json.dumps(once, ensure_ascii=ascii_only)[1:-1]))
            # Percent-encoded: wholly, as ``quote`` does by default (``/`` kept), as a form field,
            # and as an HTTP client encodes a query; each also with lowercase hex digits (%2f).
            encoded = (quote(secret, safe=""), quote(secret), quote_plus(secret), quote(secret, safe=_QUERY_SAFE))
            forms.update(encoded)
            forms.update(_HEX_ESCAPE.sub(_lower, form) for form in encoded)
            # A line of it (a message cut at its first line break, a value with a stray newline).
            forms.update(part for part in _CONTROL.split(secret) if len(part) >= MIN_SECRET)
        # Longest first: a form that holds another is replaced whole.
        self.forms = tuple(sorted(forms, key=len, reverse=True))

    @classmethod
    def of(cls, config: Any) -> SecretMask:
        """The secrets of a server's config: its ``env`` and ``headers`` values, its URL's
        credentials, what ``${VAR}`` interpolation put in it, and the values of the
        variables its ``env_passthrough`` passes."""
        url = getattr(config, "url", None)
        values = (
            *config.env.values(),
            *config.headers.values(),
            *getattr(config, "interpolated", ()),
            *passed_through(getattr(config, "env_passthrough", ())),
        )
        urls = [url] if url else []
        urls += [value for value in values if "://" in value]  # DATABASE_URL = "postgres://u:pw@..."
        return cls((*values, *(secret for each in urls for secret in url_secrets(each))))

    @classmethod
    def joined(cls, masks: Iterable[SecretMask]) -> SecretMask:
        """One mask for the secrets of all of ``masks``."""
        joined = cls(())
        joined.forms = tuple(sorted({form for mask in masks for form in mask.forms}, key=len, reverse=True))
        return joined

    def __call__(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, "***")
        return text

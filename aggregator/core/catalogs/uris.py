"""URIs: the reversible rewrite for resources and templates, and the normal form that
policy and routing compare.

Rewrite
-------
A server with URI prefix ``p`` exposes ``p+<its URI>``: ``demo://x`` becomes
``everything+demo://x``. Why this form:

- It stays a valid RFC 3986 URI: a scheme is a letter followed by letters, digits,
  ``+``, ``-`` and ``.``, and our prefixes are made of exactly those (no ``+``).
- It stays a valid RFC 6570 template, because the prefix is literal text in front of
  whatever the template holds (even a template that starts with an expression).
- It reverses without a table: strip ``p+`` (compared without case, since the prefix is
  part of the scheme and schemes are case-insensitive). An upstream scheme that has a
  ``+`` of its own (``svn+ssh:``) survives because only the first ``p+`` is removed.

A server with an empty URI prefix keeps its URIs; the catalog finds its owner by the
URIs and templates it lists.

Normal form
-----------
Two spellings of one URI must meet the same policy: ``S+SECRET://x``, ``s+secret://%78``
and ``s+secret://y/../x`` are all ``s+secret://x``. ``normalize_uri`` is RFC 3986 §6.2.2
syntax-based normalisation, applied to every URI a client sends before it is looked up,
checked and forwarded, and (with ``normalize_pattern`` / ``normalize_template``) to every
listed URI, template and allow/deny glob it is compared with:

1. Raw non-ASCII characters (an IRI) are percent-encoded as UTF-8 (RFC 3987 §3.1), so
   ``é`` and ``%C3%A9`` are one spelling; so is a raw space (``%20``), which no URI may
   hold but some servers list. No Unicode normalisation and no IDNA: NFC and NFD
   spellings, or a Unicode host and its ``xn--`` form, stay different URIs.
2. ``%XX`` escapes of unreserved characters (``A-Z a-z 0-9 - . _ ~``) are decoded; the
   hex digits of every other escape are upper-cased. Reserved characters stay encoded:
   ``%2F`` is not ``/`` and ``%3A`` is not ``:``.
3. ``.`` and ``..`` path segments are removed (RFC 3986 §5.2.4), after step 2, so
   ``%2E%2E`` segments go too.
4. The scheme (and so the proxy's own ``p+`` prefix) and the host are lower-cased, after
   step 3 (``s:/..//HOST/x`` is ``s://HOST/x`` once its dots are gone). Paths, queries
   and user info keep their case. An empty user info or port is dropped (``s://@h:/x`` is
   ``s://h/x``, RFC 3986 §6.2.3), and so is the default port of http, https, ws, wss and
   ftp, whose empty path is ``/``: that is how URL parsers (the SDKs' included) read them.
5. A raw backslash (no URI holds one, and a URL parser reads it as ``/`` in an http URL)
   is encoded as ``%5C``.

Each step leaves nothing for an earlier one to do, so the normal form is idempotent:
normalising it again changes nothing (a test checks this on generated input).

The proxy forwards the normal form (or, for a URI a server listed, that server's own
spelling of it), never the client's spelling: the upstream acts on exactly the string
that policy approved, so a server that lower-cases schemes, decodes escapes or resolves
dot segments on its own cannot be led somewhere the rules did not look.

A client URI is refused (``InvalidUri``, answered with -32602) when no normal form would
be safe to forward: empty; leading or trailing space; any control, whitespace other than
a plain space, or invisible character (anywhere: they are how look-alike names are
built); a ``%`` that does not start a ``%XX`` escape (a second decoding would read it
differently); no scheme; or a ``.``/``..`` segment hidden behind an encoded slash or a
backslash (``..%2F..%2Fetc``), which a server that decodes before resolving would walk
up through.

Readings, for deny rules
------------------------
A server may read a URI in ways its normal form does not show: many percent-decode it
before parsing (``secret:%2F%2Fx`` is then ``secret://x``), URL parsers and file systems
drop or fold parts of it (``secret://x?y``, ``file:///etc//passwd``), and a scheme-wide
rule such as ``secret://*`` means every URI of the scheme, with an authority or without
(``secret:x``, ``secret:/x``). ``readings`` lists those ways: the normal form, each
decoding of it (up to three rounds, every one normalised again), and for each of those
what a parser or a file system would make of it (see ``readings``). A deny rule refuses a
URI when it matches *any* reading, and an allow rule admits one only when it matches the
normal form and every decoding (``decoded_readings``): the rules fail closed, whichever
way the server reads. A dot segment hidden behind an encoded slash is refused outright,
in any of the decodings, since no glob can tell where it leads.

Cost: a URI that needs no change (the usual case) is recognised by a handful of
C-level checks (``isascii``, ``isprintable``, ``in``) and returned as it is.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = "0123456789ABCDEFabcdef"
# Every "%XX" spelling -> its normal form: the character if unreserved, else upper-case hex.
_ESCAPES = {
    f"%{a}{b}": (chr(int(a + b, 16)) if chr(int(a + b, 16)) in _UNRESERVED else f"%{a}{b}".upper())
    for a in _HEX
    for b in _HEX
}
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# A glob's scheme may hold glob characters too ("*://host/*").
_GLOB_SCHEME = re.compile(r"[A-Za-z0-9+.*?\[\]!-]+")
# Already in normal form, unless it holds "/." or ":." (checked apart): lower-case scheme,
# no upper case, "%", "@" or ":" in an authority (user info and ports take the slow path),
# an authority followed by a path ("/"), no "%", "\" or space anywhere.
_ALREADY_NORMAL = re.compile(r"[a-z][a-z0-9+.-]*:(?://[^/?#A-Z%@: ]*(?=/)|(?!//))[^%\\ ]*")
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_EXPRESSION = re.compile(r"(\{[^}]*\})")
# Printable ASCII but the space, '%' included: quote() encodes only the space and non-ASCII.
_ASCII = "".join(chr(code) for code in range(0x21, 0x7F))


# The longest URI the proxy looks up or forwards: far above any resource URI in use, far
# below what would let one request hold the event loop (normal form and readings are linear).
MAX_URI_LENGTH = 16384


class InvalidUri(ValueError):
    """A URI the proxy refuses to look up or forward; the message says why, for a human."""


def normalize_uri(uri: str) -> str:
    """The normal form of a URI a client sent (see the module docstring); raises
    ``InvalidUri`` when it must be refused."""
    if not uri:
        raise InvalidUri("uri is empty")
    if len(uri) > MAX_URI_LENGTH:  # what follows is linear in the length, and blocks everyone
        raise InvalidUri(f"uri is longer than {MAX_URI_LENGTH} characters")
    if not uri.isprintable():
        bad = next(char for char in uri if not char.isprintable())
        raise InvalidUri(f"uri contains U+{ord(bad):04X}, a control, whitespace or invisible character")
    if uri[0] == " " or uri[-1] == " ":
        raise InvalidUri("uri has leading or trailing whitespace")
    if uri.isascii() and _ALREADY_NORMAL.fullmatch(uri) and "/." not in uri and ":." not in uri:
        return uri  # the usual case: nothing to change, decided by C-level scans
    if "%" in uri and _BAD_PERCENT.search(uri):
        raise InvalidUri("uri has a '%' that does not start a %XX escape")
    normal = _normalize(uri, dots=True)
    if normal is None:
        raise InvalidUri("uri has no scheme (expected an absolute URI such as file:///path)")
    if ("%" in normal or "\\" in normal) and _hides_dot_segment(normal):
        raise InvalidUri("uri hides a '.' or '..' path segment behind an encoded '/' or a '\\'")
    return normal


def readings(normal: str) -> tuple[str, ...]:
    """The ways a server might read a URI in normal form (see "Readings" above): the normal
    form first, then its decodings, then, for each, what URL parsers and servers make of
    it: tab, CR and LF dropped, and controls and spaces at its ends (WHATWG, ``urlsplit``);
    the query and fragment dropped; ``\\`` as ``/``, runs of ``/`` folded and dot segments
    resolved (file systems, WHATWG); the authority's user info and port dropped, and a
    ``file:`` URI's host (a server that reads files goes by the path); trailing slashes
    dropped; and the part after ``scheme:`` with none to three slashes before it.
    ``decoded_readings`` is the first two alone."""
    found = dict.fromkeys(decoded_readings(normal))
    for step in (
        _without_controls,
        _without_query,
        _slashes_resolved,
        _bare_authority,
        _without_trailing_slashes,
    ):
        for reading in list(found):
            found.setdefault(step(reading))
    for reading in list(found):
        colon = reading.find(":")
        if colon > 0:
            head, path = reading[: colon + 1], reading[colon + 1 :].lstrip("/")
            for slashes in _SLASHES:
                found.setdefault(head + slashes + path)
    return tuple(found)


def _without_controls(uri: str) -> str:
    """``uri`` as WHATWG URL parsers take it: no tab, CR or LF anywhere, no C0 control or
    space at either end (here, decoded ones: ``%09``, ``%20``)."""
    if "\t" in uri or "\n" in uri or "\r" in uri:
        uri = uri.translate(_TAB_AND_NEWLINES)
    stripped = uri.strip(_C0_AND_SPACE)
    while len(stripped) >= 3 and stripped[-3] == "%" and (stripped[-2] in "01" or stripped[-2:] == "20"):
        stripped = stripped[:-3].rstrip(_C0_AND_SPACE)  # an escaped one: %00-%1F, %20
    return stripped


def _slashes_resolved(uri: str) -> str:
    """``uri`` as a file system or a WHATWG parser reads what follows its scheme: ``\\``
    (or its escape) as ``/``, runs of ``/`` as one past the leading ones, then ``.`` and
    ``..`` segments resolved (the query and fragment are left as they are)."""
    colon = uri.find(":")
    if colon <= 0:
        return uri
    end = colon + 1 + len(_without_query(uri[colon + 1 :]))
    rest = uri[colon + 1 : end]
    if "\\" not in rest and "%5C" not in rest and "//" not in rest.lstrip("/") and "." not in rest:
        return uri
    rest = rest.replace("%5C", "/").replace("\\", "/")
    body = rest.lstrip("/")
    body = _remove_dot_segments("/" + re.sub(r"/{2,}", "/", body))[1:]
    return uri[: colon + 1] + "/" * (len(rest) - len(rest.lstrip("/"))) + body + uri[end:]


def _without_query(uri: str) -> str:
    """``uri`` up to its query or fragment."""
    ends = [at for at in (uri.find("?"), uri.find("#")) if at != -1]
    return uri[: min(ends)] if ends else uri


def _bare_authority(uri: str) -> str:
    """``uri`` with no user info or port in its authority, and no host at all for ``file:``."""
    colon = uri.find(":")
    if colon <= 0 or not uri.startswith("//", colon + 1):
        return uri
    start = colon + 3
    end = _authority_end(uri, start)
    if uri[:colon] == "file":
        return uri[:start] + uri[end:]
    host = uri[start:end].rpartition("@")[2]
    bracket = host.rfind("]")
    port = host.rfind(":")
    return uri[:start] + (host[:port] if port > bracket else host) + uri[end:]


def _without_trailing_slashes(uri: str) -> str:
    stripped = uri.rstrip("/")
    return stripped if stripped and not stripped.endswith(":") else uri


_TAB_AND_NEWLINES = {9: None, 10: None, 13: None}
_C0_AND_SPACE = "".join(chr(code) for code in range(0x21))


def decoded_readings(normal: str) -> tuple[str, ...]:
    """The normal form, then each round of percent-decoding it, normalised again."""
    if "%" not in normal:
        return (normal,)
    found = [normal]
    text = normal
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
        again = _normalize(decoded, dots=True)
        found.append(decoded if again is None else again)
        if "%" not in text:
            break
    return tuple(dict.fromkeys(found))


# How many times a server might decode a URI it is given (a deny rule holds for each).
_DECODE_ROUNDS = 3
_SLASHES = ("", "/", "//", "///")


def normalize_pattern(pattern: str) -> str:
    """The normal form of an allow/deny glob for resources: like ``normalize_uri``, but it
    never refuses (a glob need not be a URI, and ``*``, ``?`` and ``[`` keep their meaning)."""
    normal = _normalize(pattern, dots=True, scheme=_GLOB_SCHEME)
    return pattern if normal is None else normal


def normalize_template(template: str) -> str:
    """The normal form of an RFC 6570 template (or a glob over templates): the literal
    parts normalised like a URI, expressions (``{id}``) kept exactly, no dot removal."""
    if "{" not in template:
        normal = _normalize(template, dots=False)
        return template if normal is None else normal
    parts = _EXPRESSION.split(template)
    for index in range(0, len(parts), 2):  # even indexes are literal text
        literal = parts[index]
        if not literal.isascii() or " " in literal:
            literal = quote(literal, safe=_ASCII)
        literal = literal.replace("\\", "%5C")
        if "%" in literal:
            literal = _ESCAPE.sub(_escape, literal)
        parts[index] = literal
    text = "".join(parts)
    head = text[: text.index("{")]
    colon = head.find(":")
    if colon > 0 and _SCHEME.fullmatch(head, 0, colon):
        text = _lower_scheme_and_host(text, colon, limit=len(head))
    return text


def _escape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


def _normalize(uri: str, *, dots: bool, scheme: re.Pattern[str] = _SCHEME) -> str | None:
    """Steps 1-4 of the module docstring; None if ``uri`` has no scheme."""
    if not uri.isascii() or " " in uri:
        uri = quote(uri, safe=_ASCII)
    if "\\" in uri:  # no URI holds one; a URL parser reads it as "/" in http(s) URLs
        uri = uri.replace("\\", "%5C")
    if "%" in uri:
        uri = _ESCAPE.sub(_escape, uri)
    colon = uri.find(":")
    if colon <= 0 or not scheme.fullmatch(uri, 0, colon):
        return None
    if dots:
        start, end = _path_bounds(uri, colon)
        path = uri[start:end]
        if path.startswith(".") or "/." in path:
            uri = uri[:start] + _remove_dot_segments(path) + uri[end:]
    # After dot removal: "s:/..//HOST/x" has become "s://HOST/x", whose host is now HOST.
    return _lower_scheme_and_host(uri, colon, limit=len(uri))


def _lower_scheme_and_host(uri: str, colon: int, *, limit: int) -> str:
    """Lower-case the scheme, and normalise an authority that ends before ``limit``: the
    host lower-cased, an empty user info or port dropped (RFC 3986 §6.2.3: ``s://@h:/x`` is
    ``s://h/x``, and WHATWG URL parsers, the SDKs' among them, read it so), a scheme's
    default port dropped and an empty path made ``/`` for the schemes that have them."""
    scheme = uri[:colon]
    if not scheme.islower():
        scheme = scheme.lower()
        uri = scheme + uri[colon:]
    if uri.startswith("//", colon + 1):
        start = colon + 3
        end = _authority_end(uri, start)
        if end > limit:
            return uri
        at = uri.rfind("@", start, end)
        userinfo = "" if at == -1 else uri[start : at + 1]
        if userinfo in ("@", ":@"):
            userinfo = ""
        hostport = uri[start if at == -1 else at + 1 : end]
        host, port = hostport, ""
        bracket = hostport.rfind("]")
        port_colon = hostport.rfind(":")
        if port_colon > bracket and hostport[port_colon + 1 :].isdigit() or port_colon == len(hostport) - 1 > bracket:
            host, port = hostport[:port_colon], hostport[port_colon + 1 :]
        if host != host.lower():
            host = host.lower()
            if "%" in host:  # lower() also lowered the hex of escapes in the host
                host = _ESCAPE.sub(lambda m: m.group().upper(), host)
        default = _DEFAULT_PORTS.get(scheme.rpartition("+")[2])
        if port and default is not None and port.lstrip("0") == default:
            port = ""
        authority = userinfo + host + (":" + port if port else "")
        rest = uri[end:]
        if default is not None and not rest[:1] == "/":
            rest = "/" + rest  # "http://h" and "http://h?q" are "http://h/" and "http://h/?q"
        uri = uri[:start] + authority + rest
    return uri


# Schemes whose URLs have a default port and a path of at least "/" (WHATWG "special"
# schemes): a server that parses its URIs as URLs reads "http://h:80" as "http://h/".
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443", "ftp": "21"}


def _authority_end(uri: str, start: int) -> int:
    end = len(uri)
    for delimiter in "/?#":
        found = uri.find(delimiter, start, end)
        if found != -1:
            end = found
    return end


def _path_bounds(uri: str, colon: int) -> tuple[int, int]:
    """Where the path of ``uri`` starts and ends (before any query or fragment)."""
    start = colon + 1
    if uri.startswith("//", start):
        start = _authority_end(uri, start + 2)
    end = len(uri)
    for delimiter in "?#":
        found = uri.find(delimiter, start, end)
        if found != -1:
            end = found
    return start, end


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for a path, in one pass over its segments (linear, whatever the
    input: a long run of ``/./`` must not cost quadratic time)."""
    absolute = path.startswith("/")
    segments = path.split("/")
    if absolute:
        segments = segments[1:]
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    if segments and segments[-1] in (".", ".."):
        kept.append("")  # "/a/b/.." is "/a/": the directory, not the file
    joined = "/".join(kept)
    return "/" + joined if absolute else joined


def _hides_dot_segment(uri: str) -> bool:
    """Whether decoding the escapes (up to one round more than ``readings`` follows: a
    server that decodes twice reads ``..%255C`` as ``..\\``) and reading ``\\`` as ``/``
    turns up a dot segment."""
    colon = uri.index(":")
    start, end = _path_bounds(uri, colon)
    path = uri[start:end]
    for _ in range(_DECODE_ROUNDS + 1):
        if "%2F" in path or "%5C" in path or "%2f" in path or "%5c" in path or "\\" in path:
            decoded = unquote(path).replace("\\", "/")
            if any(segment in (".", "..") for segment in decoded.split("/")):
                return True
        if "%" not in path:
            return False
        path = unquote(path)
    return False


def expose_uri(prefix: str, uri: Any) -> Any:
    if not prefix or type(uri) is not str:
        return uri
    return f"{prefix}+{uri}"


def split_uri(uri: str, prefixes: dict[str, str]) -> tuple[str, str] | None:
    """``(server, upstream URI)`` for an exposed URI, by its scheme prefix; else None.

    ``prefixes`` maps lower-cased URI prefixes to server names.
    """
    plus = uri.find("+")
    if plus <= 0:
        return None
    colon = uri.find(":")
    if colon != -1 and colon < plus:
        return None  # the "+" is after the scheme: not one of ours
    if uri[plus + 1 : plus + 2] not in _LETTERS:
        return None  # nothing after the prefix is a scheme: "p+://x", "p+1:x"
    server = prefixes.get(uri[:plus].lower())
    if server is None:
        return None
    return server, uri[plus + 1 :]


def rewrite_content_uris(blocks: Any, prefix: str) -> Any:
    """Expose URIs inside content blocks (tool results, prompt messages), in place.

    ``resource_link`` blocks carry ``uri``; embedded ``resource`` blocks carry
    ``resource.uri``. Anything else is left alone.
    """
    if type(blocks) is not list:
        return blocks
    for block in blocks:
        if type(block) is not dict:
            continue
        kind = block.get("type")
        if kind == "resource_link":
            if "uri" in block:
                block["uri"] = expose_uri(prefix, block["uri"])
        elif kind == "resource":
            resource = block.get("resource")
            if type(resource) is dict and "uri" in resource:
                resource["uri"] = expose_uri(prefix, resource["uri"])
    return blocks


def template_matches(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of the RFC 6570 ``template``.

    Literal parts must appear in order; each expression matches any run of characters.
    It errs towards matching, which is the safe side for its two uses: finding the owner
    of an unprefixed URI, and refusing URIs that a hidden template could expand to. Give
    it both sides in normal form (``normalize_template``, ``normalize_uri``).
    """
    literals: list[str] = []
    index = 0
    while True:
        open_brace = template.find("{", index)
        if open_brace == -1:
            literals.append(template[index:])
            break
        literals.append(template[index:open_brace])
        close = template.find("}", open_brace)
        if close == -1:
            return False
        index = close + 1
    if len(literals) == 1:
        return template == uri
    head, *middle, tail = literals
    end = len(uri) - len(tail)
    if end < len(head) or not uri.startswith(head) or not uri.endswith(tail):
        return False
    position = len(head)
    for literal in middle:
        found = uri.find(literal, position, end)
        if found == -1:
            return False
        position = found + len(literal)
    return True

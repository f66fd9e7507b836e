"""What a registry may name, checked before anything of it reaches a config file: package
names and versions per runner (npm, PyPI, OCI), arguments, variable and header names, and
the URLs of remote servers.

A registry is untrusted. The proxy starts a server without a shell, but a person may paste
the command a config shows into one, so a name or an argument holding a shell
metacharacter, whitespace, a control character or a leading ``-`` (an option where a name
was meant) is refused, with the reason and the offending text shown escaped.

Pure: no I/O; imports only ``errors``.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from urllib.parse import urlsplit

from aggregator.errors import AggregatorError


class RegistryError(AggregatorError):
    """What a registry sent, or where it was asked, cannot be used; the message says what
    (the server, the field by its path in server.json) and why."""


# npm's rules for a package name (validate-npm-package-name, new packages): lower case,
# URL-safe, at most 214 characters, an optional @scope/; not starting with . or _ (nor -
# here: it would read as an option).
_NPM_PART = r"[a-z0-9~][a-z0-9._~-]*"
NPM_NAME = re.compile(rf"(?:@{_NPM_PART}/)?{_NPM_PART}")
# One exact semantic version (npm refuses ranges here: ^1.2, ~1.2, >=1, 1.x, *).
SEMVER = re.compile(
    r"(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)
# PEP 508 names: letters, digits, . _ -, starting and ending with a letter or a digit.
PYPI_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# One exact PEP 440 public version (with a local label): 2026.10.19, 1.0rc1, 1.2.post1.dev3+abc.
PEP440 = re.compile(
    r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?",
    re.IGNORECASE,
)
# An OCI image reference: [registry[:port]/]path[:tag][@sha256:digest], the distribution
# spec's grammar (lower-case path components separated by . _ __ or dashes).
_OCI_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_OCI_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)"
OCI_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
OCI_REFERENCE = re.compile(
    rf"(?P<image>{_OCI_HOST}?{_OCI_COMPONENT}(?:/{_OCI_COMPONENT})*)"
    rf"(?::(?P<tag>{OCI_TAG.pattern}))?(?:@(?P<digest>sha256:[a-f0-9]{{64}}))?"
)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # RFC 9110 allows more; no header in use needs it
# A named argument's flag: -x, --long-name, --opt.name (no value glued on: that is its value).
FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9._-]*")
# What a shell treats specially, anywhere in a word (quotes, expansion, redirection, globs,
# command separators, history, comments, escapes).
SHELL_META = frozenset(";&|<>()$`\\\"'*?[]{}!#~")
# Unicode categories that are unseen or read as a blank: controls, format characters
# (zero-width, bidi overrides, U+FEFF), surrogates, and every separator (U+3000, U+2003,
# U+2028 as well as the space).
_UNSEEN = frozenset(("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"))
_NAME_LIMIT = 214
_VALUE_LIMIT = 1024


def unseen(char: str) -> bool:
    """Whether ``char`` is whitespace, a control or an invisible format character."""
    return char.isspace() or unicodedata.category(char) in _UNSEEN


def _has_unseen(text: str) -> bool:
    return any(unseen(char) for char in text)


def escaped(text: str) -> str:
    """``text`` with every character ``unseen`` (but the plain space) escaped: ``\\x1b``,
    ``\\u2028``, ``\\u202e``, so that what a registry sends cannot hide or reorder text."""
    return "".join(_escape(char) if char != " " and unseen(char) else char for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: str, limit: int = 80) -> str:
    """``text`` for a message: quoted, control characters escaped, cut at ``limit``."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return repr(text)


def unsafe_reason(text: str) -> str | None:
    """Why ``text`` may not be a word of a command line (None: it may)."""
    if not text:
        return "it is empty"
    if len(text) > _VALUE_LIMIT:
        return f"it is longer than {_VALUE_LIMIT} characters"
    if _has_unseen(text):
        return "it holds whitespace or a control character (Unicode spaces and invisible format characters too)"
    if any(char in SHELL_META for char in text):
        found = sorted({char for char in text if char in SHELL_META})
        return f"it holds shell metacharacters ({' '.join(found)})"
    if text.startswith("-"):
        return "it starts with '-' (it would read as an option)"
    return None


def check_word(text: str, where: str) -> str:
    """``text`` if it may be a word of a command line; RegistryError naming ``where`` if not."""
    reason = unsafe_reason(text)
    if reason is not None:
        raise RegistryError(f"{where}: {shown(text)} is refused: {reason}")
    return text


def check_flag(text: str, where: str) -> str:
    """A named argument's flag (``--port``): dashes, then a letter or digit, then name characters."""
    if not FLAG.fullmatch(text) or len(text) > 100:
        raise RegistryError(f"{where}: {shown(text)} is not an option name (--name, letters, digits, . _ -)")
    return text


def check_package(registry_type: str, identifier: str, version: str | None, where: str) -> str:
    """The package spec a runner is given (``pkg@1.2.3``, ``pkg==1.2.3``, ``image:tag``),
    each part checked against the runner's own grammar; RegistryError naming ``where``."""
    if registry_type == "npm":
        if len(identifier) > _NAME_LIMIT or not NPM_NAME.fullmatch(identifier):
            raise RegistryError(
                f"{where}.identifier: {shown(identifier)} is not an npm package name"
                " (lower case letters, digits, . _ ~ -, an optional @scope/, not starting with - . _)"
            )
        return f"{identifier}@{_exact_version(version, SEMVER, 'an exact semantic version (1.2.3)', where)}"
    if registry_type == "pypi":
        if len(identifier) > _NAME_LIMIT or not PYPI_NAME.fullmatch(identifier):
            raise RegistryError(
                f"{where}.identifier: {shown(identifier)} is not a PyPI package name"
                " (letters, digits, . _ -, starting and ending with a letter or digit)"
            )
        return f"{identifier}=={_exact_version(version, PEP440, 'an exact PEP 440 version (1.2.3)', where)}"
    if registry_type == "oci":
        match = OCI_REFERENCE.fullmatch(identifier) if len(identifier) <= 512 else None
        if match is None:
            raise RegistryError(
                f"{where}.identifier: {shown(identifier)} is not an OCI image reference"
                " ([registry/]name[:tag][@sha256:digest], lower case names)"
            )
        if match["tag"] == "latest" and not match["digest"]:
            raise RegistryError(
                f"{where}.identifier: {shown(identifier)} is refused: 'latest' is not a pinned version"
                " (a tag such as 1.2.3, or a @sha256: digest)"
            )
        if match["tag"] or match["digest"]:
            return identifier
        tag = _exact_version(version, OCI_TAG, "an image tag", where)
        return f"{identifier}:{tag}"
    raise RegistryError(f"{where}.registryType: {shown(registry_type)} is not a runner this can write")


def oci_tag(identifier: str) -> str | None:
    """The tag an OCI reference names (``image:1.2`` -> ``1.2``), None if it names none."""
    match = OCI_REFERENCE.fullmatch(identifier)
    return match["tag"] if match else None


def _exact_version(version: str | None, grammar: re.Pattern[str], what: str, where: str) -> str:
    if version is None:
        raise RegistryError(f"{where}.version: missing: a package is installed at a pinned version")
    if version == "latest" or not grammar.fullmatch(version) or len(version) > 128:
        raise RegistryError(f"{where}.version: {shown(version)} is not {what}")
    return version


def check_env_name(name: str, where: str) -> str:
    if not ENV_NAME.fullmatch(name) or len(name) > 128:
        raise RegistryError(f"{where}.name: {shown(name)} is not a variable name (letters, digits, _)")
    return name


def check_header_name(name: str, where: str) -> str:
    if not HEADER_NAME.fullmatch(name) or len(name) > 128:
        raise RegistryError(f"{where}.name: {shown(name)} is not an HTTP header name")
    return name


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_remote_url(url: str, where: str) -> str:
    """A remote server's URL: https, or http to 127.0.0.1 only (a server on this machine);
    no credentials, whitespace or control characters in it."""
    if len(url) > 2048 or _has_unseen(url):
        raise RegistryError(f"{where}.url: {shown(url)} is refused: too long, or whitespace or control characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise RegistryError(f"{where}.url: {shown(url)} is not a URL") from None
    if parts.username is not None or parts.password is not None:
        raise RegistryError(f"{where}.url: {shown(url)} is refused: it carries credentials")
    if not host:
        raise RegistryError(f"{where}.url: {shown(url)} is not a URL with a host")
    if parts.scheme == "https":
        return url
    if parts.scheme == "http" and host == "127.0.0.1":
        return url
    raise RegistryError(
        f"{where}.url: {shown(url)} is refused: a remote server is reached over https (http only on 127.0.0.1)"
    )

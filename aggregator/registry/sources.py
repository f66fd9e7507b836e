"""Where entries come from: an MCP registry over HTTP (the frozen API v0.1: ``GET
/v0.1/servers?search=&limit=&cursor=&updated_since=&version=latest`` and ``GET
/v0.1/servers/{name}/versions/{version}``), or a local directory of server.json files
(offline, ``file://`` or a path).

Everything a registry sends is untrusted: an answer is read up to a size bound and a
deadline (the whole answer, not each read), refused past a nesting depth, never followed
through a redirect, and each entry is checked (``entries``) before anything uses it. A
registry is asked over https only, or plain http on a loopback address. Paging follows
``metadata.nextCursor`` for a bounded number of pages and stops at a cursor seen before.

Blocking I/O for the command line: each answer is one ``trio.run`` of httpx's client
under a ``trio.move_on_after`` for the whole exchange; the file system read directly.
Imports ``errors``, ``jsonrpc`` and the modules beside it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlencode, urlsplit

import attrs
import httpx
import trio

from aggregator.jsonrpc.codec import loads
from aggregator.registry.entries import ServerEntry, read_entry
from aggregator.registry.identifiers import RegistryError, is_loopback, shown

OFFICIAL_URL = "https://registry.modelcontextprotocol.io"
API = "v0.1"
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # one page or one entry; the official pages are far smaller
MAX_DEPTH = 32  # server.json nests about 8 deep
DEADLINE = 20.0  # seconds for one answer: connecting, headers and body together
MAX_PAGES = 20
PAGE_SIZE = 100  # the official registry's own largest page
MAX_FILES = 10_000  # a directory registry
_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}


@attrs.frozen(kw_only=True)
class Found:
    """A search's entries, and the ones skipped with why (a broken entry hides only itself)."""

    entries: tuple[ServerEntry, ...]
    skipped: tuple[str, ...] = ()
    cut: str | None = None  # why the list may be incomplete (the page bound)


class Registry(Protocol):
    label: str

    def search(self, query: str, limit: int, updated_since: str | None = None) -> Found: ...

    def get(self, name: str, version: str | None) -> ServerEntry: ...


@attrs.frozen(kw_only=True)
class Limits:
    max_bytes: int = MAX_ANSWER_BYTES
    deadline: float = DEADLINE
    max_depth: int = MAX_DEPTH


def open_registry(spec: str, *, relative_to: Path | None = None, limits: Limits | None = None) -> Registry:
    """The registry ``spec`` names: an https URL (http on a loopback address), a
    ``file://`` URL or a directory (relative: to ``relative_to``, else the working one)."""
    limits = limits or Limits()
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", spec):
        try:
            parts = urlsplit(spec)
            host = parts.hostname
        except ValueError:
            raise RegistryError(f"registry {shown(spec)}: not a URL") from None
        scheme = parts.scheme.lower()
        if scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise RegistryError(
                    f"registry {shown(spec)}: a file URL names an absolute path (file:///path/to/dir);"
                    " give a relative directory as a plain path"
                )
            return DirectoryRegistry(Path(unquote(parts.path)), limits)
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise RegistryError(f"registry {shown(spec)}: give its base URL alone (no credentials, query or fragment)")
        if scheme == "https" or (scheme == "http" and is_loopback(host)):
            if not host:
                raise RegistryError(f"registry {shown(spec)}: a URL without a host")
            return HttpRegistry(spec.rstrip("/"), limits, local=is_loopback(host))
        raise RegistryError(
            f"registry {shown(spec)}: a registry is asked over https (plain http only on a loopback address)"
        )
    path = Path(spec)
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    return DirectoryRegistry(path, limits)


# --- over HTTP --------------------------------------------------------------------------


class HttpRegistry:
    def __init__(self, base: str, limits: Limits, *, local: bool = False) -> None:
        self.base = base
        self.label = base
        self.limits = limits
        self.local = local  # on this machine: asked directly, never through $HTTPS_PROXY

    def search(self, query: str, limit: int, updated_since: str | None = None) -> Found:
        entries: list[ServerEntry] = []
        skipped: list[str] = []
        cursor: str | None = None
        seen: set[str] = set()
        listed: set[tuple[str, str]] = set()
        cut: str | None = None
        for page_number in range(1, MAX_PAGES + 1):
            params = {"search": query, "limit": str(min(PAGE_SIZE, limit)), "version": "latest"}
            if not query:
                del params["search"]
            if cursor is not None:
                params["cursor"] = cursor
            if updated_since is not None:
                params["updated_since"] = updated_since
            page = self._get(f"/{API}/servers?{urlencode(params)}", "a page of servers")
            if not isinstance(page, dict) or not isinstance(page.get("servers"), list):
                raise RegistryError(f"registry {self.label}: its answer has no list of servers (not the v0.1 API?)")
            for index, item in enumerate(page["servers"]):
                try:
                    entry = read_entry(item, f"servers[{index}]")
                except RegistryError as exc:
                    skipped.append(str(exc))
                    continue
                if (entry.name, entry.version) not in listed:  # a page sent twice is listed once
                    listed.add((entry.name, entry.version))
                    entries.append(entry)
            metadata = page.get("metadata")
            cursor = metadata.get("nextCursor") if isinstance(metadata, dict) else None
            if len(entries) >= limit or not isinstance(cursor, str) or not cursor or cursor in seen:
                break
            seen.add(cursor)
            if page_number == MAX_PAGES:
                cut = f"stopped after {MAX_PAGES} pages of registry {self.label}; the list may be incomplete"
        return Found(entries=tuple(entries[:limit]), skipped=tuple(skipped), cut=cut)

    def get(self, name: str, version: str | None) -> ServerEntry:
        wanted = version or "latest"
        path = f"/{API}/servers/{quote(name, safe='')}/versions/{quote(wanted, safe='')}"
        item = self._get(path, f"{name} {wanted}", missing=f"no server {name}" + (f" {version}" if version else ""))
        entry = read_entry(item)
        if entry.name != name:
            raise RegistryError(f"registry {self.label}: asked for {name}, it answered with {shown(entry.name)}")
        if version is not None and entry.version != version:
            raise RegistryError(
                f"registry {self.label}: asked for {name} {version}, it answered with version {shown(entry.version)}"
            )
        return entry

    def _get(self, path: str, what: str, missing: str | None = None) -> Any:
        """One answer, the deadline covering the whole exchange (connecting, the status
        line and headers, the body): a registry that trickles bytes meets it too."""
        body = trio.run(self._fetch, path, what, missing)
        return self._decode(body, what)

    async def _fetch(self, path: str, what: str, missing: str | None) -> bytes:
        limits = self.limits
        body = bytearray()
        with trio.move_on_after(limits.deadline) as deadline:
            try:
                async with (
                    httpx.AsyncClient(
                        timeout=limits.deadline, follow_redirects=False, trust_env=not self.local
                    ) as client,
                    # identity: the size bound counts the bytes parsed, never a compressed stream's
                    client.stream("GET", self.base + path, headers=_HEADERS) as answer,
                ):
                    if answer.status_code == 404 and missing is not None:
                        raise RegistryError(f"{missing} in registry {self.label}")
                    if answer.status_code != 200:
                        raise RegistryError(
                            f"registry {self.label}: asked for {what}, it answered HTTP {answer.status_code}"
                        )
                    encoding = answer.headers.get("content-encoding", "identity").strip().lower()
                    if encoding not in ("", "identity"):
                        raise RegistryError(
                            f"registry {self.label}: its answer for {what} is {shown(encoding)}-encoded,"
                            " though asked for plain bytes; refused"
                        )
                    declared = answer.headers.get("content-length")
                    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                        raise RegistryError(self._too_large(what))
                    async for chunk in answer.aiter_raw():
                        body += chunk
                        if len(body) > limits.max_bytes:
                            raise RegistryError(self._too_large(what))
            except httpx.TimeoutException:
                raise RegistryError(self._too_slow(what)) from None
            except httpx.HTTPError as exc:
                raise RegistryError(f"registry {self.label}: cannot ask for {what}: {exc}") from None
        if deadline.cancelled_caught:
            raise RegistryError(self._too_slow(what))
        return bytes(body)

    def _decode(self, body: bytes, what: str) -> Any:
        try:
            return loads(body, max_depth=self.limits.max_depth)
        except ValueError as exc:
            raise RegistryError(f"registry {self.label}: its answer for {what} is not usable JSON: {exc}") from None

    def _too_large(self, what: str) -> str:
        return f"registry {self.label}: its answer for {what} is larger than {self.limits.max_bytes} bytes; refused"

    def _too_slow(self, what: str) -> str:
        return f"registry {self.label}: no whole answer for {what} within {self.limits.deadline:g} s; gave up"


# --- a directory ------------------------------------------------------------------------


class DirectoryRegistry:
    """Every ``*.json`` file under a directory: a server.json, or an API item with its
    ``_meta`` (which can say an entry is deprecated or deleted)."""

    def __init__(self, path: Path, limits: Limits) -> None:
        self.path = path
        self.label = str(path)
        self.limits = limits

    def search(self, query: str, limit: int, updated_since: str | None = None) -> Found:
        if updated_since is not None:
            raise RegistryError(f"registry {self.label}: a directory has no update times (--updated-since)")
        entries, skipped = self._read()
        needle = query.lower()
        latest: dict[str, ServerEntry] = {}
        for entry in entries:
            text = f"{entry.name}\n{entry.title or ''}\n{entry.description}".lower()
            if needle in text and _newer(entry, latest.get(entry.name)):
                latest[entry.name] = entry
        found = sorted(latest.values(), key=lambda e: e.name)
        return Found(entries=tuple(found[:limit]), skipped=tuple(skipped))

    def get(self, name: str, version: str | None) -> ServerEntry:
        entries, _ = self._read()
        versions = [entry for entry in entries if entry.name == name]
        if not versions:
            raise RegistryError(f"no server {name} in registry {self.label}")
        if version is not None:
            for entry in versions:
                if entry.version == version:
                    return entry
            known = ", ".join(sorted({e.version for e in versions}))
            raise RegistryError(f"no server {name} {version} in registry {self.label} (it has {known})")
        best = versions[0]
        for entry in versions[1:]:
            if _newer(entry, best):
                best = entry
        return best

    def _read(self) -> tuple[list[ServerEntry], list[str]]:
        if not self.path.is_dir():
            raise RegistryError(f"registry {shown(self.label)}: not a directory (nor an https URL)")
        entries: list[ServerEntry] = []
        skipped: list[str] = []
        root = self.path.resolve()
        where: dict[tuple[str, str], Path] = {}
        for file in self._files():
            try:
                if not file.is_file():  # a device, a pipe, a dangling link
                    raise RegistryError("not a regular file")
                if not file.resolve().is_relative_to(root):
                    raise RegistryError("a link to a file outside the registry's directory; refused")
                with file.open("rb") as opened:
                    data = opened.read(self.limits.max_bytes + 1)
                if len(data) > self.limits.max_bytes:
                    raise RegistryError(f"larger than {self.limits.max_bytes} bytes")
                entry = read_entry(loads(data, max_depth=self.limits.max_depth))
                first = where.setdefault((entry.name, entry.version), file)
                if first != file:
                    raise RegistryError(f"{entry.name} {entry.version} again (the one in {first} is read)")
                entries.append(entry)
            except (RegistryError, ValueError, OSError) as exc:
                skipped.append(f"{file}: {exc}")
        return entries, skipped

    def _files(self) -> Iterator[Path]:
        count = 0
        for directory, folders, files in os.walk(self.path):
            folders.sort()
            for name in sorted(files):
                if name.endswith(".json"):
                    count += 1
                    if count > MAX_FILES:
                        raise RegistryError(f"registry {self.label}: more than {MAX_FILES} files; refused")
                    yield Path(directory) / name


def _newer(entry: ServerEntry, than: ServerEntry | None) -> bool:
    """Whether ``entry`` is a later version than ``than``: the registry's isLatest when
    either says it, else by version (numbers compared as numbers)."""
    if than is None:
        return True
    if entry.is_latest or than.is_latest:
        return bool(entry.is_latest) and not than.is_latest
    return _version_key(entry.version) > _version_key(than.version)


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.+-]", version))

"""Each server's last listing, kept on disk: what a lazy server's catalog is until it starts.

One file per server and configuration in ``proxy.cache_dir``, named by the server and a
key: a hash of what makes it the same server (its command, args, the names of its env,
its url, its transport) and of the cache's format version. A changed configuration is
another key, so another file: a stale listing of another command is never shown. The
file holds the key again, checked on read.

A cache file is input like any other: read only up to ``MAX_BYTES``, decoded with the
codec's depth limit, and taken only if every kind is a list (at most ``MAX_ITEMS``) of
objects with their key (``name``, ``uri``, ``uriTemplate``) a string. Anything else is
no cache: the server is started to list again, and a warning says why. Writes are
atomic (a temporary file in the same directory, then ``os.replace``), and a listing
larger than ``MAX_BYTES`` is not kept.

Blocking file I/O: the hub runs ``write`` in a worker thread; ``read`` runs once per
server before anything is served.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from aggregator.config import Config, ServerConfig
from aggregator.config.paths import beside
from aggregator.jsonrpc.codec import dumps, loads
from aggregator.mcp.constants import KEY_OF, KINDS

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAX_BYTES = 8 * 1024 * 1024  # one server's listing, as kept
MAX_ITEMS = 10_000  # of one kind
MAX_DEPTH = 64

Listing = dict[str, list[dict[str, Any]]]


def cache_dir(config: Config) -> Path:
    """Where the listings are kept: ``proxy.cache_dir`` (relative: beside the config file),
    else ``$XDG_CACHE_HOME/mcp-aggregator/listings`` (``~/.cache`` without it)."""
    configured = config.proxy.cache_dir
    if configured:
        directory = Path(config.directory) if config.directory is not None else None
        return Path(beside(directory, configured) or configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mcp-aggregator" / "listings"


def cache_key(server: ServerConfig) -> str:
    """What makes a server's listing the same: its command, args, env names, url and
    transport, and the format version (values of env and headers are secrets: not in it)."""
    what = {
        "version": FORMAT_VERSION,
        "command": server.command,
        "args": list(server.args),
        "env": sorted(server.env),
        "url": server.url,
        "transport": server.effective_transport,
    }
    return hashlib.sha256(dumps(what)).hexdigest()


def cache_path(directory: Path, server: ServerConfig) -> Path:
    return directory / f"{server.name}.{cache_key(server)[:24]}.json"


def read(directory: Path, server: ServerConfig) -> Listing | None:
    """The cached listing of ``server``, or None (none kept, or not a valid one: logged)."""
    path = cache_path(directory, server)
    try:
        # Not blocking on open, and a regular file only: a FIFO or a device there would
        # otherwise hold the start-up forever.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                log.warning("server %s: its cached listing %s is not a regular file; not used", server.name, path)
                return None
            raw = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("server %s: cannot read its cached listing %s: %s", server.name, path, exc.strerror or exc)
        return None
    problem, listing = _validated(raw, cache_key(server))
    if problem is not None:
        log.warning("server %s: its cached listing %s is not used: %s", server.name, path, problem)
        return None
    return listing


def _validated(raw: bytes, key: str) -> tuple[str | None, Listing]:
    if len(raw) > MAX_BYTES:
        return f"larger than {MAX_BYTES} bytes", {}
    try:
        data = loads(raw, MAX_DEPTH)
    except Exception as exc:  # noqa: BLE001 - any decoding problem: not a cache
        return f"not valid JSON ({exc})"[:200], {}
    if type(data) is not dict or data.get("version") != FORMAT_VERSION or data.get("key") != key:
        return "written by another version or for another configuration", {}
    listing = data.get("listing")
    if type(listing) is not dict:
        return "no listing in it", {}
    out: Listing = {}
    for kind, items in listing.items():
        if kind not in KINDS:
            return f"unknown kind {str(kind)[:40]!r}", {}
        if type(items) is not list or len(items) > MAX_ITEMS:
            return f"{kind}: not a list of at most {MAX_ITEMS} items", {}
        field = KEY_OF[kind]
        if not all(type(item) is dict and type(item.get(field)) is str for item in items):
            return f"{kind}: an item without its {field}", {}
        out[kind] = items
    return None, out


def write(directory: Path, server: ServerConfig, listing: Listing) -> None:
    """Keep ``listing`` as ``server``'s, atomically; one too large is not kept (the old one
    goes). Problems are logged, never raised: the cache only saves a start."""
    path = cache_path(directory, server)
    body = dumps({"version": FORMAT_VERSION, "key": cache_key(server), "server": server.name, "listing": listing})
    try:
        if len(body) > MAX_BYTES:
            log.warning(
                "server %s: its listing (%d bytes) is larger than the cache keeps (%d); it is not cached",
                server.name,
                len(body),
                MAX_BYTES,
            )
            path.unlink(missing_ok=True)
            return
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{server.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(body)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        log.warning("server %s: cannot cache its listing in %s: %s", server.name, directory, exc.strerror or exc)

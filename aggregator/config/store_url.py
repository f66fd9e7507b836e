"""The shared store's address, ``[cluster] store``: ``redis://[[user]:password@]host[:port][/db]``
or ``unix://[[user]:password@]/path[?db=N]``, read once (``RedisAddress.parse``, which the config
checks and the Redis client share) and only ever shown with its password masked
(``RedisAddress.display``, ``mask_url``). Pure: no I/O."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, unquote, urlsplit

import attrs


@attrs.frozen(kw_only=True)
class RedisAddress:
    """Where the server is and how to log in; ``display`` is the only form ever shown."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a unix socket instead of host and port
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    db: int = 0

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """Read ``redis://[[user]:password@]host[:port][/db]`` or ``unix://[[user]:password@]/path[?db=N]``.
        Raises ``ValueError`` with a message that shows the URL with its password masked."""
        shown = mask_url(url)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(f"not a Redis URL: {shown}") from None
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        query = parse_qs(parts.query)
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"a unix:// URL names the socket's path: {shown}")
            if parts.hostname or parts.port is not None:  # unix://relative/sock would be /sock
                raise ValueError(f"a unix:// URL names the socket's absolute path (unix:///path): {shown}")
            db = _db(query.get("db", ["0"])[-1], shown)
            return cls(path=parts.path, username=username, password=password, db=db)
        if parts.scheme != "redis":
            raise ValueError(f"a redis:// URL (redis://[:password@]host:port/db) or unix:///path, got {shown}")
        if not parts.hostname:
            raise ValueError(f"a redis:// URL names a host: {shown}")
        db = _db(parts.path.lstrip("/") or query.get("db", ["0"])[-1], shown)
        return cls(host=parts.hostname, port=port or 6379, username=username, password=password, db=db)

    def display(self) -> str:
        """The URL with the password masked: what logs, errors and the status show."""
        login = ""
        if self.password is not None:
            login = f"{quote(self.username or '', safe='')}:***@"
        elif self.username:
            login = f"{quote(self.username, safe='')}@"
        if self.path is not None:
            return f"unix://{login}{self.path}?db={self.db}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{login}{host}:{self.port}/{self.db}"


def _db(text: str, shown: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the database is a number (redis://host:port/0): {shown}")
    return int(text)


def mask_url(url: str) -> str:
    """``url`` with the password between ``:`` and ``@`` of its authority replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    login, at, host = authority.rpartition("@")
    if not at or ":" not in login:
        return url
    user = login.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{tail}"

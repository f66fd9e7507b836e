"""``python -m tests.authserver --port 0 --user alice:secret:admins,dev``: serve until stopped.

The first line on stdout is the issuer URL (``http://127.0.0.1:PORT``), printed once the socket
listens; the access log goes to stderr, method and path only.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from .app import Settings, create_app
from .keys import ALGORITHMS
from .store import Client, User


def parse_user(text: str) -> User:
    name, _, rest = text.partition(":")
    password, _, groups = rest.partition(":")
    if not name or not password:
        raise argparse.ArgumentTypeError("a user is NAME:PASSWORD[:GROUP,GROUP]")
    return User(name=name, password=password, groups=tuple(g for g in groups.split(",") if g))


def load_users(path: Path) -> list[User]:
    """A JSON list of ``{"name": ..., "password": ..., "groups": [...]}``."""
    return [User(name=u["name"], password=u["password"], groups=tuple(u.get("groups", ()))) for u in _json(path)]


def load_clients(path: Path) -> list[Client]:
    """A JSON list of RFC 7591 client metadata with ``client_id`` (and ``client_secret`` for a
    confidential client)."""
    clients = []
    for entry in _json(path):
        fields = dict(entry)
        client_id, secret = fields.pop("client_id"), fields.pop("client_secret", None)
        fields.setdefault("token_endpoint_auth_method", "client_secret_basic" if secret else "none")
        clients.append(Client(client_id=client_id, client_secret=secret, metadata=fields))
    return clients


def _json(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise SystemExit(f"{path}: expected a JSON list")
    return data


class AccessLog(WSGIRequestHandler):
    """werkzeug's handler, logging the method, the path without its query, and the status."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = self.path.partition("?")[0]
        logging.getLogger("authserver").info("%s %s %s", self.command, path, code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.authserver", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--user", type=parse_user, action="append", default=[], help="NAME:PASSWORD[:GROUP,GROUP]")
    parser.add_argument("--users", type=Path, help="a JSON list of users (name, password, groups)")
    parser.add_argument("--clients", type=Path, help="a JSON list of preregistered clients")
    parser.add_argument("--resource", action="append", default=[], help="an allowed resource (repeat); none: any")
    parser.add_argument("--scope", action="append", default=[], help="a supported scope (repeat); none: any")
    parser.add_argument("--alg", choices=ALGORITHMS, default="RS256")
    parser.add_argument("--access-lifetime", type=int, default=300, help="seconds")
    parser.add_argument("--refresh-lifetime", type=int, default=3600, help="seconds")
    parser.add_argument("--auto-approve", action="store_true", help="approve at once when login_hint names a user")
    parser.add_argument("--test-admin", action="store_true", help="enable /admin/rotate and /admin/mint (loopback)")
    args = parser.parse_args(argv)
    users = [*args.user, *(load_users(args.users) if args.users else [])]
    settings = Settings(
        users=tuple(users),
        clients=tuple(load_clients(args.clients)) if args.clients else (),
        resources=frozenset(args.resource),
        scopes=tuple(args.scope),
        alg=args.alg,
        access_lifetime=args.access_lifetime,
        refresh_lifetime=args.refresh_lifetime,
        auto_approve=args.auto_approve,
        test_admin=args.test_admin,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    listener = socket.create_server(
        (args.host, args.port), family=socket.AF_INET6 if ":" in args.host else socket.AF_INET
    )
    host, port = listener.getsockname()[:2]
    issuer = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    app = create_app(issuer, settings)
    httpd = make_server(args.host, port, app, threaded=True, request_handler=AccessLog, fd=listener.fileno())
    print(issuer, flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


if __name__ == "__main__":
    main()

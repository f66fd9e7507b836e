"""Debug logging of the message traffic: one line for each JSON-RPC message a client or a
server sends the proxy, and each the proxy sends one: its direction, its peer, what it is
(request, notification, response, error), its method, its id and its size in bytes.

Never its params, result or error data (they may hold tokens, file contents, a user's
words); an error's code is shown, its message is not. Methods and ids come from the peer,
so each is cut to ``SHOWN`` characters. Everything here costs nothing unless logger
``aggregator.traffic`` logs at DEBUG when the hub is built (``--log-level debug``): the
hub and the upstream readers ask ``enabled()`` once and call ``note`` only then.

A JSON log line carries the same as fields: ``direction`` ("in" to the proxy, "out"
from it), ``peer`` ("client 3", "server git"), ``kind``, ``method``, ``id``, ``bytes``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aggregator.core.commands import ToClient, ToServer
from aggregator.jsonrpc.codec import dumps, loads

log = logging.getLogger("aggregator.traffic")

SHOWN = 100  # characters of a method or an id, at most


def enabled() -> bool:
    """Whether traffic is logged (checked once, where a hub or a reader starts)."""
    return log.isEnabledFor(logging.DEBUG)


def note(direction: str, peer: str, message: Any) -> None:
    """Log one message (a dict, or its bytes) going ``direction`` ("in" or "out") from or to
    ``peer``. Whatever goes wrong in describing it stays here: the message goes on."""
    try:
        _note(direction, peer, message)
    except Exception:  # noqa: BLE001 - a log line must never stop a message
        log.debug("%s %s: a message this log could not describe", "from" if direction == "in" else "to", peer)


def _note(direction: str, peer: str, message: Any) -> None:
    if isinstance(message, (bytes, bytearray, memoryview)):
        size = len(message)
        try:  # as the proxy reads it: numbers exact, nesting bounded
            decoded = loads(bytes(message))
        except (ValueError, RecursionError):
            decoded = None
    else:
        decoded = message
        size = len(dumps(message))
    kind, method, id = _what(decoded)
    way = "from" if direction == "in" else "to"
    fields = {"direction": direction, "peer": peer, "kind": kind, "method": method, "id": id, "bytes": size}
    shown = " ".join(part for part in (kind, method, None if id is None else f"id={id}") if part)
    log.debug("%s %s: %s (%d bytes)", way, peer, shown, size, extra=fields)


def _what(message: Any) -> tuple[str, str | None, int | str | None]:
    """(kind, method, id) of a decoded message; "not JSON-RPC" for anything else."""
    if isinstance(message, list):
        return f"batch of {len(message)}", None, None
    if not isinstance(message, dict):
        return "not JSON-RPC", None, None
    id = message.get("id")
    shown_id = id if id is None or type(id) is int else str(id)[:SHOWN]
    method = message.get("method")
    if isinstance(method, str):
        return ("request" if "id" in message else "notification"), method[:SHOWN], shown_id
    error = message.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return (f"error {code}" if isinstance(code, int) else "error"), None, shown_id
    if "result" in message:
        return "response", None, shown_id
    return "not JSON-RPC", None, shown_id


def watch_commands(handlers: dict[type, Callable[[Any], None]]) -> bool:
    """If traffic is logged, wrap the hub's handlers of ``ToClient`` and ``ToServer`` so each
    message they queue is noted, and return True; else leave them as they are: False."""
    if not enabled():
        return False
    to_client = handlers[ToClient]
    to_server = handlers[ToServer]

    def noted_to_client(command: ToClient) -> None:
        note("out", f"client {command.session}", command.message)
        to_client(command)

    def noted_to_server(command: ToServer) -> None:
        note("out", f"server {command.server}", command.message)
        to_server(command)

    handlers[ToClient] = noted_to_client
    handlers[ToServer] = noted_to_server
    return True

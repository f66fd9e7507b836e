"""audit-log: one JSON line per answered request, with secrets in arguments redacted.

    [[plugins]]
    use = "audit-log"
    options = { path = "audit.jsonl", redact = ["password", "token", "secret"] }

Each line: time, session, profile, method, server, the server's own name, the exposed
name, the arguments (any key that contains one of ``redact``, case-insensitive, replaced
by "[redacted]", at any depth), the outcome (ok, or the error code and reason) and the
duration in milliseconds. The file is closed when the proxy stops (the ``done`` hook).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aggregator.plugins import InvalidOptions, Response

log = logging.getLogger(__name__)
DEFAULT_REDACT = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "cookie",
    "credential",
    "private_key",
)


class AuditLog:
    name = "audit-log"

    def __init__(self, path: str, redact: list[str] | tuple[str, ...] = DEFAULT_REDACT) -> None:
        problems = {}
        # An integer would be taken as a file descriptor, and "zq" as the words "z" and "q".
        if not isinstance(path, str) or not path.strip() or "\0" in path:
            problems["path"] = f"must be the name of a file (a non-empty string), got {path!r}"
        if not isinstance(redact, list | tuple) or not all(isinstance(key, str) and key for key in redact):
            problems["redact"] = f'must be a list of non-empty strings such as ["password", "token"], got {redact!r}'
        if problems:
            raise InvalidOptions(problems)
        self.redact = tuple(key.lower() for key in redact)
        try:
            # Line-buffered appends: each record reaches the file whole, in order.
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed by done()
        except OSError as exc:
            raise InvalidOptions({"path": f"cannot open {path} for appending: {exc.strerror or exc}"}) from None

    def done(self) -> None:
        self._file.close()

    def response(self, response: Response) -> None:
        if self._file.closed:  # an answer in the last moments of a shutdown
            log.warning(
                "audit-log: the proxy is stopping; %s for session %s not recorded",
                response.request.method,
                response.request.client,
            )
            return
        request = response.request
        record: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "session": request.client,
            "profile": request.profile,
            "method": request.method,
            "server": request.server,
            "name": request.name,
            "exposed": request.exposed,
            "arguments": self._redacted(request.params.get("arguments")),
            "duration_ms": round(response.duration * 1000, 3),
        }
        if response.error is not None:
            record["outcome"] = "error"
            record["error"] = {
                "code": response.error.get("code"),
                "reason": (response.error.get("data") or {}).get("reason"),
            }
        else:
            is_error = isinstance(response.result, dict) and response.result.get("isError") is True
            record["outcome"] = "tool_error" if is_error else "ok"
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def _redacted(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: "[redacted]" if any(word in str(key).lower() for word in self.redact) else self._redacted(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self._redacted(item) for item in value]
        return value

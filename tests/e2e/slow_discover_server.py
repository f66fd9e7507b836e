"""A modern-only (2026-07-28) stdio MCP server that takes ``SLOW`` seconds (argv[1]) to answer
its first ``server/discover`` and does not know ``initialize``, for the end-to-end tests.

It serves one tool, ``hello``. Run: ``python tests/e2e/slow_discover_server.py 1.0``.
"""

from __future__ import annotations

import json
import sys
import time

MODERN = "2026-07-28"
INFO = {"io.modelcontextprotocol/serverInfo": {"name": "slow-discover", "version": "1"}}


def result(method: str) -> dict | None:
    if method == "server/discover":
        return {"resultType": "complete", "supportedVersions": [MODERN], "capabilities": {"tools": {}}, "_meta": INFO}
    if method == "tools/list":
        return {"resultType": "complete", "tools": [{"name": "hello", "inputSchema": {"type": "object"}}]}
    if method == "tools/call":
        return {"resultType": "complete", "content": [{"type": "text", "text": "hello"}]}
    return None


def main() -> None:
    slow = float(sys.argv[1])
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue  # notifications and answers
        method = message["method"]
        if method == "server/discover" and slow:
            time.sleep(slow)  # only the first: this process answers at once from now on
            slow = 0.0
        answer = result(method)
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        if answer is None:
            reply["error"] = {"code": -32601, "message": f"Method not found: {method}"}
        else:
            reply["result"] = answer
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Stdio MCP servers for benchmarks: answer initialize, tools/list and tools/call.

``python -m tests.bench.echo_server [TOOLS] [--batched] [--tools-from FILE]``

By default the server works like a typical hand-written server: the stdlib ``json``
module, one line at a time, each answer written and flushed on its own (the official SDKs
work the same way, only slower, through pydantic). With ``--batched`` it uses orjson,
reads whatever the pipe holds and answers all of it in one write: an upstream that fast
leaves the proxy's own cost nowhere to hide (the stress case). TOOLS is how many tools
it lists; with ``--tools-from`` a JSON file of tools is cycled to make TOOLS of them (each
copy's name numbered): a large catalog of realistic tools.
"""

import json
import os
import sys

import orjson


def answer(message: dict, tools: list, dumps=orjson.dumps) -> bytes | None:
    if "id" not in message or "method" not in message:
        return None
    method = message["method"]
    if method == "initialize":
        result = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "echo", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call":
        result = {
            "content": [{"type": "text", "text": "ok"}],
            "structuredContent": message["params"].get("arguments", {}),
        }
    else:
        result = {}
    return dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})


def main() -> int:
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    count = int(numbers[0]) if numbers else 10
    tools = [
        {
            "name": f"tool{i}",
            "description": f"Tool number {i}.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
        }
        for i in range(count)
    ]
    if "--tools-from" in sys.argv:
        with open(sys.argv[sys.argv.index("--tools-from") + 1]) as file:
            real = json.load(file)
        tools = [{**real[i % len(real)], "name": f"{real[i % len(real)]['name']}_{i}"} for i in range(count)]
    if "--batched" not in sys.argv:
        stdout = sys.stdout.buffer
        for line in sys.stdin.buffer:
            if line.strip():
                out = answer(json.loads(line), tools, lambda m: json.dumps(m).encode())
                if out is not None:
                    stdout.write(out + b"\n")
                    stdout.flush()
        return 0
    buffer = b""
    while data := os.read(0, 65536):
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        out = [a for a in (answer(orjson.loads(x), tools) for x in lines if x.strip()) if a]
        if out:
            os.write(1, b"\n".join(out) + b"\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

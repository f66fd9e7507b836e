"""A stdio MCP server with the fixtures the official conformance suite calls.

The suite (``@modelcontextprotocol/conformance``) drives a server by fixed names:
``test_simple_text``, ``test_tool_with_progress``, ``test_sampling``,
``test://static-text``, ``test_prompt_with_arguments`` and so on. This server provides
them over stdio so the suite can run against ``aggregator serve --http`` with this server
behind it (empty prefix): what the suite checks is then the proxy's routing of every
message kind, with a server nobody tuned to the proxy.

Run: ``python tests/conformance/fixture_server.py``.
"""

from __future__ import annotations

import base64
import itertools
import json
import sys
from typing import Any

import trio

# A 1x1 red PNG and a tiny silent WAV.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = base64.b64encode(
    b"RIFF"
    + (36 + 2).to_bytes(4, "little")
    + b"WAVEfmt "
    + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little")
    + (1).to_bytes(2, "little")
    + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little")
    + (2).to_bytes(2, "little")
    + (16).to_bytes(2, "little")
    + b"data"
    + (2).to_bytes(4, "little")
    + b"\0\0"
).decode()


class Refused(Exception):
    """A request of ours to the client was answered with an error."""


TOOLS = [
    {"name": "test_simple_text", "description": "Returns simple text.", "inputSchema": {"type": "object"}},
    {"name": "test_image_content", "description": "Returns an image.", "inputSchema": {"type": "object"}},
    {"name": "test_audio_content", "description": "Returns audio.", "inputSchema": {"type": "object"}},
    {
        "name": "test_embedded_resource",
        "description": "Returns an embedded resource.",
        "inputSchema": {"type": "object"},
    },
    {"name": "test_multiple_content_types", "description": "Returns mixed content.", "inputSchema": {"type": "object"}},
    {"name": "test_tool_with_logging", "description": "Logs while it runs.", "inputSchema": {"type": "object"}},
    {"name": "test_error_handling", "description": "Always fails.", "inputSchema": {"type": "object"}},
    {"name": "test_tool_with_progress", "description": "Reports progress.", "inputSchema": {"type": "object"}},
    {
        "name": "test_sampling",
        "description": "Asks the client for a sampling.",
        "inputSchema": {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
    },
    {
        "name": "test_elicitation",
        "description": "Asks the user for input.",
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    },
    {
        "name": "test_elicitation_sep1034_defaults",
        "description": "Elicitation with defaults.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "test_elicitation_sep1330_enums",
        "description": "Elicitation with enums.",
        "inputSchema": {"type": "object"},
    },
    {
        "name": "json_schema_2020_12_tool",
        "description": "Tool with JSON Schema 2020-12 features",
        "inputSchema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    },
]
RESOURCES = [
    {"uri": "test://static-text", "name": "static-text", "description": "Static text", "mimeType": "text/plain"},
    {"uri": "test://static-binary", "name": "static-binary", "description": "Static PNG", "mimeType": "image/png"},
    {
        "uri": "test://watched-resource",
        "name": "watched",
        "description": "Can be subscribed to",
        "mimeType": "text/plain",
    },
]
TEMPLATES = [
    {
        "uriTemplate": "test://template/{id}/data",
        "name": "template",
        "description": "Data by id",
        "mimeType": "application/json",
    }
]
PROMPTS = [
    {"name": "test_simple_prompt", "description": "A simple prompt."},
    {
        "name": "test_prompt_with_arguments",
        "description": "A prompt with arguments.",
        "arguments": [{"name": "arg1", "required": True}, {"name": "arg2", "required": True}],
    },
    {
        "name": "test_prompt_with_embedded_resource",
        "description": "A prompt with a resource.",
        "arguments": [{"name": "resourceUri", "required": True}],
    },
    {"name": "test_prompt_with_image", "description": "A prompt with an image."},
]
SEP1034 = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
}
SEP1330 = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


class FixtureServer:
    def __init__(self, out: trio.abc.SendStream) -> None:
        self.out = out
        self.lock = trio.Lock()
        self.ids = itertools.count(1)
        self.waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.subscribed: set[str] = set()

    async def send(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self.out.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        id = next(self.ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self.waiting[id] = send
        await self.send({"id": id, "method": method, "params": params})
        answer = await receive.receive()
        if "error" in answer:
            raise Refused(f"{method} failed: {answer['error'].get('message')}")
        return answer["result"]

    async def log(self, text: str) -> None:
        await self.send({"method": "notifications/message", "params": {"level": "info", "data": text}})

    async def handle(self, message: dict[str, Any]) -> None:
        if "method" not in message:
            waiter = self.waiting.pop(message.get("id"), None)  # type: ignore[arg-type]
            if waiter is not None:
                await waiter.send(message)
            return
        if "id" not in message:
            return
        try:
            result = await self.answer(message["method"], message.get("params") or {})
        except LookupError as exc:
            await self.send({"id": message["id"], "error": {"code": -32602, "message": str(exc)}})
            return
        except Refused as exc:  # what the client (or the proxy) answered instead: a failed call
            await self.send(
                {"id": message["id"], "result": {"content": [{"type": "text", "text": str(exc)}], "isError": True}}
            )
            return
        await self.send({"id": message["id"], "result": result})

    async def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            return {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "serverInfo": {"name": "conformance-fixtures", "version": "1.0.0"},
                "capabilities": {
                    "tools": {},
                    "prompts": {},
                    "resources": {"subscribe": True},
                    "logging": {},
                    "completions": {},
                },
            }
        if method in ("ping", "logging/setLevel"):
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "resources/list":
            return {"resources": RESOURCES}
        if method == "resources/templates/list":
            return {"resourceTemplates": TEMPLATES}
        if method == "prompts/list":
            return {"prompts": PROMPTS}
        if method == "resources/subscribe":
            self.subscribed.add(params["uri"])
            return {}
        if method == "resources/unsubscribe":
            self.subscribed.discard(params["uri"])
            return {}
        if method == "completion/complete":
            value = (params.get("argument") or {}).get("value", "")
            return {
                "completion": {
                    "values": [v for v in ("paris", "park", "party") if v.startswith(value)],
                    "total": 3,
                    "hasMore": False,
                }
            }
        if method == "resources/read":
            return self.read(params["uri"])
        if method == "prompts/get":
            return self.prompt(params["name"], params.get("arguments") or {})
        if method == "tools/call":
            return await self.call(
                params["name"], params.get("arguments") or {}, (params.get("_meta") or {}).get("progressToken")
            )
        raise LookupError(f"Method not found: {method}")

    def read(self, uri: str) -> dict[str, Any]:
        if uri == "test://static-text":
            return {
                "contents": [
                    {"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."}
                ]
            }
        if uri == "test://static-binary":
            return {"contents": [{"uri": uri, "mimeType": "image/png", "blob": PNG}]}
        if uri == "test://watched-resource":
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": "watched"}]}
        if uri.startswith("test://template/") and uri.endswith("/data"):
            id = uri[len("test://template/") : -len("/data")]
            return {
                "contents": [
                    {
                        "uri": uri,
                        "mimeType": "application/json",
                        "text": json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}),
                    }
                ]
            }
        raise LookupError(f"Unknown resource: {uri}")

    def prompt(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == "test_simple_prompt":
            return {
                "messages": [
                    {"role": "user", "content": {"type": "text", "text": "This is a simple prompt for testing."}}
                ]
            }
        if name == "test_prompt_with_arguments":
            text = f"Prompt with arguments: arg1='{arguments.get('arg1')}', arg2='{arguments.get('arg2')}'"
            return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}]}
        if name == "test_prompt_with_embedded_resource":
            return {
                "messages": [
                    {
                        "role": "user",
                        "content": {
                            "type": "resource",
                            "resource": {
                                "uri": arguments.get("resourceUri"),
                                "mimeType": "text/plain",
                                "text": "Embedded resource content for testing.",
                            },
                        },
                    },
                    {
                        "role": "user",
                        "content": {"type": "text", "text": "Please process the embedded resource above."},
                    },
                ]
            }
        if name == "test_prompt_with_image":
            return {
                "messages": [
                    {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
                    {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}},
                ]
            }
        raise LookupError(f"Unknown prompt: {name}")

    async def call(self, name: str, arguments: dict[str, Any], token: Any) -> dict[str, Any]:
        def text(value: str) -> dict[str, Any]:
            return {"content": [{"type": "text", "text": value}]}

        if name == "test_simple_text":
            return text("This is a simple text response for testing.")
        if name == "test_image_content":
            return {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}
        if name == "test_audio_content":
            return {"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}
        if name == "test_embedded_resource":
            return {
                "content": [
                    {
                        "type": "resource",
                        "resource": {
                            "uri": "test://embedded-resource",
                            "mimeType": "text/plain",
                            "text": "This is an embedded resource content.",
                        },
                    }
                ]
            }
        if name == "test_multiple_content_types":
            return {
                "content": [
                    {"type": "text", "text": "Multiple content types test:"},
                    {"type": "image", "data": PNG, "mimeType": "image/png"},
                    {
                        "type": "resource",
                        "resource": {
                            "uri": "test://mixed-content-resource",
                            "mimeType": "application/json",
                            "text": json.dumps({"test": "data", "value": 123}),
                        },
                    },
                ]
            }
        if name == "test_tool_with_logging":
            await self.log("Tool execution started")
            await trio.sleep(0.05)
            await self.log("Tool processing data")
            await trio.sleep(0.05)
            await self.log("Tool execution completed")
            return text("Tool with logging executed successfully")
        if name == "test_error_handling":
            return {
                "isError": True,
                "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}],
            }
        if name == "test_tool_with_progress":
            for step, value in enumerate((0, 50, 100)):
                if step:
                    await trio.sleep(0.05)
                if token is not None:
                    await self.send(
                        {
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": value, "total": 100},
                        }
                    )
            return text("Tool with progress executed successfully")
        if name == "test_sampling":
            result = await self.ask(
                "sampling/createMessage",
                {
                    "messages": [{"role": "user", "content": {"type": "text", "text": arguments.get("prompt", "")}}],
                    "maxTokens": 100,
                },
            )
            return text(f"LLM response: {(result.get('content') or {}).get('text')}")
        if name == "test_elicitation":
            result = await self.ask(
                "elicitation/create",
                {
                    "message": arguments.get("message", ""),
                    "requestedSchema": {
                        "type": "object",
                        "properties": {
                            "username": {"type": "string", "description": "User's response"},
                            "email": {"type": "string", "description": "User's email address"},
                        },
                        "required": ["username", "email"],
                    },
                },
            )
            return text(f"User response: action={result.get('action')}, content={json.dumps(result.get('content'))}")
        if name in ("test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
            schema = SEP1034 if name.endswith("defaults") else SEP1330
            result = await self.ask("elicitation/create", {"message": "Please review", "requestedSchema": schema})
            return text(
                f"Elicitation completed: action={result.get('action')}, content={json.dumps(result.get('content'))}"
            )
        if name == "json_schema_2020_12_tool":
            return text(f"Received: {json.dumps(arguments)}")
        raise LookupError(f"Unknown tool: {name}")


async def main() -> None:
    stdin = trio.lowlevel.FdStream(0)
    stdout = trio.lowlevel.FdStream(1)
    server = FixtureServer(stdout)
    buffer = b""
    async with trio.open_nursery() as nursery:
        while data := await stdin.receive_some(65536):
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    nursery.start_soon(server.handle, json.loads(line))
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    print("conformance fixture server on stdio", file=sys.stderr)
    trio.run(main)

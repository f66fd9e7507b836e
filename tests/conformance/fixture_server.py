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
from scenario_schemas import JSON_SCHEMA_2020_12, SEP1034, SEP1330

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


class Unsupported(Exception):
    """The client did not declare a capability a request needs."""


def elicit(message: str, field: str, kind: str = "string") -> dict[str, Any]:
    return {
        "message": message,
        "requestedSchema": {"type": "object", "properties": {field: {"type": kind}}, "required": [field]},
    }


def sample(text: str, tokens: int = 100) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": tokens}


def said(result: dict[str, Any]) -> Any:
    """The text of a sampling result."""
    return (result.get("content") or {}).get("text")


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
        "inputSchema": JSON_SCHEMA_2020_12,
    },
    # Legacy tools that ask their client mid-call (sampling, elicitation, roots), as a 2025
    # server does; behind the proxy a 2026-07-28 caller sees each as an input_required
    # result. The ids of the requests they send name the questions (the result's keys).
    *(
        {"name": name, "description": description, "inputSchema": {"type": "object"}}
        for name, description in (
            ("test_input_required_result_elicitation", "Asks the user's name."),
            ("test_input_required_result_sampling", "Asks for a sampling."),
            ("test_input_required_result_list_roots", "Lists the client's roots."),
            ("test_input_required_result_request_state", "Asks for a confirmation."),
            ("test_input_required_result_multiple_inputs", "Asks three things at once."),
            ("test_input_required_result_multi_round", "Asks two things, one after the other."),
            ("test_input_required_result_tampered_state", "Asks for a confirmation."),
            ("test_input_required_result_capabilities", "Asks only what the client declared."),
            ("test_missing_capability", "Needs sampling: fails when the client has none."),
            ("test_streaming_elicitation", "Asks the user a question while it runs."),
            ("test_logging_tool", "Logs while it runs."),
            ("test_trigger_tool_change", "Announces that the tool list changed."),
            ("test_trigger_prompt_change", "Announces that the prompt list changed."),
        )
    ),
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
    {"name": "test_input_required_result_prompt", "description": "Asks the user for context first."},
]


class FixtureServer:
    def __init__(self, out: trio.abc.SendStream) -> None:
        self.out = out
        self.lock = trio.Lock()
        self.ids = itertools.count(1)
        self.waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.subscribed: set[str] = set()
        self.client_capabilities: dict[str, Any] = {}  # what the client declared in initialize

    async def send(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self.out.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def ask(self, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """Ask the client; ``name``: the request's id (made unique while one of that name waits)."""
        id: int | str = next(self.ids)
        if name is not None:
            id = name if name not in self.waiting else f"{name}-{id}"
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
        except Unsupported as exc:
            await self.send({"id": message["id"], "error": {"code": -32601, "message": str(exc)}})
            return
        except Refused as exc:  # what the client (or the proxy) answered instead: a failed call
            if message["method"] != "tools/call":
                await self.send({"id": message["id"], "error": {"code": -32603, "message": str(exc)}})
                return
            await self.send(
                {"id": message["id"], "result": {"content": [{"type": "text", "text": str(exc)}], "isError": True}}
            )
            return
        await self.send({"id": message["id"], "result": result})

    async def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            capabilities = params.get("capabilities")
            self.client_capabilities = capabilities if type(capabilities) is dict else {}
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
            if params["name"] == "test_input_required_result_prompt":
                answer = await self.ask(
                    "elicitation/create", elicit("What context should the prompt use?", "context"), "user_context"
                )
                context = (answer.get("content") or {}).get("context")
                return {"messages": [{"role": "user", "content": {"type": "text", "text": f"Context: {context}"}}]}
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
        if name == "test_logging_tool":
            await self.log("test_logging_tool ran")
            return text("logged")
        if name in ("test_trigger_tool_change", "test_trigger_prompt_change"):
            kind = "tools" if name == "test_trigger_tool_change" else "prompts"
            await self.send({"method": f"notifications/{kind}/list_changed"})
            return text(f"{kind} list changed")
        if name.startswith("test_input_required_result_") or name in (
            "test_missing_capability",
            "test_streaming_elicitation",
        ):
            return await self.ask_and_answer(name, text)
        raise LookupError(f"Unknown tool: {name}")

    async def ask_and_answer(self, name: str, text: Any) -> dict[str, Any]:
        """The tools that ask their client for input while they run."""
        if name == "test_streaming_elicitation":
            answer = await self.ask("elicitation/create", elicit("Keep going?", "ok", "boolean"), "streaming")
            return text(f"action={answer.get('action')}")
        if name == "test_input_required_result_elicitation":
            answer = await self.ask("elicitation/create", elicit("What is your name?", "name"), "user_name")
            return text(f"Hello, {(answer.get('content') or {}).get('name')}!")
        if name == "test_input_required_result_sampling":
            answer = await self.ask(
                "sampling/createMessage", sample("What is the capital of France?"), "capital_question"
            )
            return text(f"LLM response: {said(answer)}")
        if name == "test_input_required_result_list_roots":
            answer = await self.ask("roots/list", {}, "client_roots")
            return text(f"Roots: {', '.join(root.get('uri', '?') for root in answer.get('roots') or [])}")
        if name in ("test_input_required_result_request_state", "test_input_required_result_tampered_state"):
            answer = await self.ask("elicitation/create", elicit("Please confirm", "ok", "boolean"), "confirm")
            # This server keeps the call's state itself (it waits): answered means validated.
            return text(f"state-ok: confirmed={(answer.get('content') or {}).get('ok')}")
        if name == "test_input_required_result_multiple_inputs":
            answers: dict[str, dict[str, Any]] = {}

            async def one(method: str, params: dict[str, Any], key: str) -> None:
                answers[key] = await self.ask(method, params, key)

            async with trio.open_nursery() as nursery:  # all three at once
                nursery.start_soon(one, "elicitation/create", elicit("What is your name?", "name"), "user_name")
                nursery.start_soon(one, "sampling/createMessage", sample("Generate a greeting", 50), "greeting")
                nursery.start_soon(one, "roots/list", {}, "client_roots")
            who = (answers["user_name"].get("content") or {}).get("name")
            return text(f"{said(answers['greeting'])} {who} ({len(answers['client_roots'].get('roots') or [])} roots)")
        if name == "test_input_required_result_multi_round":
            first = await self.ask("elicitation/create", elicit("Step 1: What is your name?", "name"), "step1")
            second = await self.ask(
                "elicitation/create", elicit("Step 2: What is your favorite color?", "color"), "step2"
            )
            who, color = (first.get("content") or {}).get("name"), (second.get("content") or {}).get("color")
            return text(f"{who} likes {color}")
        if name == "test_input_required_result_capabilities":
            # Only what the client declared; one it declared but cannot answer now is skipped.
            asks = [("sampling/createMessage", sample("Say hi", 20), "capability_sampling", "sampling")]
            asks.append(("elicitation/create", elicit("Your name?", "name"), "capability_elicitation", "elicitation"))
            got: list[str] = []

            async def maybe(method: str, params: dict[str, Any], key: str) -> None:
                try:
                    await self.ask(method, params, key)
                    got.append(key)
                except Refused:
                    pass

            async with trio.open_nursery() as nursery:
                for method, params, key, capability in asks:
                    if capability in self.client_capabilities:
                        nursery.start_soon(maybe, method, params, key)
            return text(f"answered: {', '.join(sorted(got)) or 'nothing'}")
        if name == "test_missing_capability":
            if "sampling" not in self.client_capabilities:
                raise Unsupported("test_missing_capability needs the client's sampling capability")
            answer = await self.ask("sampling/createMessage", sample("Say something"), "required_sampling")
            return text(f"LLM response: {said(answer)}")
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

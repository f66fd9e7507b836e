"""A dual-era MCP server (SDK 2.x ``MCPServer``) with the fixtures the official conformance suite calls.

The suite (``@modelcontextprotocol/conformance`` 0.2.0-alpha) drives a server by fixed names:
``test_simple_text``, ``test_tool_with_progress``, ``test_input_required_result_multi_round``,
``test://static-text``, ``test_prompt_with_arguments`` and so on. ``fixture_server.py`` provides the
2025-11-25 ones from a hand-written legacy server; this one is built with the official Python SDK 2.x,
which serves both eras (2026-07-28 statelessly, 2025-11-25 with ``initialize``) over stdio and
Streamable HTTP, so it is the modern upstream the proxy is tested in front of.

The 2026-07-28 fixtures answer with ``input_required`` results (SEP-2322): an elicitation, a
sampling or a roots request the client answers by retrying with ``inputResponses``; the
``requestState`` each carries is sealed by the SDK, so a tampered one is refused with -32602. On a
2025-11-25 connection the legacy tools ask the same questions with server-to-client requests.

Run: ``python tests/conformance/modern_server.py`` (stdio) or ``... http PORT`` (Streamable HTTP
on 127.0.0.1:PORT, endpoint ``/mcp``).
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.exceptions import MCPError
from mcp_types import JSONRPCMessage
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

# Lists change only when a test says so: clients may cache them for a minute, any of them.
LISTS = CacheHint(ttl_ms=60_000, scope="public")
app = MCPServer(
    "conformance-modern-fixtures",
    version="1.0.0",
    cache_hints={
        "tools/list": LISTS,
        "prompts/list": LISTS,
        "resources/list": LISTS,
        "resources/templates/list": LISTS,
        "resources/read": CacheHint(ttl_ms=0, scope="private"),
    },
)


def result(*content: dict[str, Any], error: bool = False) -> types.CallToolResult:
    return types.CallToolResult.model_validate({"content": list(content), "isError": error})


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def elicit(message: str, properties: dict[str, Any], *required: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": list(required)}
    return {"method": "elicitation/create", "params": {"mode": "form", "message": message, "requestedSchema": schema}}


def sample(prompt: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": text(prompt)}]
    return {"method": "sampling/createMessage", "params": {"messages": messages, "maxTokens": max_tokens}}


ROOTS = {"method": "roots/list", "params": {}}


def ask(requests: dict[str, Any], state: dict[str, Any] | None = None) -> types.InputRequiredResult:
    """An ``input_required`` result; the SDK seals ``state`` (plain JSON here) on the way out."""
    body: dict[str, Any] = {"resultType": "input_required", "inputRequests": requests}
    if state is not None:
        body["requestState"] = json.dumps({**state, "nonce": uuid.uuid4().hex})
    return types.InputRequiredResult.model_validate(body)


def answers(ctx: Context) -> dict[str, dict[str, Any]]:
    """The client's ``inputResponses`` as plain JSON, by key."""
    found: dict[str, Any] = dict(ctx.input_responses or {})
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(value, "model_dump") else value
        for key, value in found.items()
    }


def state(ctx: Context) -> dict[str, Any]:
    try:
        loaded = json.loads(ctx.request_state or "{}")
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def field(response: dict[str, Any] | None, name: str) -> str:
    content = (response or {}).get("content") or {}
    return str(content.get(name, "")) if isinstance(content, dict) else ""


def declared(ctx: Context, capability: str) -> bool:
    capabilities = ctx.client_capabilities
    return capabilities is not None and getattr(capabilities, capability, None) is not None


# ---- tools both eras call ---------------------------------------------------------------------


@app.tool(description="Returns simple text.")
def test_simple_text() -> types.CallToolResult:
    return result(text("This is a simple text response for testing."))


@app.tool(description="Returns an image.")
def test_image_content() -> types.CallToolResult:
    return result({"type": "image", "data": PNG, "mimeType": "image/png"})


@app.tool(description="Returns audio.")
def test_audio_content() -> types.CallToolResult:
    return result({"type": "audio", "data": WAV, "mimeType": "audio/wav"})


@app.tool(description="Returns an embedded resource.")
def test_embedded_resource() -> types.CallToolResult:
    resource = {
        "uri": "test://embedded-resource",
        "mimeType": "text/plain",
        "text": "This is an embedded resource content.",
    }
    return result({"type": "resource", "resource": resource})


@app.tool(description="Returns mixed content.")
def test_multiple_content_types() -> types.CallToolResult:
    resource = {
        "uri": "test://mixed-content-resource",
        "mimeType": "application/json",
        "text": json.dumps({"test": "data", "value": 123}),
    }
    return result(
        text("Multiple content types test:"),
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "resource", "resource": resource},
    )


@app.tool(description="Logs while it runs.")
async def test_tool_with_logging(ctx: Context) -> types.CallToolResult:
    for line in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(line)
        await anyio.sleep(0.05)
    return result(text("Tool with logging executed successfully"))


@app.tool(description="Always fails.")
def test_error_handling() -> types.CallToolResult:
    return result(text("This tool intentionally returns an error for testing"), error=True)


@app.tool(description="Reports progress.")
async def test_tool_with_progress(ctx: Context) -> types.CallToolResult:
    for step, value in enumerate((0, 50, 100)):
        if step:
            await anyio.sleep(0.05)
        await ctx.report_progress(value, 100)
    return result(text("Tool with progress executed successfully"))


@app.tool(description="Closes its event stream mid-call; the answer comes after the client resumes (SEP-1699).")
async def test_reconnection(ctx: Context) -> types.CallToolResult:
    await ctx.close_sse_stream()  # a no-op on stdio
    await anyio.sleep(0.1)
    return result(text("Reconnection test completed successfully."))


# ---- 2025-11-25: server-to-client requests mid-call -------------------------------------------


@app.tool(description="Asks the client for a sampling (2025-11-25).")
async def test_sampling(prompt: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    if is_modern(ctx):  # no server-to-client requests in this era: the client is asked by the result
        found = answers(ctx).get("sampling")
        if found is None:
            return ask({"sampling": sample(prompt, 100)})
        content = found.get("content")
        said = (content[0] if isinstance(content, list) and content else content or {}).get("text")
        return result(text(f"LLM response: {said}"))
    message = types.SamplingMessage.model_validate({"role": "user", "content": text(prompt)})
    answer = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
    content = answer.content if not isinstance(answer.content, list) else answer.content[0]
    return result(text(f"LLM response: {getattr(content, 'text', None)}"))


def is_modern(ctx: Context) -> bool:
    return ctx.protocol_version == "2026-07-28"


async def legacy_elicit(
    ctx: Context, message: str, schema: dict[str, Any]
) -> types.CallToolResult | types.InputRequiredResult:
    """An elicitation mid-call: a request to the client (2025-11-25), or an input_required
    result and its retry (2026-07-28)."""
    if is_modern(ctx):
        found = answers(ctx).get("elicitation")
        if found is None:
            request = {"mode": "form", "message": message, "requestedSchema": schema}
            return ask({"elicitation": {"method": "elicitation/create", "params": request}})
        action, content = found.get("action"), found.get("content")
    else:
        answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        action, content = answer.action, answer.content
    return result(text(f"Elicitation completed: action={action}, content={json.dumps(content)}"))


@app.tool(description="Asks the user for input (2025-11-25).")
async def test_elicitation(message: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    properties = {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    }
    schema = {"type": "object", "properties": properties, "required": ["username", "email"]}
    return await legacy_elicit(ctx, message, schema)


@app.tool(description="Elicitation with defaults (2025-11-25).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    return await legacy_elicit(ctx, "Please review", SEP1034)


@app.tool(description="Elicitation with enums (2025-11-25).")
async def test_elicitation_sep1330_enums(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    return await legacy_elicit(ctx, "Please review", SEP1330)


# ---- 2026-07-28: input_required results (SEP-2322) --------------------------------------------

NAME = {"name": {"type": "string"}}
OK = {"ok": {"type": "boolean"}}


@app.tool(description="Needs the sampling capability (answers -32021 without it).")
def test_missing_capability(ctx: Context) -> types.CallToolResult:
    if not declared(ctx, "sampling"):
        raise MCPError(
            code=-32021,
            message="This tool needs the sampling capability",
            data={"requiredCapabilities": {"sampling": {}}},
        )
    return result(text("Success"))


@app.tool(description="MRTR: asks for a name with an elicitation.")
def test_input_required_result_elicitation(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    if found := answers(ctx).get("user_name"):
        return result(text(f"Hello, {field(found, 'name')}!"))
    return ask({"user_name": elicit("What is your name?", NAME, "name")})


@app.tool(description="MRTR: asks for a sampling.")
def test_input_required_result_sampling(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    if found := answers(ctx).get("sample_request"):
        content = found.get("content")
        said = content.get("text") if isinstance(content, dict) else None
        return result(text(f"Sampling result: {said if isinstance(said, str) else 'no response'}"))
    return ask({"sample_request": sample("What is the capital of France?", 100)})


@app.tool(description="MRTR: asks for the client's roots.")
def test_input_required_result_list_roots(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    if found := answers(ctx).get("roots_request"):
        return result(text(f"Found {len(found.get('roots') or [])} root(s)"))
    return ask({"roots_request": ROOTS})


@app.tool(description="MRTR: asks for a confirmation and carries requestState.")
def test_input_required_result_request_state(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    found = answers(ctx).get("confirm")
    if found and state(ctx).get("kind") == "request-state" and (found.get("content") or {}).get("ok") is True:
        return result(text("state-ok: requestState validated"))
    return ask({"confirm": elicit("Please confirm", OK, "ok")}, {"kind": "request-state"})


@app.tool(description="MRTR: asks three questions at once.")
def test_input_required_result_multiple_inputs(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    found = answers(ctx)
    if state(ctx).get("kind") == "multiple-inputs" and all(
        k in found for k in ("user_name", "greeting", "client_roots")
    ):
        greeting = (found["greeting"].get("content") or {}).get("text", "Hello there!")
        roots = found["client_roots"].get("roots") or []
        return result(text(f"Name: {field(found['user_name'], 'name')}; Greeting: {greeting}; Roots: {len(roots)}"))
    requests = {
        "user_name": elicit("What is your name?", NAME, "name"),
        "greeting": sample("Generate a greeting", 50),
        "client_roots": ROOTS,
    }
    return ask(requests, {"kind": "multiple-inputs"})


STEP1 = {"step1": elicit("Step 1: What is your name?", NAME, "name")}


@app.tool(description="MRTR: two rounds of questions.")
def test_input_required_result_multi_round(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    found, now = answers(ctx), state(ctx)
    if now.get("round") == 1 and "step1" in found:
        step2 = {"step2": elicit("Step 2: What is your favorite color?", {"color": {"type": "string"}}, "color")}
        return ask(step2, {"round": 2, "name": field(found["step1"], "name")})
    if now.get("round") == 2 and "step2" in found:
        return result(
            text(f"Multi-round complete for {now.get('name') or 'friend'} who likes {field(found['step2'], 'color')}")
        )
    return ask(STEP1, {"round": 1})


@app.tool(description="MRTR: its requestState is integrity-protected.")
def test_input_required_result_tampered_state(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    # A tampered requestState never reaches here: the SDK refuses it with -32602.
    if state(ctx).get("kind") == "tamper-test" and "confirm" in answers(ctx):
        return result(text("integrity-ok: state verified"))
    return ask({"confirm": elicit("Please confirm", OK, "ok")}, {"kind": "tamper-test"})


@app.tool(description="MRTR: asks only what the client declared it can answer.")
def test_input_required_result_capabilities(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
    found = answers(ctx)
    if found:
        return result(text(f"capabilities-ok: received {','.join(found)}"))
    requests = {}
    if declared(ctx, "elicitation"):
        requests["elicit_input"] = elicit("Elicitation input", {"value": {"type": "string"}}, "value")
    if declared(ctx, "sampling"):
        requests["sample_input"] = sample("Sample request", 50)
    if not requests:
        return result(text("No supported capabilities declared"))
    return ask(requests, {"kind": "capabilities-test"})


@app.tool(description="Reports progress, then answers.")
async def test_streaming_elicitation(ctx: Context) -> types.CallToolResult:
    await ctx.report_progress(50, 100)
    return result(text("Streaming complete"))


@app.tool(description="Logs only when the request asked for a log level.")
async def test_logging_tool(ctx: Context) -> types.CallToolResult:
    await ctx.info("Diagnostic trace logging activated")
    return result(text("Logging evaluated"))


@app.tool(description="Announces a change of the tool list.")
async def test_trigger_tool_change(ctx: Context) -> types.CallToolResult:
    await ctx.notify_tools_changed()
    return result(text("Mutation triggered"))


@app.tool(description="Announces a change of the prompt list.")
async def test_trigger_prompt_change(ctx: Context) -> types.CallToolResult:
    await ctx.notify_prompts_changed()
    return result(text("Mutation triggered"))


@app.tool(description="Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(
    name: str | None = None,
    address: dict[str, Any] | None = None,
    contactMethod: str | None = None,  # noqa: N803 (the suite's names)
    phone: str | None = None,
    email: str | None = None,
) -> types.CallToolResult:
    given = {"name": name, "address": address, "contactMethod": contactMethod, "phone": phone, "email": email}
    return result(text(f"Received: {json.dumps({k: v for k, v in given.items() if v is not None})}"))


# The suite checks the schema is listed as written ($schema, $defs, additionalProperties kept).
app._tool_manager.get_tool("json_schema_2020_12_tool").parameters = JSON_SCHEMA_2020_12  # type: ignore[union-attr]


# ---- resources ------------------------------------------------------------------------------


@app.resource("test://static-text", name="static-text", description="Static text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@app.resource("test://static-binary", name="static-binary", description="Static PNG", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@app.resource("test://watched-resource", name="watched", description="Can be subscribed to", mime_type="text/plain")
def watched() -> str:
    return "watched"


@app.resource("test://template/{id}/data", name="template", description="Data by id", mime_type="application/json")
def template(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


async def subscribed(ctx: Any, params: Any) -> types.EmptyResult:
    """Legacy ``resources/subscribe`` and ``unsubscribe``: accepted (the watched resource never changes)."""
    return types.EmptyResult()


async def set_level(ctx: Any, params: Any) -> types.EmptyResult:
    """Legacy ``logging/setLevel``: accepted; the tools log at info."""
    return types.EmptyResult()


app._lowlevel_server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
app._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribed)
app._lowlevel_server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, subscribed)

# ---- prompts and completion -----------------------------------------------------------------


@app.prompt(description="A simple prompt.")
def test_simple_prompt() -> list[dict[str, Any]]:
    return [{"role": "user", "content": text("This is a simple prompt for testing.")}]


@app.prompt(description="A prompt with arguments.")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")}]


@app.prompt(description="A prompt with a resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[dict[str, Any]]:  # noqa: N803 (the suite's name)
    resource = {"uri": resourceUri, "mimeType": "text/plain", "text": "Embedded resource content for testing."}
    return [
        {"role": "user", "content": {"type": "resource", "resource": resource}},
        {"role": "user", "content": text("Please process the embedded resource above.")},
    ]


@app.prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
        {"role": "user", "content": text("Please analyze the image above.")},
    ]


@app.prompt(description="MRTR: a prompt that asks for context first.")
def test_input_required_result_prompt(ctx: Context) -> list[dict[str, Any]] | types.InputRequiredResult:
    if found := answers(ctx).get("user_context"):
        return [{"role": "user", "content": text(f"Prompt with context: {field(found, 'context')}")}]
    return ask(
        {"user_context": elicit("What context should the prompt use?", {"context": {"type": "string"}}, "context")}
    )


@app.completion()
async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> types.Completion:
    values = [v for v in ("paris", "park", "party") if v.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


# ---- the tasks extension (io.modelcontextprotocol/tasks, SEP-2663) ---------------------------
# The SDK has no server side for it, so a middleware serves it in the modern era: a task tool
# called by a client that declared the extension answers a task handle (``resultType: "task"``)
# at once, and ``tasks/get`` reports its progress by the clock (no background work to manage).

TASKS = "io.modelcontextprotocol/tasks"
TASK_TTL_MS = 60_000
POLL_MS = 200
# Task tools, and whether they work without the extension (run at once, as any tool).
TASK_TOOLS = {
    "slow_compute": False,
    "failing_job": True,
    "protocol_error_job": True,
    "confirm_delete": True,
    "multi_input": True,
    "test_tool_with_task": True,
}
task_store: dict[str, dict[str, Any]] = {}


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def wants_tasks(params: Any) -> bool:
    meta = params.get("_meta") if isinstance(params, dict) else None
    capabilities = meta.get("io.modelcontextprotocol/clientCapabilities") if isinstance(meta, dict) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS in extensions


def needs_tasks() -> MCPError:
    return MCPError(
        code=-32021,
        message=f"This request needs the {TASKS} extension",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


def confirm(key: str) -> dict[str, Any]:
    return elicit(f"Confirm {key}?", {"name": {"type": "string"}, "confirm": {"type": "boolean"}}, "confirm")


def new_task(tool: str, *, seconds: float = 0.5, asks: dict[str, Any] | None = None, **facts: Any) -> dict[str, Any]:
    task_id = uuid.uuid4().hex
    stamp = now_iso()
    task_store[task_id] = {
        "tool": tool,
        "start": time.monotonic(),
        "seconds": seconds,
        "asks": dict(asks or {}),
        "answers": {},
        "cancelled": False,
        "createdAt": stamp,
        "lastUpdatedAt": stamp,
        **facts,
    }
    return {"resultType": "task", **task_view(task_id, detailed=False)}


def task_view(task_id: str, *, detailed: bool = True) -> dict[str, Any]:
    """A task as tasks/get shows it (``detailed``), or as its handle does."""
    task = task_store[task_id]
    view: dict[str, Any] = {
        "taskId": task_id,
        "createdAt": task["createdAt"],
        "lastUpdatedAt": task["lastUpdatedAt"],
        "ttlMs": TASK_TTL_MS,
        "pollIntervalMs": POLL_MS,
    }
    if task["cancelled"]:
        view["status"] = "cancelled"
    elif task["asks"]:
        view["status"] = "input_required"
        if detailed:
            view["inputRequests"] = dict(task["asks"])
    elif time.monotonic() - task["start"] < task["seconds"]:
        view["status"] = "working"
    elif task["tool"] == "protocol_error_job":
        view["status"] = "failed"
        if detailed:
            view["error"] = {"code": -32603, "message": "protocol_error_job failed inside the server"}
    else:
        view["status"] = "completed"
        if detailed:
            view["result"] = task_result(task)
    return view


def task_result(task: dict[str, Any]) -> dict[str, Any]:
    tool = task["tool"]
    if tool == "failing_job":
        return {"content": [text("failing_job failed, as it always does")], "isError": True}
    if tool == "slow_compute":
        return {"content": [text(f"computed {task.get('label', '')} in {task['seconds']}s")]}
    if tool == "test_tool_with_task":
        return {"content": [text(f"Hello, {task.get('user_name', '')}!")]}
    given = ", ".join(f"{key}={json.dumps(answer)}" for key, answer in sorted(task["answers"].items()))
    return {"content": [text(f"{tool} done: {given}")]}


def start_task_tool(name: str, params: dict[str, Any]) -> dict[str, Any]:
    arguments = params.get("arguments") or {}
    if name == "slow_compute":
        seconds = arguments.get("seconds", 1)
        return new_task(
            name, seconds=float(seconds) if isinstance(seconds, (int, float)) else 1.0, label=arguments.get("label", "")
        )
    if name == "failing_job":
        return new_task(name, seconds=1.0)
    if name == "protocol_error_job":
        return new_task(name, seconds=0.3)
    if name == "confirm_delete":
        return new_task(name, seconds=0, asks={"confirm": confirm(str(arguments.get("filename", "")))})
    if name == "multi_input":
        return new_task(name, seconds=0, asks={"first": confirm("first"), "second": confirm("second")})
    # test_tool_with_task: a name by input_required first, then a task that greets it.
    found = (params.get("inputResponses") or {}).get("user_name")
    if not isinstance(found, dict):
        return {
            "resultType": "input_required",
            "inputRequests": {"user_name": elicit("Your name?", {"name": {"type": "string"}}, "name")},
        }
    return new_task(name, seconds=0.3, user_name=field(found, "name"))


def known_task(params: Any) -> str:
    task_id = params.get("taskId") if isinstance(params, dict) else None
    if not isinstance(task_id, str) or task_id not in task_store:
        raise MCPError(code=-32602, message=f"Unknown task: {task_id}")
    return task_id


async def tasks_middleware(ctx: Any, call_next: Any) -> Any:
    """The tasks extension in the modern era; everything else goes on to the SDK."""
    method, params = ctx.method, ctx.params if isinstance(ctx.params, dict) else {}
    if ctx.request_id is None or ctx.protocol_version != "2026-07-28":
        return await call_next(ctx)
    if method in ("tasks/result", "tasks/list"):
        raise MCPError(code=-32601, message=f"Method not found: {method} (removed by the tasks extension)")
    if method in ("tasks/get", "tasks/update", "tasks/cancel"):
        if not wants_tasks(params):
            raise needs_tasks()
        headers = getattr(ctx.request, "headers", None)  # on Streamable HTTP: Mcp-Name names the task
        if headers is not None and headers.get("mcp-name") != params.get("taskId"):
            raise MCPError(code=-32020, message="The Mcp-Name header does not match params.taskId")
        task_id = known_task(params)
        task = task_store[task_id]
        if method == "tasks/get":
            return {"resultType": "complete", **task_view(task_id)}
        if method == "tasks/update":
            for key, answer in (params.get("inputResponses") or {}).items():
                if key in task["asks"]:  # an answer to nothing asked is ignored
                    del task["asks"][key]
                    task["answers"][key] = answer
        elif task_view(task_id, detailed=False)["status"] in ("working", "input_required"):
            task["cancelled"] = True
        task["lastUpdatedAt"] = now_iso()
        return {"resultType": "complete"}
    name = params.get("name") if method == "tools/call" else None
    if name in TASK_TOOLS:
        if wants_tasks(params):
            return start_task_tool(name, params)
        if TASK_TOOLS[name]:
            raise needs_tasks()
    return await call_next(ctx)


app._lowlevel_server.extensions[TASKS] = {}
app._lowlevel_server.middleware.append(tasks_middleware)


@app.tool(description="Greets by name, at once (never a task).")
def greet(name: str = "World") -> str:
    return f"Hello, {name}!"


@app.tool(description="A task: sleeps `seconds`, then answers (at once without the tasks extension).")
async def slow_compute(seconds: float = 1, label: str = "") -> str:
    await anyio.sleep(min(max(seconds, 0), 5))
    return f"computed {label} in {seconds}s"


@app.tool(description="A task (the tasks extension required): ends in a tool error.")
def failing_job() -> str:
    raise MCPError(code=-32021, message=f"This tool needs the {TASKS} extension")


@app.tool(description="A task (the tasks extension required): fails with a protocol error.")
def protocol_error_job() -> str:
    raise MCPError(code=-32021, message=f"This tool needs the {TASKS} extension")


@app.tool(description="A task (the tasks extension required): asks to confirm, then deletes.")
def confirm_delete(filename: str = "") -> str:
    raise MCPError(code=-32021, message=f"This tool needs the {TASKS} extension")


@app.tool(description="A task (the tasks extension required): asks two questions at once.")
def multi_input() -> str:
    raise MCPError(code=-32021, message=f"This tool needs the {TASKS} extension")


@app.tool(description="Asks a name by input_required, then becomes a task (the tasks extension required).")
def test_tool_with_task() -> str:
    raise MCPError(code=-32021, message=f"This tool needs the {TASKS} extension")


class Events(EventStore):
    """Every event of the run in memory, so a closed legacy event stream can be resumed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        after = next((i for i, (event_id, _, _) in enumerate(self.events) if event_id == last_event_id), None)
        if after is None:
            return None
        stream = self.events[after][1]
        for event_id, stream_id, message in self.events[after + 1 :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        port = int(sys.argv[2])
        anyio.run(lambda: app.run_streamable_http_async(port=port, event_store=Events(), retry_interval=1000))
    else:
        app.run("stdio")

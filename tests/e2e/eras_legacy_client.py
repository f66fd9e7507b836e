"""The official Python SDK 1.x client (legacy only; run with ``.venv-mcp1``) through the proxy,
for the era matrix.

``python eras_legacy_client.py FRONT TARGET SERVERS PYTHON``: FRONT is ``stdio`` (TARGET: a
config path, the proxy run by PYTHON) or ``http`` (TARGET: the proxy's URL); SERVERS as for
``eras_modern_client.py``. Runs the steps of ``eras_steps.py`` and prints one JSON object
``{"<prefix>.<feature>": what was seen}``; a step that failed is ``{"error": ...}``. Every wait
is bounded.
"""

import json
import sys

import anyio
from eras_steps import ANSWER_NAME, ROOTS, sample_text, steps_for
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from pydantic import AnyUrl, FileUrl


async def on_elicit(context, params):
    return types.ElicitResult(action="accept", content={"name": ANSWER_NAME})


async def on_sample(context, params):
    said = getattr(params.messages[0].content, "text", "")
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=sample_text(said)), model="stub-model"
    )


async def on_roots(context):
    return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri)) for uri in ROOTS])


class Seen:
    """Notifications and log lines as they arrive, and a bounded wait for one."""

    def __init__(self):
        self.messages = []
        self.logs = []

    async def message(self, message):
        if not isinstance(message, Exception):
            self.messages.append(getattr(message, "root", message))

    async def log(self, params):
        self.logs.append(params)

    async def wait(self, condition, seconds=10.0):
        with anyio.move_on_after(seconds):
            while not condition():  # noqa: ASYNC110 - the SDK's callbacks have no event to wait on
                await anyio.sleep(0.02)
            return True
        return False


def text(found):
    return " ".join(str(getattr(c, "text", "")) for c in found.content)


class Legacy:
    """The client operations the steps use, spoken with the 1.x ``ClientSession``."""

    era = "legacy"

    def __init__(self, session, seen):
        self.session = session
        self.seen = seen

    async def tools(self):
        names, cursor = [], None
        for _ in range(20):
            page = await self.session.list_tools(cursor=cursor)
            names += [tool.name for tool in page.tools]
            cursor = page.nextCursor
            if not cursor:
                break
        return sorted(names)

    async def call(self, name, arguments, progress=None):
        found = await self.session.call_tool(name, arguments, progress_callback=progress)
        return ("ERROR " if found.isError else "") + text(found)

    async def resources(self):
        return [str(r.uri) for r in (await self.session.list_resources()).resources]

    async def read(self, uri):
        found = (await self.session.read_resource(AnyUrl(uri))).contents[0]
        return str(getattr(found, "text", None) or getattr(found, "blob", ""))

    async def prompts(self):
        return sorted(p.name for p in (await self.session.list_prompts()).prompts)

    async def prompt(self, name, arguments):
        found = await self.session.get_prompt(name, arguments)
        return str(getattr(found.messages[0].content, "text", ""))

    async def complete(self, prompt, argument, value):
        done = await self.session.complete(
            types.PromptReference(type="ref/prompt", name=prompt), {"name": argument, "value": value}
        )
        return list(done.completion.values)

    async def cancel_call(self, name, arguments):
        """Start a call and, once it reported progress, send ``notifications/cancelled`` for it
        (what a 1.x application does: the SDK sends nothing when its task is cancelled)."""
        started = anyio.Event()
        request_id = self.session._request_id  # the id the SDK gives the next request

        async def progress(value, total, message):
            started.set()

        async with anyio.create_task_group() as group:

            async def call():
                await self.session.call_tool(name, arguments, progress_callback=progress)

            group.start_soon(call)
            with anyio.fail_after(10):
                await started.wait()
            cancel = types.CancelledNotification(
                method="notifications/cancelled",
                params=types.CancelledNotificationParams(requestId=request_id, reason="matrix"),
            )
            await self.session.send_notification(types.ClientNotification(cancel))
            group.cancel_scope.cancel()

    async def list_changes(self, prefix, grow, bump, uri):
        """A tools list change by the client's handler, a resource update by ``resources/subscribe``."""
        grown = await self.call(grow, {})
        changed = await self.seen.wait(
            lambda: any(isinstance(m, types.ToolListChangedNotification) for m in self.seen.messages)
        )
        await self.session.subscribe_resource(AnyUrl(uri))
        await self.call(bump, {})
        await self.seen.wait(lambda: any(isinstance(m, types.ResourceUpdatedNotification) for m in self.seen.messages))
        uris = [str(m.params.uri) for m in self.seen.messages if isinstance(m, types.ResourceUpdatedNotification)]
        return {
            "grown": grown,
            "tools_event": "ToolListChangedNotification" if changed else None,
            "resource_event": ["ResourceUpdatedNotification", uris[0] if uris else None],
        }

    async def chatter(self, tool):
        """Ask for info and above, call ``tool``: the levels of its log lines that came."""
        await self.session.set_logging_level("info")
        said = await self.call(tool, {})
        await self.seen.wait(
            lambda: any(str(line.logger).endswith("chatter") and line.level == "warning" for line in self.seen.logs)
        )
        return {
            "result": said,
            "levels": [str(line.level) for line in self.seen.logs if str(line.logger).endswith("chatter")],
        }

    async def logs(self, toggle):
        """Ask for every level, start the server's logging and wait for a line."""
        await self.session.set_logging_level("debug")
        said = await self.call(toggle, {})
        await self.seen.wait(lambda: bool(self.seen.logs), 8.0)
        await self.call(toggle, {})  # stop it
        return {"toggled": said, "levels": sorted({str(line.level) for line in self.seen.logs})}


def connect(front, target):
    if front == "stdio":
        argv = ["-m", "aggregator", "serve", "--stdio", "--config", target, "--log-level", "info"]
        return stdio_client(StdioServerParameters(command=sys.argv[4], args=argv))
    return streamablehttp_client(target)


async def main(front, target, servers):
    out = {}
    seen = Seen()
    with anyio.fail_after(80):
        async with connect(front, target) as streams:
            async with ClientSession(
                streams[0],
                streams[1],
                sampling_callback=on_sample,
                elicitation_callback=on_elicit,
                list_roots_callback=on_roots,
                logging_callback=seen.log,
                message_handler=seen.message,
            ) as session:
                out["version"] = (await session.initialize()).protocolVersion
                peer = Legacy(session, seen)
                for prefix, kind in servers.items():
                    for feature, step in steps_for(kind, prefix, "legacy"):
                        try:
                            with anyio.fail_after(20):
                                out[f"{prefix}.{feature}"] = await step(peer)
                        except Exception as exc:  # noqa: BLE001 - recorded; the test says which step failed
                            out[f"{prefix}.{feature}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))

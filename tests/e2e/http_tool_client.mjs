// Call one tool over Streamable HTTP with the official TypeScript SDK client and print what
// happened as one JSON line: {elapsed_ms, text | error, progress}.
// Usage: node http_tool_client.mjs URL TOOL ARGS_JSON [TIMEOUT_MS]
// TIMEOUT_MS is the client's own request timeout (the SDK cancels the request past it).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, args, timeout] = process.argv.slice(2);
const client = new Client({ name: "http-tool-client", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const progress = [];
const started = Date.now();
const outcome = {};
try {
  const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
    timeout: timeout ? Number(timeout) : 60000,
    onprogress: (p) => progress.push(p.progress),
  });
  outcome.text = result.content?.[0]?.text ?? null;
  outcome.isError = result.isError ?? false;
} catch (error) {
  outcome.error = { code: error.code ?? null, message: error.message };
}
outcome.elapsed_ms = Date.now() - started;
outcome.progress = progress;
console.log(JSON.stringify(outcome));
await client.close();

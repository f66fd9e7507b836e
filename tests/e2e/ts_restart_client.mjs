// Call one tool of the proxy over Streamable HTTP with the official TypeScript SDK, again
// and again, printing each outcome as a JSON line: {"ok": true} or the error's code,
// message and data. Stops once a call succeeds after one failed, or after SECONDS.
// Usage: node ts_restart_client.mjs URL TOOL SECONDS
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, seconds] = process.argv.slice(2);
const client = new Client({ name: "ts-restart", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const until = Date.now() + Number(seconds) * 1000;
let failed = false;
while (Date.now() < until) {
  let outcome;
  try {
    const result = await client.callTool({ name: tool, arguments: { timezone: "UTC" } });
    outcome = { ok: !result.isError };
  } catch (error) {
    outcome = { code: error.code, message: error.message, data: error.data ?? null };
  }
  console.log(JSON.stringify(outcome));
  if (outcome.ok && failed) break;
  failed ||= !outcome.ok;
  await new Promise((resolve) => setTimeout(resolve, 100));
}
await client.close();

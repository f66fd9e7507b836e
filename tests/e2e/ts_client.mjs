// Drive a stdio MCP server with the official TypeScript SDK client (the one Claude
// Desktop, Cursor and VS Code build on) and print what it saw as JSON.
// Usage: node ts_client.mjs COMMAND [ARGS...]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "ts-e2e", version: "1.0.0" });
await client.connect(transport);

const tools = [];
let cursor;
let pages = 0;
do {
  const page = await client.listTools(cursor ? { cursor } : {});
  tools.push(...page.tools.map((t) => t.name));
  cursor = page.nextCursor;
  pages += 1;
} while (cursor && pages < 100);

const sum = await client.callTool({ name: "everything__get-sum", arguments: { a: 20, b: 22 } });
const time = await client.callTool({ name: "time__get_current_time", arguments: { timezone: "UTC" } });
const resources = await client.listResources();
const read = await client.readResource({ uri: resources.resources[0].uri });
let unknown;
try {
  await client.callTool({ name: "nope__nothing", arguments: {} });
} catch (error) {
  unknown = { code: error.code, message: error.message };
}
console.log(JSON.stringify({
  server: client.getServerVersion(),
  protocol: transport._protocolVersion ?? null,
  tools, pages,
  sum: sum.content[0].text,
  time: time.content[0].text,
  firstResource: resources.resources[0].uri,
  readUri: read.contents[0].uri,
  unknown,
}));
await client.close();

// Run the proxy over stdio with the official TypeScript SDK client as Claude Desktop and
// VS Code do: one client declaring roots with listChanged, answering roots/list from a list
// it changes mid-way (then it sends notifications/roots/list_changed). Prints, as JSON, the
// text of TOOL before and after the change and how often it was asked for its roots.
// Usage: node ts_roots_client.mjs TOOL FIRST_DIR SECOND_DIR COMMAND [ARGS...]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ListRootsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [tool, first, second, command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "ts-roots", version: "1.0.0" }, { capabilities: { roots: { listChanged: true } } });
let roots = [first];
let asked = 0;
client.setRequestHandler(ListRootsRequestSchema, async () => {
  asked += 1;
  return { roots: roots.map((dir) => ({ uri: "file://" + dir, name: dir })) };
});
await client.connect(transport);
// How long to wait for the roots to show (ROOTS_WAIT_MS, default 5 s): where they never
// should, the caller makes it short.
const tries = Number(process.env.ROOTS_WAIT_MS ?? 5000) / 100;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = async () => {
  const result = await client.callTool({ name: tool, arguments: {} });
  return result.content.map((c) => c.text).join(" ");
};
// server-filesystem asks for roots once initialized, while the first call may already be
// on its way (so it is even without a proxy): wait for the roots to take.
let before = await text();
for (let i = 0; i < tries && !before.includes(first); i += 1) {
  await sleep(100);
  before = await text();
}
const askedBefore = asked;
roots = [second];
await client.sendRootsListChanged();
let after = before;
for (let i = 0; i < tries && !after.includes(second); i += 1) {
  await sleep(100);
  after = await text();
}
console.log(JSON.stringify({ before, after, askedBefore, asked }));
await client.close();

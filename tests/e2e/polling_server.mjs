// A Streamable HTTP MCP server, built on the official TypeScript SDK, that polls (SEP-1699):
// its tools close the event stream of the call that runs them and answer later, so a client
// gets the answer only by resuming that stream with GET and Last-Event-ID after the `retry`
// delay the server sent in its priming event.
//
// Usage: node polling_server.mjs [--port N] [--retry-ms N] [--no-event-store]
// Listens on 127.0.0.1 (on a free port unless given) and prints `listening <port>` on stdout.
// On stderr, one JSON line per stream it closes ({"closed": t, "stream"}) and per GET it
// receives ({"get": t, "lastEventId": "<stream>~<n>", "session", "protocol"}), t in
// milliseconds since the epoch.
//
// Tools:
//   test_reconnection       the conformance suite's SEP-1699 tool: logs a line, closes the stream,
//                           answers later
//   poll {tag, closes, gap_ms}  sends a progress notification (when asked for) and closes its
//                           stream `closes` times, `gap_ms` apart, then answers "polled <tag>"
//   close_unresumable       with --no-event-store: closes its stream, which gave no event id
//   drop_connection {tag}   breaks the TCP connection its POST came on, then answers "survived <tag>"
import { randomUUID } from "node:crypto";
import http from "node:http";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const argv = process.argv.slice(2);
const option = (name, fallback) => {
  const at = argv.indexOf(name);
  return at === -1 ? fallback : argv[at + 1];
};
const retryInterval = Number(option("--retry-ms", "500"));
const withEventStore = !argv.includes("--no-event-store");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const note = (record) => process.stderr.write(JSON.stringify(record) + "\n");

// Events kept in order per stream, ids `<stream>~<n>`: replay is exactly what followed an id.
class EventStore {
  constructor() { this.streams = new Map(); this.count = 0; }
  async storeEvent(streamId, message) {
    const eventId = `${streamId}~${++this.count}`;
    if (!this.streams.has(streamId)) this.streams.set(streamId, []);
    this.streams.get(streamId).push({ eventId, message });
    return eventId;
  }
  async getStreamIdForEventId(eventId) {
    const streamId = eventId.slice(0, eventId.lastIndexOf("~"));
    return this.streams.has(streamId) ? streamId : undefined;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const streamId = await this.getStreamIdForEventId(lastEventId);
    const events = this.streams.get(streamId) ?? [];
    const at = events.findIndex((e) => e.eventId === lastEventId);
    for (const { eventId, message } of events.slice(at + 1)) {
      if (Object.keys(message).length) await send(eventId, message);  // not the priming event
    }
    return streamId;
  }
}

const TOOLS = [
  { name: "test_reconnection", description: "Closes its stream mid-call, then answers",
    inputSchema: { type: "object", properties: {} } },
  { name: "poll", description: "Closes its stream `closes` times, then answers",
    inputSchema: { type: "object", properties: {
      tag: { type: "string" }, closes: { type: "integer" }, gap_ms: { type: "integer" } } } },
  { name: "close_unresumable", description: "Closes its stream, which has no event ids",
    inputSchema: { type: "object", properties: {} } },
  { name: "drop_connection", description: "Breaks its connection mid-call, then answers",
    inputSchema: { type: "object", properties: { tag: { type: "string" } } } },
];
const sockets = new Map();  // "<session> <request id>" -> the socket its POST came on

function newServer(transport) {
  const server = new Server({ name: "polling-server", version: "1.0.0" }, { capabilities: { tools: {}, logging: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { name, arguments: args = {} } = request.params;
    const close = () => {
      // Which stream it closes (the SDK keeps that to itself): the resuming GET names it.
      const stream = transport._webStandardTransport?._requestToStreamMapping?.get(extra.requestId) ?? null;
      note({ closed: Date.now(), tool: name, stream });
      if (extra.closeSSEStream) extra.closeSSEStream();
      else transport.closeSSEStream(extra.requestId);
    };
    if (name === "test_reconnection") {
      // Says what it does first, on the call's own stream (a proxy in front of this server
      // then streams its answer too, rather than sending it as one JSON body).
      await extra.sendNotification({ method: "notifications/message",
        params: { level: "info", logger: "polling", data: "closing the stream; resume it to get the answer" } });
      await sleep(100);
      close();
      await sleep(200);
      return { content: [{ type: "text", text: "Reconnection test completed" }] };
    }
    if (name === "poll") {
      const token = request.params._meta?.progressToken;
      const closes = args.closes ?? 1;
      for (let i = 1; i <= closes; i++) {
        if (token !== undefined) {
          await extra.sendNotification({ method: "notifications/progress",
            params: { progressToken: token, progress: i, total: closes } });
        }
        close();
        await sleep(args.gap_ms ?? 300);
      }
      return { content: [{ type: "text", text: `polled ${args.tag ?? ""}` }] };
    }
    if (name === "drop_connection") {
      await sleep(100);
      note({ dropped: Date.now(), tool: name });
      sockets.get(`${extra.sessionId} ${extra.requestId}`)?.destroy();
      await sleep(300);
      return { content: [{ type: "text", text: `survived ${args.tag ?? ""}` }] };
    }
    if (name === "close_unresumable") {
      close();
      await sleep(300);
      return { content: [{ type: "text", text: "nobody reads this" }] };
    }
    throw new Error(`unknown tool ${name}`);
  });
  return server;
}

const transports = new Map();

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : undefined;
}

const httpServer = http.createServer(async (req, res) => {
  try {
    const session = req.headers["mcp-session-id"];
    if (req.method === "GET") {
      note({ get: Date.now(), lastEventId: req.headers["last-event-id"] ?? null, session: session ?? null,
             protocol: req.headers["mcp-protocol-version"] ?? null });
    }
    const body = req.method === "POST" ? await readBody(req) : undefined;
    if (session && body?.id !== undefined) {
      sockets.set(`${session} ${body.id}`, req.socket);
      res.on("close", () => sockets.delete(`${session} ${body.id}`));
    }
    let transport = session ? transports.get(session) : undefined;
    if (!transport) {
      if (session || req.method !== "POST" || body?.method !== "initialize") {
        res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({
          jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } }));
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: withEventStore ? new EventStore() : undefined,
        retryInterval,
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => transports.delete(transport.sessionId);
      await newServer(transport).connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (error) {
    note({ error: String(error) });
    if (!res.headersSent) res.writeHead(500).end();
  }
});

httpServer.listen(Number(option("--port", "0")), "127.0.0.1", () => {
  process.stdout.write(`listening ${httpServer.address().port}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));

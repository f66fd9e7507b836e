// Log in to the proxy as a user's client would, with the official TypeScript SDK's OAuth
// support for Streamable HTTP (the `authProvider` of StreamableHTTPClientTransport), and print
// one JSON line: the tools listed, what `up__whoami` answered, each authorization URL's `scope`
// and `resource`, how many registrations, the grant type of every token request, and how many
// sessions the MCP requests named; or the error.
// Usage: node ts_oauth_client.mjs SPEC_JSON, SPEC {url, user, pause?, stored?: {tokens, client}}.
//
// The SDK finds the authorization server from the proxy's 401 and metadata, registers, and
// hands its authorization URL to `redirectToAuthorization`; this follows it with a plain GET
// (`login_hint` names the user, whom the suite's authorization server approves at once under
// `--auto-approve`), checks the redirect's `state` and `iss`, and gives the code to
// `transport.finishAuth` before connecting again, as an application does after its redirect.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { randomBytes } from "node:crypto";

const REDIRECT = "http://127.0.0.1:1/callback";
const spec = JSON.parse(process.argv[2]);
const seen = { authorizations: [], registrations: 0, grants: [] };
const sessions = new Set();
let tokens = spec.stored?.tokens;
let clientInformation = spec.stored?.client;
let verifier;
let state;
let redirected;

const provider = {
  get redirectUrl() {
    return REDIRECT;
  },
  get clientMetadata() {
    return {
      client_name: "ts oauth client",
      redirect_uris: [REDIRECT],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  },
  state: () => (state = randomBytes(16).toString("hex")),
  clientInformation: () => clientInformation,
  saveClientInformation: (information) => {
    clientInformation = information;
  },
  tokens: () => tokens,
  saveTokens: (saved) => {
    tokens = saved;
  },
  saveCodeVerifier: (saved) => {
    verifier = saved;
  },
  codeVerifier: () => verifier,
  async redirectToAuthorization(url) {
    seen.authorizations.push({ scope: url.searchParams.get("scope"), resource: url.searchParams.get("resource") });
    url.searchParams.set("login_hint", spec.user);
    const answer = await fetch(url, { redirect: "manual" });
    if (answer.status !== 302) throw new Error(`the authorization endpoint answered ${answer.status}`);
    redirected = new URL(answer.headers.get("location")).searchParams;
    if (!redirected.get("code")) throw new Error(`the authorization was refused: ${redirected}`);
  },
};

// Every request the SDK makes, the OAuth ones included, goes through this.
async function recording(input, init) {
  const url = new URL(input instanceof Request ? input.url : input);
  if (url.pathname === "/register") seen.registrations += 1;
  if (url.pathname === "/token") seen.grants.push(new URLSearchParams(String(init?.body ?? "")).get("grant_type"));
  const session = new Headers(init?.headers).get("mcp-session-id");
  if (url.pathname === "/mcp" && session) sessions.add(session);
  return fetch(input, init);
}

async function connect() {
  const client = new Client({ name: "ts-oauth-client", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(spec.url), { authProvider: provider, fetch: recording });
  try {
    await client.connect(transport);
    return client;
  } catch (error) {
    if (!(error instanceof UnauthorizedError) || !redirected) throw error;
  }
  // The redirect came back: it must be ours (state) and from the server we asked (RFC 9207 iss).
  if (redirected.get("state") !== state) throw new Error("the redirect's state is not the one sent");
  if (!redirected.get("iss")) throw new Error("the redirect names no issuer");
  await transport.finishAuth(redirected.get("code"));
  redirected = undefined;
  const again = new Client({ name: "ts-oauth-client", version: "1.0.0" });
  await again.connect(new StreamableHTTPClientTransport(new URL(spec.url), { authProvider: provider, fetch: recording }));
  return again;
}

const outcome = {};
try {
  const client = await connect();
  outcome.tools = (await client.listTools()).tools.map((tool) => tool.name).sort();
  await new Promise((resolve) => setTimeout(resolve, (spec.pause ?? 0) * 1000));
  const called = await client.callTool({ name: "up__whoami", arguments: {} });
  outcome.called = called.content?.[0]?.text ?? null;
  await client.close();
} catch (error) {
  outcome.error = `${error.name}: ${error.message}`.slice(0, 1000);
}
console.log(JSON.stringify({ ...outcome, ...seen, sessions: sessions.size }));

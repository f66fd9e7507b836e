"""The status page (``GET /status``): one HTML document, its CSS and script inline, no
build step, nothing fetched from elsewhere.

The script renders the snapshot embedded in the page (when the request was allowed to
see it) and then polls ``status.json`` every ``POLL_SECONDS``, sending the token found
after ``#token=`` in the page's address when there is one. Everything from the snapshot
is put in the page as text (``textContent``), never as markup: a server's stderr or a
tool's name cannot inject anything. The embedded JSON has ``<``, ``>`` and ``&`` escaped,
so no value can end its script element.
"""

from __future__ import annotations

from typing import Any

from aggregator.jsonrpc.codec import dumps

POLL_SECONDS = 2

_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>aggregator status</title>
<style>
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #cf222e; --wait: #9a6700; --dim: #6e7781; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5rem; max-width: 80rem; }
h1 { font-size: 1.3rem; margin: 0 0 .3rem; }
h2 { font-size: 1.05rem; margin: 1.6rem 0 .4rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #8884; vertical-align: top; }
th { font-weight: 600; white-space: nowrap; }
code, pre, .mono { font-family: ui-monospace, monospace; font-size: 12.5px; }
pre { margin: .2rem 0 0; white-space: pre-wrap; word-break: break-all; color: var(--dim); }
.state { font-weight: 600; }
.ready, .ok { color: var(--ok); }
.down, .bad, .error, .critical { color: var(--bad); }
.starting, .warning, .stale { color: var(--wait); }
.disabled, .dim { color: var(--dim); }
#banner { margin: .2rem 0 .8rem; }
details { margin: .3rem 0; }
summary { cursor: pointer; }
</style>
</head>
<body>
<h1>aggregator <span id="version" class="dim"></span></h1>
<div id="banner"><span id="overall" class="state">loading</span> <span id="summary" class="dim"></span>
 <span id="connection" class="dim"></span></div>
<div id="store" class="dim"></div>
<h2>Servers</h2>
<table><thead><tr><th>server</th><th>state</th><th>up for</th><th>restarts</th><th>protocol</th><th>items</th>
<th>last error and stderr</th></tr></thead><tbody id="servers"></tbody></table>
<h2>Sessions <span id="session-count" class="dim"></span></h2>
<table><thead><tr><th>#</th><th>transport</th><th>profile</th><th>protocol</th><th>in flight</th>
<th>connected for</th></tr></thead>
<tbody id="sessions"></tbody></table>
<h2>Recent warnings and errors</h2>
<table><thead><tr><th>time</th><th>level</th><th>logger</th><th>message</th></tr></thead>
<tbody id="errors"></tbody></table>
<h2>Catalog</h2>
<div id="catalog"></div>
"""

_SCRIPT = """<script>
"use strict";
const POLL_MS = __POLL__ * 1000;
const SHOWN_ERRORS = 20;
const KIND_LABELS = { tools: "tools", prompts: "prompts", resources: "resources", resourceTemplates: "templates" };
// The token is all the fragment holds after "token=", as it is: a token may hold "+", "%"
// or "&", which form decoding would change. Should that be refused, the same text
// percent-decoded is tried (a browser encodes '"', "<", ">" and "`" in an address).
const tokens = fragmentTokens(location.hash.slice(1));
let tokenIndex = 0;
function fragmentTokens(fragment) {
  if (!fragment.startsWith("token=") || fragment.length === 6) return [];
  const raw = fragment.slice(6);
  let decoded = raw;
  try { decoded = decodeURIComponent(raw); } catch (error) { /* not percent-encoding: raw only */ }
  return decoded === raw ? [raw] : [raw, decoded];
}
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}
function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  let s = Math.floor(seconds);
  const d = Math.floor(s / 86400); s %= 86400;
  const h = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  if (d) return d + "d " + h + "h";
  if (h) return h + "h " + m + "m";
  if (m) return m + "m " + s + "s";
  return s + "s";
}
function fill(id, rows, empty, columns) {
  const body = $(id);
  body.replaceChildren();
  if (!rows.length) {
    const td = el("td", empty, "dim"); td.colSpan = columns;
    body.appendChild(row([td]));
  }
  for (const r of rows) body.appendChild(r);
}
function serverRow(s) {
  const state = el("td", s.state, "state " + s.state.replace(" ", "-"));
  const detail = el("td");
  if (s.sessions !== undefined) {
    detail.appendChild(el("div", s.sessions + " session(s) connected, each as its own (auth = " + s.auth + ")", "dim"));
  }
  if (s.last_error) detail.appendChild(el("div", s.last_error, s.state === "ready" ? "dim" : "bad"));
  if (s.last_start != null) detail.appendChild(el("div", "started in " + s.last_start.toFixed(2) + " s", "dim"));
  if (s.stderr && s.stderr.length) detail.appendChild(el("pre", s.stderr.join("\\n")));
  const items = s.items ? Object.entries(s.items).filter(([, n]) => n)
    .map(([k, n]) => n + " " + (KIND_LABELS[k] || k)).join(", ") : "";
  const protocol = s.era ? s.era + " " + s.protocol : (s.transport || "");
  const tr = row([el("td", s.name, "mono"), state, duration(s.uptime), s.restarts ?? "", protocol, items, detail]);
  tr.dataset.server = s.name;
  tr.dataset.state = s.state;
  return tr;
}
function catalogSection(name, view, wasOpen) {
  const box = el("details");
  box.dataset.profile = name;
  let shown = 0, hidden = 0;
  const table = el("table");
  table.appendChild(row([el("th", "kind"), el("th", "name"), el("th", "server"), el("th", "original"),
    el("th", "hidden by")]));
  for (const [kind, items] of Object.entries(view.hidden)) {
    for (const item of items) {
      hidden++;
      const tr = row([kind, el("td", "(hidden)", "dim"), item.server, el("td", item.original, "mono"),
        el("td", item.rule, "warning")]);
      tr.dataset.hidden = item.server + ":" + item.original;
      table.appendChild(tr);
    }
  }
  for (const [kind, items] of Object.entries(view.exposed)) {
    for (const item of items) {
      shown++;
      table.appendChild(row([kind, el("td", item.name, "mono"), item.server, el("td", item.original, "mono"), ""]));
    }
  }
  box.open = name in wasOpen ? wasOpen[name] : name === "default" || hidden > 0;
  const d = view.discovery;
  const lists = d ? "; tools/list " + (d.lists === "all" ? "all " + d.tools_list_tokens : "2 search tools " +
    d.search_list_tokens + " of " + d.tools_list_tokens) + " tokens (" + d.mode + ")" : "";
  box.appendChild(el("summary", "profile " + name + ": " + shown + " shown, " + hidden + " hidden" + lists));
  box.appendChild(table);
  return box;
}
function render(data) {
  $("version").textContent = data.version;
  const overall = $("overall");
  overall.textContent = data.draining ? "draining" : (data.ready ? "ready" : "not ready");
  overall.className = "state " + (data.ready ? "ok" : "bad");
  const r = data.readiness;
  $("summary").textContent = r.ready + " of " + r.configured + " servers ready (" + r.needed +
    " needed), up for " + duration(data.uptime);
  fill("servers", data.servers.map(serverRow), "no servers configured", 7);
  const st = data.store, store = $("store");  // the shared store, when one is configured
  store.textContent = st && st.kind !== "memory" ? "shared store " + st.address + ": " + (st.up ? "up, round trip " +
    (st.round_trip_ms ?? "?") + " ms" : "down: " + (st.last_error || "not connected")) : "";
  store.className = st && !st.up ? "bad" : "dim";
  $("session-count").textContent = "(" + data.sessions.length + ")";
  fill("sessions", data.sessions.map((s) => row([s.id, s.transport, s.profile ?? "", s.protocol ?? "",
    s.in_flight, duration(s.age)])), "no client is connected", 6);
  const when = (e) => new Date(e.time * 1000).toISOString().replace("T", " ").slice(0, 19);
  fill("errors", data.errors.slice(0, SHOWN_ERRORS).map((e) => row([when(e), el("td", e.level, e.level),
    el("td", e.logger, "mono"), e.count > 1 ? e.message + " (" + e.count + " times since "
    + when({ time: e.first }).slice(11) + ")" : e.message])), "none since it started", 4);
  const catalog = $("catalog");
  const wasOpen = {};  // what the reader opened or closed stays so across refreshes
  for (const box of catalog.querySelectorAll("details")) wasOpen[box.dataset.profile] = box.open;
  catalog.replaceChildren(...Object.entries(data.catalog).map(([name, view]) => catalogSection(name, view, wasOpen)));
  document.body.dataset.updated = String(Date.now());
}
async function poll() {
  const token = tokens[tokenIndex];
  const headers = token ? { Authorization: "Bearer " + token } : {};
  try {
    const answer = await fetch("status.json", { headers, cache: "no-store" });
    if (answer.status === 401 && tokenIndex + 1 < tokens.length) {
      tokenIndex += 1;  // the raw text was refused: try it percent-decoded, now
      setTimeout(poll, 0);
      return;
    } else if (answer.status === 401) {
      $("connection").textContent = token
        ? "token refused: the token after #token= in this address is not the admin token"
        : "a token is required: open this page as /status#token=YOUR_TOKEN";
      $("connection").className = "bad";
    } else if (!answer.ok) {
      $("connection").textContent = "status.json answered " + answer.status;
      $("connection").className = "bad";
    } else {
      render(await answer.json());
      $("connection").textContent = "updated " + new Date().toLocaleTimeString();
      $("connection").className = "dim";
    }
  } catch (error) {
    $("connection").textContent = "cannot reach the aggregator; showing what it last said";
    $("connection").className = "stale";
  }
  setTimeout(poll, POLL_MS);
}
const initial = document.getElementById("initial");
if (initial) render(JSON.parse(initial.textContent));
setTimeout(poll, initial ? POLL_MS : 0);
</script>
</body>
</html>
"""


def page(data: dict[str, Any] | None) -> bytes:
    """The status page, with ``data`` (a ``status.snapshot``) embedded, or without any."""
    embedded = b""
    if data is not None:
        text = dumps(data).replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
        embedded = b'<script type="application/json" id="initial">' + text + b"</script>\n"
    return _HEAD.encode() + embedded + _SCRIPT.replace("__POLL__", str(POLL_SECONDS)).encode()

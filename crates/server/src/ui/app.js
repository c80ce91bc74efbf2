// Palisade's dashboard: reads the v1 API with the bearer key kept in this tab's
// sessionStorage (never in localStorage or a cookie), a page of locks, of namespaces and
// of the marks gates reported at a time, the events stream read with fetch()
// (EventSource cannot send Authorization), and /metrics for the per-second chart.
// Everything is written with textContent.
"use strict";

const KEY = "palisade.key";
const PAGE = 50; // rows per page: one page is all the page ever holds
const MARKS_PAGE = 20; // rows per page of the marks by resource
const FEED_MAX = 200; // feed entries kept
const FEED_BACKLOG = 50; // events shown at once when the page opens
const POINTS = 60; // chart points kept
const REFRESH_MS = 2000;

const $ = (id) => document.getElementById(id);

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function status(text, bad) {
  const el = $("status");
  el.textContent = text;
  el.className = bad ? "error" : "";
}

async function getJson(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (!r.ok) {
    let code = String(r.status);
    try { code = (await r.json()).error.code; } catch (_) { /* not JSON */ }
    throw new Error(code);
  }
  return r.json();
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function left(ms) {
  if (ms === null || ms === undefined) return "-";
  return ms >= 10000 ? Math.round(ms / 1000) + " s" : (ms / 1000).toFixed(1) + " s";
}

// A paged table: a stack of `after` cursors, one fetch of PAGE rows per refresh.
function pager(o) {
  const p = { cursors: [null], next: null };
  p.load = async () => {
    const q = new URLSearchParams({ limit: String(o.limit || PAGE) });
    const prefix = $(o.prefix).value.trim();
    if (prefix) q.set("prefix", prefix);
    const after = p.cursors[p.cursors.length - 1];
    if (after !== null) q.set("after", after);
    const page = await getJson(o.path + "?" + q);
    p.next = page.next;
    const body = $(o.table).tBodies[0];
    body.replaceChildren(...page[o.field].map(o.row));
    $(o.label).textContent = "page " + p.cursors.length;
    $(o.nextButton).disabled = !p.next;
    $(o.prevButton).disabled = p.cursors.length < 2;
  };
  $(o.nextButton).addEventListener("click", () => {
    if (p.next) { p.cursors.push(p.next); refresh(); }
  });
  $(o.prevButton).addEventListener("click", () => {
    if (p.cursors.length > 1) { p.cursors.pop(); refresh(); }
  });
  $(o.prefix).addEventListener("change", () => { p.cursors = [null]; refresh(); });
  return p;
}

const locks = pager({
  path: "/v1/locks", field: "locks", table: "locks", prefix: "locks-prefix",
  label: "locks-page", nextButton: "locks-next", prevButton: "locks-prev",
  row: (l) => {
    const tr = document.createElement("tr");
    tr.dataset.lock = l.lock;
    if (!l.holder) tr.className = "free";
    cell(tr, l.lock, "lock");
    cell(tr, l.holder, "holder");
    // A live lease's own epoch; `epoch` alone is the last issued or reserved.
    cell(tr, l.lease_epoch ?? l.epoch, "epoch num");
    cell(tr, left(l.remaining_ms), "left num");
    cell(tr, l.waiters, "waiters num");
    return tr;
  },
});

const namespaces = pager({
  path: "/v1/fences", field: "namespaces", table: "namespaces", prefix: "ns-prefix",
  label: "ns-page", nextButton: "ns-next", prevButton: "ns-prev",
  row: (n) => {
    const tr = document.createElement("tr");
    tr.dataset.ns = n.lock;
    cell(tr, n.lock, "ns");
    cell(tr, n.high_water, "hw num");
    cell(tr, n.seq, "seq num");
    cell(tr, n.keys, "keys num");
    cell(tr, n.bytes, "bytes num");
    cell(tr, n.policy, "policy");
    return tr;
  },
});

// Each lock's mark in every resource whose gate reported one, beside the store's; a mark
// below the row's highest is a resource that has not seen the newest writer yet.
const marks = pager({
  path: "/v1/gates/marks", field: "locks", table: "marks", prefix: "marks-prefix",
  label: "marks-page", nextButton: "marks-next", prevButton: "marks-prev", limit: MARKS_PAGE,
  row: (l) => {
    const tr = document.createElement("tr");
    tr.dataset.lock = l.lock;
    cell(tr, l.lock, "lock");
    cell(tr, l.store, "store num");
    const top = Math.max(l.store ?? 0, ...l.resources.map((r) => r.high_water));
    const td = document.createElement("td");
    td.className = "resources";
    for (const r of l.resources) {
      const span = document.createElement("span");
      span.dataset.resource = r.resource;
      span.textContent = r.resource + " " + r.high_water;
      span.title = "reported " + new Date(r.reported_at_ms).toLocaleTimeString();
      if (r.high_water < top) span.className = "behind";
      td.append(span, " ");
    }
    tr.appendChild(td);
    return tr;
  },
});

async function refresh() {
  const results = await Promise.allSettled([locks.load(), namespaces.load(), marks.load()]);
  const failed = results.find((r) => r.status === "rejected");
  if (failed) {
    const code = failed.reason.message;
    status(code === "unauthenticated" ? "enter a bearer key" : "error: " + code, true);
  } else {
    status("updated " + new Date().toLocaleTimeString());
  }
}

// The live feed.
function describe(type, e) {
  switch (type) {
    case "granted": return `granted ${e.lock} epoch ${e.epoch} to ${e.holder} for ${e.ttl_ms} ms`;
    case "released": return `released ${e.lock} epoch ${e.epoch} by ${e.holder} (${e.cause})`;
    case "expired": return `expired ${e.lock} epoch ${e.epoch} of ${e.holder}`;
    case "fenced": return `fenced ${e.lock} high-water ${e.high_water}` + (e.seq ? ` seq ${e.seq}` : "");
    case "rejected": return `REJECTED ${e.lock} ${e.code} epoch ${e.epoch ?? "-"}` +
      (e.high_water !== null ? ` < high-water ${e.high_water}` : "");
    case "gate_refused": return `REFUSED by the ${e.resource} gate: ${e.lock} ${e.code} epoch ${e.epoch ?? "-"}` +
      (e.high_water !== null ? ` < high-water ${e.high_water}` : "");
    case "reset": return `reset (${e.reason}): state re-read`;
    default: return `${type} ${e.lock ?? ""}`;
  }
}

function show(type, id, data) {
  let e;
  try { e = JSON.parse(data); } catch (_) { return; }
  const li = document.createElement("li");
  li.className = "ev-" + type.replace(/[^a-z_]/g, "");
  li.dataset.type = type;
  li.dataset.id = id;
  if (e.lock) li.dataset.lock = e.lock;
  const at = e.at_ms ? new Date(e.at_ms).toLocaleTimeString() + " " : "";
  li.textContent = at + describe(type, e);
  const feed = $("feed");
  feed.insertBefore(li, feed.firstChild);
  while (feed.childElementCount > FEED_MAX) feed.lastElementChild.remove();
  if (type === "reset" || type === "expired" || type === "granted" || type === "released") {
    refreshSoon();
  }
}

let soon = null;
function refreshSoon() {
  if (soon === null) soon = setTimeout(() => { soon = null; refresh(); }, 200);
}

let feedAbort = null;
let lastId = null;

async function follow() {
  const ctrl = new AbortController();
  feedAbort = ctrl;
  let wait = 500;
  while (!ctrl.signal.aborted) {
    try {
      const h = headers({ Accept: "text/event-stream" });
      if (lastId !== null) h["Last-Event-ID"] = lastId;
      // The first connection starts with the newest events the server holds (the feed is
      // not empty when the page opens); a reconnection resumes after the last one seen.
      const url = lastId === null ? "/v1/events?backlog=" + FEED_BACKLOG : "/v1/events";
      const r = await fetch(url, { headers: h, signal: ctrl.signal, cache: "no-store" });
      if (!r.ok) throw new Error("events: " + r.status);
      $("feed-state").textContent = "(live)";
      wait = 500;
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          let type = "message", id = null;
          const data = [];
          for (const line of block.split("\n")) {
            if (line === "" || line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            let v = colon < 0 ? "" : line.slice(colon + 1);
            if (v.startsWith(" ")) v = v.slice(1);
            if (field === "event") type = v;
            else if (field === "id") id = v;
            else if (field === "data") data.push(v);
          }
          if (id !== null) lastId = id;
          if (data.length) show(type, id, data.join("\n"));
        }
      }
    } catch (err) {
      if (ctrl.signal.aborted) return;
      $("feed-state").textContent = "(reconnecting: " + err.message + ")";
    }
    if (ctrl.signal.aborted) return;
    await new Promise((done) => setTimeout(done, wait));
    wait = Math.min(wait * 2, 10000);
  }
}

// The chart: rates from /metrics counters.
const series = { grants: [], writes: [], rejections: [] };
let previous = null;

function counters(text) {
  const c = { grants: 0, writes: 0, rejections: 0, t: performance.now() };
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    const name = line.slice(0, space), v = Number(line.slice(space + 1));
    if (name === "palisade_grants_total") c.grants = v;
    else if (name === "palisade_fenced_writes_total") c.writes = v;
    else if (name.startsWith("palisade_fenced_rejections_total")) c.rejections += v;
  }
  return c;
}

async function sample() {
  let text;
  try {
    const r = await fetch("/metrics", { headers: headers(), cache: "no-store" });
    if (!r.ok) {
      $("chart-note").textContent = r.status === 403 ? "(needs the metrics verb)" : "";
      return;
    }
    text = await r.text();
  } catch (_) { return; }
  $("chart-note").textContent = "";
  const now = counters(text);
  if (previous) {
    const secs = Math.max((now.t - previous.t) / 1000, 0.001);
    for (const k of Object.keys(series)) {
      series[k].push(Math.max(0, (now[k] - previous[k]) / secs));
      if (series[k].length > POINTS) series[k].shift();
    }
    draw();
  }
  previous = now;
}

// Pixels under the plot for its time axis.
const AXIS = 14;

function draw() {
  const canvas = $("chart");
  // Drawn at the size it is shown, so that its text is not stretched.
  if (canvas.clientWidth > 0 && canvas.width !== canvas.clientWidth) canvas.width = canvas.clientWidth;
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height - AXIS, pad = 16;
  g.clearRect(0, 0, w, canvas.height);
  // The time axis: the newest sample is now, at the right edge.
  g.strokeStyle = "#ccc";
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(0, h + 0.5);
  g.lineTo(w, h + 0.5);
  g.stroke();
  g.fillStyle = "#666";
  g.font = "11px sans-serif";
  const span = ((POINTS - 1) * REFRESH_MS) / 1000;
  for (const [frac, align] of [[0, "left"], [0.5, "center"], [1, "right"]]) {
    g.textAlign = align;
    g.fillText(frac === 1 ? "now" : "-" + Math.round(span * (1 - frac)) + " s", frac * w, canvas.height - 2);
  }
  g.textAlign = "left";
  const top = Math.max(1, ...series.grants, ...series.writes, ...series.rejections);
  g.fillStyle = "#666";
  g.font = "11px sans-serif";
  g.fillText(top.toFixed(1) + "/s", 2, 11);
  const colours = { grants: "#2f6db5", writes: "#2e8b57", rejections: "#c0392b" };
  for (const [k, values] of Object.entries(series)) {
    g.strokeStyle = colours[k];
    g.lineWidth = 2;
    g.fillStyle = colours[k];
    g.beginPath();
    values.forEach((v, i) => {
      // The newest sample at the right edge.
      const x = w - ((values.length - 1 - i) / (POINTS - 1)) * w;
      const y = h - 2 - (v / top) * (h - pad);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
      g.fillRect(Math.round(x) - 2, Math.round(y) - 2, 4, 4); // a lone sample shows too
    });
    g.stroke();
  }
}

function start() {
  $("key").value = "";
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (key) sessionStorage.setItem(KEY, key);
    $("key").value = "";
    restart();
  });
  $("key-forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    restart();
  });
  restart();
  setInterval(refresh, REFRESH_MS);
  setInterval(sample, REFRESH_MS);
}

function restart() {
  if (feedAbort) feedAbort.abort();
  lastId = null;
  previous = null;
  $("key").placeholder = sessionStorage.getItem(KEY) ? "key set for this tab" : "only with --auth-file";
  refresh();
  sample();
  follow();
}

start();

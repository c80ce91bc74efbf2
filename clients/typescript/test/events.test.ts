// Tests of the event stream (src/events.ts): typed events in order against a real
// `palisade serve`, a restart under a stream (same port, same data dir) giving a reset
// then live events, a refused prefix ending the stream with its typed error, and the
// parser's bounds (an over-long line dropped whole, unknown types skipped).

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { BadRequestError, Client, type LockEvent, StaleTokenError } from "../src/index.js";
import { EventStream, MAX_LINE, SseParser, parseEvent } from "../src/events.js";
import { startNode, startServer } from "./server.js";

/** Reads events from `stream` until `until` is true of one; all of them, in order. */
async function readUntil(stream: EventStream, until: (e: LockEvent) => boolean, ms = 20_000): Promise<LockEvent[]> {
  const seen: LockEvent[] = [];
  const timer = setTimeout(() => void stream.close(), ms);
  try {
    for (;;) {
      const next = await stream.next();
      assert.ok(!next.done, `the stream ended before the event awaited; saw ${seen.map((e) => e.type).join(", ")}`);
      seen.push(next.value);
      if (until(next.value)) return seen;
    }
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until the stream has its connection open (its first answer's headers came). */
async function connected(stream: EventStream): Promise<void> {
  // The stream connects when asked for an event: ask for one in the background.
  const deadline = Date.now() + 10_000;
  while (!stream.connected) {
    assert.ok(Date.now() < deadline, "the stream never connected");
    await new Promise((r) => setTimeout(r, 10));
  }
}

test("events arrive typed and in order: granted, fenced, released, rejected, expired", async (t) => {
  const c = new Client(await startServer(t));
  await using stream = c.events({ prefix: "ev." });
  const first = stream.next(); // opens the connection
  await connected(stream);
  const a = await c.acquire("ev.a", { holder: "a", ttlMs: 10_000 });
  await c.put("ev.a", "k", "v", a.token);
  await c.release(a.leaseId);
  const b = await c.acquire("ev.a", { holder: "b", ttlMs: 500 }); // expires after the writes below
  await c.put("ev.a", "k", "b", b.token);
  await assert.rejects(c.put("ev.a", "k", "late", a.token), StaleTokenError);
  await c.acquire("other", { holder: "x", ttlMs: 10_000 }); // not of the prefix
  const head = await first;
  assert.ok(!head.done);
  const events = [head.value, ...(await readUntil(stream, (e) => e.type === "expired"))];
  assert.deepEqual(
    events.map((e) => e.type),
    ["granted", "fenced", "released", "granted", "fenced", "rejected", "expired"],
  );
  const [granted, fenced, released, , , rejected, expired] = events;
  assert.ok(granted?.type === "granted" && fenced?.type === "fenced" && released?.type === "released");
  assert.deepEqual([granted.lock, granted.epoch, granted.holder, granted.ttlMs], ["ev.a", a.epoch, "a", 10_000]);
  assert.deepEqual([fenced.highWater, fenced.seq], [a.epoch, 0n]);
  assert.deepEqual([released.epoch, released.cause], [a.epoch, "release"]);
  assert.ok(rejected?.type === "rejected" && expired?.type === "expired");
  assert.deepEqual([rejected.code, rejected.epoch, rejected.highWater], ["stale_token", a.epoch, b.epoch]);
  assert.deepEqual([expired.epoch, expired.holder], [b.epoch, "b"]);
  for (let i = 1; i < events.length; i++) assert.ok(events[i]!.id > events[i - 1]!.id);
  assert.ok(events.every((e) => typeof e.atMs === "number" && e.atMs > 1_600_000_000_000));
  assert.equal(stream.lastEventId, expired.id);
});

test("a restart under a stream gives a reset first, then live events", async (t) => {
  const first = await startNode(t);
  const c = new Client(first.url);
  const stream = c.events({ prefix: "r." });
  t.after(() => stream.close());
  const pending = stream.next();
  await connected(stream);
  const a = await c.acquire("r.a", { holder: "a", ttlMs: 10_000 });
  const granted = await pending;
  assert.ok(!granted.done && granted.value.type === "granted" && granted.value.epoch === a.epoch);
  await first.kill(); // a crash: the stream drops
  const again = await startNode(t, { dir: first.dir, listen: new URL(first.url).host });
  assert.equal(again.url, first.url);
  const reset = await stream.next();
  assert.ok(!reset.done && reset.value.type === "reset", JSON.stringify(reset.value, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v)));
  assert.equal(reset.value.reason, "unknown_last_event_id");
  assert.ok(stream.connections >= 2);
  // r.a waits out its reservation after the crash: another lock of the prefix.
  const b = await c.acquire("r.b", { holder: "b", ttlMs: 10_000 });
  const live = await readUntil(stream, (e) => e.type === "granted");
  assert.deepEqual(live.map((e) => e.type), ["granted"]);
  assert.ok(live[0]!.type === "granted" && live[0]!.lock === "r.b" && live[0]!.epoch === b.epoch);
});

test("a refused stream ends with its typed error; a closed one ends quietly", async (t) => {
  const c = new Client(await startServer(t));
  const refused = c.events({ prefix: "bad/" });
  await assert.rejects(refused.next(), BadRequestError);
  assert.deepEqual(await refused.next(), { done: true, value: undefined });
  const controller = new AbortController();
  const stream = c.events({ lock: "quiet", signal: controller.signal });
  const pending = stream.next();
  await connected(stream);
  controller.abort();
  assert.deepEqual(await pending, { done: true, value: undefined });
});

test("passing failures are retried with backoff; an over-long line and unknown types are skipped", async (t) => {
  // A scripted server: 503 twice, then a stream with an unknown event, a line past
  // MAX_LINE, and a granted event; the stream's Last-Event-ID is recorded.
  const asked: (string | undefined)[] = [];
  const server = createServer((req, res) => {
    asked.push(req.headers["last-event-id"] as string | undefined);
    if (asked.length <= 2) {
      res.writeHead(503, { "content-type": "application/json" });
      res.end('{"error":{"code":"unavailable","message":"shutting down"}}');
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(': keep-alive\n\nevent: future\nid: 8\ndata: {"id":8,"at_ms":1,"type":"future"}\n\n');
    res.write(`data: ${"x".repeat(MAX_LINE + 10)}`);
    res.write('\n\nevent: granted\nid: 9\ndata: {"id":9,"at_ms":1,"type":"granted","lock":"a","epoch":18446744073709551615,"holder":"h","ttl_ms":5}\n\n');
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise<void>((resolve) => (server.closeAllConnections(), server.close(() => resolve()))));
  const c = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  await using stream = c.events({ lastEventId: 7n });
  const started = performance.now();
  const next = await stream.next();
  assert.ok(!next.done && next.value.type === "granted");
  assert.equal(next.value.epoch, 18446744073709551615n);
  assert.ok(performance.now() - started >= 300, "0.1 s then 0.2 s of backoff");
  assert.deepEqual(asked, ["7", "7", "7"]);
  assert.equal((stream.lastError as Error).constructor.name, "UnavailableError");
});

test("the parser bounds a line and skips what is not an event", () => {
  const p = new SseParser(16);
  assert.deepEqual(p.feed(new TextEncoder().encode("data: 0123456789abcdefXYZ")), []);
  assert.deepEqual(p.feed(new TextEncoder().encode("more\n\ndata: ok\r\n\r\n")), ["ok"]);
  assert.deepEqual(p.feed(new TextEncoder().encode("data: a\ndata: b\n\n")), ["a\nb"]);
  assert.equal(parseEvent('{"id":1,"at_ms":1,"type":"novel"}'), null);
  assert.equal(parseEvent('{"id":1,"at_ms":1,"type":"reset"}'), null); // no reason
  assert.equal(parseEvent("not json"), null);
  assert.deepEqual(parseEvent('{"id":1,"at_ms":2,"type":"reset","reason":"lagged"}'), { type: "reset", id: 1n, atMs: 2, reason: "lagged" });
});

// Tests of failover between endpoints (src/failover.ts, the client's endpoint loop): the
// rule's whole table, an unreachable node skipped, a node answering 503 (scripted with
// node:http, recording what it was sent) passing an acquire, a keyed write and a barrier
// on to a real `palisade serve` with a fresh Idempotency-Key on each write, the client
// starting at the node that answered last, and a node that drops the connection after
// reading an acquire not passing it on while a read goes on.

import assert from "node:assert/strict";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { type TestContext, test } from "node:test";

import { Client, UnavailableError, mayTryNext } from "../src/index.js";
import { startServer } from "./server.js";

/** A scripted node on a free loopback port, closed when the test ends. */
async function scripted(t: TestContext, handle: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  const server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise<void>((resolve) => (server.closeAllConnections(), server.close(() => resolve()))));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}


test("which failures move a call on: the rule's whole table", () => {
  for (const retry of ["safe", "unlessUnknown", "onlyUnreachable"] as const) assert.ok(mayTryNext(retry, "unreachable"));
  assert.ok(mayTryNext("safe", "unavailable"));
  assert.ok(mayTryNext("unlessUnknown", "unavailable"));
  assert.ok(!mayTryNext("onlyUnreachable", "unavailable"));
  assert.ok(mayTryNext("safe", "unknown"));
  assert.ok(!mayTryNext("unlessUnknown", "unknown"));
  assert.ok(!mayTryNext("onlyUnreachable", "unknown"));
});

test("an unreachable node is skipped", async (t) => {
  const url = await startServer(t);
  // A port that was listened on and closed: nothing listens there now.
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const dead = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  const c = new Client([dead, url], { timeoutMs: 5_000 });
  assert.deepEqual(c.endpoints, [dead, url]);
  const lease = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  await c.put("orders", "k", "v", lease.token);
  assert.equal(Buffer.from((await c.get("orders", "k")).value).toString(), "v");
  await c.release(lease.leaseId);
});

test("a 503 node passes an acquire, a write and a barrier on, each write with a fresh key; calls then start at the node that answered", async (t) => {
  const url = await startServer(t);
  const seen: string[] = [];
  const down = await scripted(t, (req, res) => {
    seen.push(`${req.method} ${req.url} key=${String(req.headers["idempotency-key"] ?? "none")}`);
    req.resume();
    res.writeHead(503, { "content-type": "application/json" });
    res.end('{"error":{"code":"unavailable","message":"down"}}');
  });
  const c = new Client([down, url]);
  const lease = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  assert.equal(seen.length, 1);
  await c.put("orders", "k", "v", lease.token); // the real node answered last: sent there first
  assert.equal(seen.length, 1, "the client did not start at the node that answered");
  // A new client starts at the first node again.
  const writer = new Client([down, url]);
  const written = await writer.put("orders", "k", "w", lease.token);
  const writer2 = new Client([down, url]);
  await writer2.fence("orders", lease.token);
  const writer3 = new Client([down, url]);
  await writer3.put("orders", "k2", "x", lease.token, { idempotencyKey: "mine" });
  assert.equal(seen[0], "POST /v1/locks/orders/acquire key=none");
  assert.match(seen[1]!, /^PUT \/v1\/kv\/orders\/k key=[0-9a-f-]{36}$/);
  assert.match(seen[2]!, /^POST \/v1\/fences\/orders key=[0-9a-f-]{36}$/);
  assert.equal(seen[3], "PUT /v1/kv/orders/k2 key=mine");
  assert.equal(seen.length, 4);
  assert.equal((await c.get("orders", "k")).revision, written.revision);
  // Every node answering 503: the last node's typed error.
  const allDown = new Client([down, down]);
  await assert.rejects(allDown.lockStatus("orders"), UnavailableError);
  // One endpoint: no key is added to a write.
  const single = new Client(down);
  await assert.rejects(single.put("orders", "k", "v", lease.token), UnavailableError);
  assert.equal(seen.at(-1), "PUT /v1/kv/orders/k key=none");
});

test("a node that drops an acquire after reading it does not pass it on; a read goes on", async (t) => {
  const url = await startServer(t);
  let dropped = 0;
  const dropping = await scripted(t, (req) => {
    req.resume();
    req.on("end", () => {
      dropped++;
      req.socket.destroy(); // no answer: the request may have been applied
    });
  });
  const c = new Client([dropping, url]);
  await assert.rejects(c.acquire("jobs", { holder: "b", ttlMs: 10_000 }), (err) => {
    assert.ok(err instanceof TypeError, String(err)); // fetch's own error: an unknown outcome
    return true;
  });
  assert.equal(dropped, 1);
  const real = new Client(url);
  assert.equal((await real.lockStatus("jobs")).holder, null, "the acquire was resent to the next node");
  // A read is safe to resend: it goes on (and gets one more try on the dropping node
  // only after the others).
  const before = dropped;
  assert.equal((await c.lockStatus("jobs")).lock, "jobs");
  assert.equal(dropped, before + 1);
  // So does a write with a key of its own; a session's creation does not.
  const lease = await real.acquire("orders", { holder: "a", ttlMs: 10_000 });
  const keyed = new Client([dropping, url]);
  assert.equal((await keyed.put("orders", "k", "v", lease.token)).replayed, false);
  const sessions = new Client([dropping, url]);
  await assert.rejects(sessions.createSession({ holder: "s", ttlMs: 10_000 }), TypeError);
});

// Tests of the lock client (src/client.ts) against a real `palisade serve` per test: the
// fencing story (a late write refused with both epochs, a held lock with its holder), a
// wait in line, guards that renew, release, and notice a lost lease, the server's tokens
// verified offline, the request headers, and the README's example run as written; and,
// with answers made here, guards whose renewals fail, hang, or answer late (their
// renewal deadline and safe deadline, src/renewal.ts).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { promisify } from "node:util";

import {
  Client,
  DecodeError,
  KeyRing,
  LeaseExpiredError,
  LockHeldError,
  NotFoundError,
  StaleTokenError,
  Verifier,
  WrongLockTokenError,
  isFenced,
} from "../src/index.js";
import { PACKAGE, startServer } from "./server.js";

test("a late write is fenced off with both epochs; a held lock answers with its holder", async (t) => {
  const c = new Client(await startServer(t));
  const first = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  await c.put("orders", "k", "from a", first.token);
  await assert.rejects(c.acquire("orders", { holder: "b", ttlMs: 10_000 }), (err) => {
    assert.ok(err instanceof LockHeldError, String(err));
    assert.equal(err.holder, "a");
    assert.equal(typeof err.retryAfterMs, "number");
    return true;
  });
  await c.release(first.leaseId);
  const second = await c.acquire("orders", { holder: "b", ttlMs: 10_000 });
  assert.ok(second.epoch > first.epoch);
  const written = await c.put("orders", "k", "from b", second.token);
  assert.equal(written.epoch, second.epoch);
  await assert.rejects(c.put("orders", "k", "late, from a", first.token), (err) => {
    assert.ok(err instanceof StaleTokenError && isFenced(err), String(err));
    assert.equal(err.epoch, first.epoch);
    assert.equal(err.highWater, second.epoch);
    assert.equal(err.status, 409);
    return true;
  });
  const entry = await c.get("orders", "k");
  assert.equal(Buffer.from(entry.value).toString(), "from b");
  assert.deepEqual([entry.epoch, entry.revision], [second.epoch, written.revision]);
  await assert.rejects(c.get("orders", "absent"), NotFoundError);
});

test("an acquisition waits in line and gets the lock when it is released", async (t) => {
  const url = await startServer(t);
  const c = new Client(url);
  const first = await c.acquire("jobs", { holder: "a", ttlMs: 10_000 });
  const waiting = c.acquire("jobs", { holder: "b", ttlMs: 10_000, waitMs: 20_000 });
  // Released only once the server counts the waiter, so the wait is what is tested.
  for (;;) {
    const status = (await (await fetch(`${url}/v1/locks/jobs`)).json()) as { waiters: number };
    if (status.waiters === 1) break;
    await delay(10);
  }
  await c.release(first.leaseId);
  const second = await waiting;
  assert.equal(second.holder, "b");
  assert.ok(second.epoch > first.epoch);
});

test("a guard keeps its lease past four TTLs, and releases it", async (t) => {
  const c = new Client(await startServer(t));
  const ttlMs = 600;
  const guard = await c.hold("jobs", { holder: "a", ttlMs });
  const deadline = performance.now() + 4 * ttlMs;
  let probes = 0;
  while (performance.now() < deadline) {
    await assert.rejects(c.acquire("jobs", { holder: "b", ttlMs }), LockHeldError, "the guarded lock was free");
    probes++;
    await delay(ttlMs / 4);
  }
  assert.ok(probes >= 8);
  assert.equal(guard.lost, false);
  assert.equal(guard.error, undefined);
  // Renewed: safe for a while yet, at most the TTL less 1 % from the last renewal's send.
  near(guard.safeUntil - guard.renewDeadline, ttlMs * 0.99 - (ttlMs * 2) / 3);
  assert.ok(guard.safeForMs > 0 && guard.safeForMs <= ttlMs * 0.99, `${guard.safeForMs} ms`);
  await guard.release();
  assert.equal(guard.safeForMs, 0); // released: no time left to act
  await guard.release(); // once released, again is the same outcome
  const next = await c.acquire("jobs", { holder: "b", ttlMs });
  assert.ok(next.epoch > guard.lease.epoch);
});

test("a guard notices its lease was taken away: its signal aborts", async (t) => {
  const c = new Client(await startServer(t));
  const guard = await c.hold("jobs", { holder: "a", ttlMs: 600 });
  await c.release(guard.lease.leaseId); // as an admin or an expiry would end it
  await aborted(guard.signal);
  assert.ok(guard.lost);
  assert.ok(guard.signal.reason instanceof LeaseExpiredError, String(guard.signal.reason));
  assert.equal(guard.signal.reason.code, "lease_expired");
  // The lease ended at the server before that answer: safe no longer.
  assert.equal(guard.safeForMs, 0);
  assert.ok(guard.safeUntil <= performance.now());
  await assert.rejects(guard.release(), (err) => err === guard.signal.reason);
});

test("`await using` releases the guard at the end of its block", async (t) => {
  const c = new Client(await startServer(t));
  let epoch: bigint;
  {
    await using guard = await c.hold("jobs", { holder: "a", ttlMs: 10_000 });
    epoch = guard.lease.epoch;
    await assert.rejects(c.acquire("jobs", { holder: "b", ttlMs: 10_000 }), LockHeldError);
  }
  const next = await c.acquire("jobs", { holder: "b", ttlMs: 10_000 });
  assert.ok(next.epoch > epoch);
});

test("the server's tokens verify offline with the keys it lists", async (t) => {
  const c = new Client(await startServer(t));
  const verifier = new Verifier(KeyRing.fromListing(await c.keys()));
  const lease = await c.acquire("orders", { holder: "worker-1", ttlMs: 10_000 });
  const claims = verifier.verify(lease.token, "orders");
  assert.deepEqual(
    [claims.lock, claims.epoch, claims.holder],
    ["orders", lease.epoch, "worker-1"],
  );
  assert.throws(() => verifier.verify(lease.token, "invoices"), WrongLockTokenError);
});

test("requests carry the bearer key and the fencing token, through a custom fetch", async (t) => {
  const url = await startServer(t);
  const seen: { method: string; path: string; headers: Headers; dispatcher: unknown }[] = [];
  const dispatcher = { an: "undici Dispatcher" };
  const c = new Client(`${url}/`, {
    key: "k-123",
    dispatcher,
    fetch: (input, init) => {
      const { dispatcher: given, ...rest } = init as RequestInit & { dispatcher?: unknown };
      seen.push({ method: rest.method ?? "GET", path: new URL(input).pathname, headers: new Headers(rest.headers), dispatcher: given });
      return fetch(input, rest);
    },
  });
  const lease = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  await c.put("orders", "dir/a b", new Uint8Array([0, 255]), lease.token);
  const entry = await c.get("orders", "dir/a b");
  assert.deepEqual([...entry.value], [0, 255]);
  assert.deepEqual(
    seen.map((r) => `${r.method} ${r.path}`),
    ["POST /v1/locks/orders/acquire", "PUT /v1/kv/orders/dir/a%20b", "GET /v1/kv/orders/dir/a%20b"],
  );
  assert.ok(seen.every((r) => r.headers.get("authorization") === "Bearer k-123" && r.dispatcher === dispatcher));
  assert.equal(seen[1]!.headers.get("fencing-token"), lease.token);
  assert.equal(seen[1]!.headers.get("content-type"), "application/octet-stream");
  // Dot segments would be removed by URL parsing, addressing another key: refused here.
  await assert.rejects(c.put("orders", "dir/../x", "v", lease.token), TypeError);
  assert.equal(seen.length, 3);
});

test("a guard whose renewals fail retries every tenth of the TTL, and gives the lease up at the renewal deadline", async () => {
  // No server: the acquisition is answered here, and every keepalive by a proxy's error page.
  const ttlMs = 300;
  const keepalives: number[] = [];
  const c = new Client("http://palisade.invalid", {
    fetch: answering(ttlMs, () => {
      keepalives.push(performance.now());
      return Promise.resolve(new Response("<html>502 Bad Gateway</html>", { status: 502, headers: { "content-type": "text/html" } }));
    }),
  });
  const asked = performance.now();
  const guard = await c.hold("jobs", { holder: "a", ttlMs });
  const held = performance.now();
  assert.equal(guard.lease.epoch, 9007199254740993n); // read exactly
  // From the acquisition's send: given up at 2/3 of the TTL, safe until 99 % of it.
  assert.ok(guard.renewDeadline >= asked + 200 && guard.renewDeadline <= held + 200, `${guard.renewDeadline - asked} ms`);
  near(guard.safeUntil - guard.renewDeadline, 297 - 200);
  await aborted(guard.signal);
  assert.ok(performance.now() >= guard.renewDeadline);
  const reason = guard.signal.reason as unknown;
  assert.ok(reason instanceof DOMException && reason.name === "TimeoutError", String(reason));
  assert.equal(reason.message, "no renewal succeeded before the renewal deadline");
  assert.ok(reason.cause instanceof DecodeError, String(reason.cause)); // the last failure
  // Sent from 1/3 of the TTL on, retried after a tenth of it (not a third), none after
  // the renewal deadline: the last may be sent a timer's tick before it and reach the stub
  // just after, a retry after it would come a tenth of the TTL (30 ms) later.
  assert.ok(keepalives.length >= 3, `${keepalives.length} keepalives`);
  assert.ok(keepalives.every((at) => at < guard.renewDeadline + 5), keepalives.map((at) => at - guard.renewDeadline).join(", "));
  // Given up, the holder still has until the safe deadline to stop what runs.
  assert.ok(guard.safeForMs <= 97);
  await assert.rejects(guard.release(), (err) => err === reason);
});

test("a renewal that hangs is given up at the renewal deadline of the client's settings", async () => {
  // No server: the keepalive never answers, and ignores its signal.
  const ttlMs = 300;
  let keepalives = 0;
  const c = new Client("http://palisade.invalid", {
    deadlines: { renewDeadline: 0.5, clockDrift: 0.1 },
    fetch: answering(ttlMs, () => {
      keepalives++;
      return new Promise<Response>(() => undefined);
    }),
  });
  const asked = performance.now();
  const guard = await c.hold("jobs", { holder: "a", ttlMs });
  const held = performance.now();
  assert.ok(guard.renewDeadline >= asked + 150 && guard.renewDeadline <= held + 150, `${guard.renewDeadline - asked} ms`);
  near(guard.safeUntil - guard.renewDeadline, 270 - 150);
  await aborted(guard.signal);
  assert.ok(performance.now() >= guard.renewDeadline);
  assert.equal(guard.lost, true);
  const reason = guard.error;
  assert.ok(reason instanceof DOMException && reason.name === "TimeoutError", String(reason));
  assert.equal(reason.message, "no renewal succeeded before the renewal deadline");
  assert.equal(keepalives, 1); // sent at a third of the TTL, abandoned at half of it
  await assert.rejects(guard.release(), (err) => err === reason);
});

test("a guard's deadlines count from each renewal's send, not its answer, and never trust a longer TTL", async () => {
  // No server: each keepalive is answered 50 ms after it was sent, granting 60 s.
  const ttlMs = 600;
  const sent: number[] = [];
  const c = new Client("http://palisade.invalid", {
    fetch: answering(ttlMs, async () => {
      sent.push(performance.now());
      await delay(50);
      return new Response(`{"lease_id":"l1","lock":"jobs","epoch":1,"ttl_ms":60000}`, { status: 200 });
    }),
  });
  const guard = await c.hold("jobs", { holder: "a", ttlMs });
  const first = guard.renewDeadline;
  const until = performance.now() + 10_000;
  while (guard.renewDeadline === first) {
    assert.ok(performance.now() < until, "no renewal was confirmed");
    await delay(5);
  }
  const renewal = sent[0]!;
  // 2/3 of the granted TTL, but of the first (600 ms), from the send: counting from the
  // answer would put it at least 50 ms later.
  assert.ok(guard.renewDeadline <= renewal + 400 && guard.renewDeadline > renewal + 375, `${guard.renewDeadline - renewal} ms`);
  near(guard.safeUntil - guard.renewDeadline, 594 - 400);
  assert.equal(guard.lost, false);
  await guard.release();
  assert.equal(guard.safeForMs, 0);
});

test("a success whose fields sit under a __proto__ name is a DecodeError, not a lease", async () => {
  // No server: each answer is made here.
  const lease = `"lock":"jobs","holder":"a","epoch":1,"token":"t","lease_id":"l1","ttl_ms":300,"lock_delay_ms":0`;
  let body = "";
  const c = new Client("http://palisade.invalid", { fetch: () => Promise.resolve(new Response(body, { status: 200 })) });
  body = `{"__proto__":{${lease}}}`;
  await assert.rejects(c.acquire("jobs", { holder: "a", ttlMs: 300 }), DecodeError);
  body = `{"__proto__":{"revision":1},"epoch":1}`;
  await assert.rejects(c.put("jobs", "k", "v", "t"), DecodeError);
  body = `{${lease}}`; // the same fields as the text's own: a lease
  assert.equal((await c.acquire("jobs", { holder: "a", ttlMs: 300 })).leaseId, "l1");
});

test("the README's example runs as written", async (t) => {
  const url = await startServer(t);
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const example = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(example !== undefined && example.includes("http://127.0.0.1:7070"));
  // Inside the package, so that "@palisade/client" resolves to this build.
  const file = join(PACKAGE, "dist", "readme-example.mjs");
  writeFileSync(file, example.replace("http://127.0.0.1:7070", url));
  const { stdout } = await promisify(execFile)(process.execPath, [file]);
  assert.equal(stdout, "wrote revision 1 under epoch 1\n");
});

/** A fetch with no server behind it: it grants a lease of `ttlMs` to an acquisition,
 * answers a release, and leaves every keepalive to `keepalive`. */
function answering(ttlMs: number, keepalive: () => Promise<Response>): (input: string) => Promise<Response> {
  return (input) => {
    const path = new URL(input).pathname;
    if (path.endsWith("/acquire")) {
      const lease = `{"lock":"jobs","holder":"a","epoch":9007199254740993,"token":"t","lease_id":"l1","ttl_ms":${ttlMs},"lock_delay_ms":0}`;
      return Promise.resolve(new Response(lease, { status: 200 }));
    }
    if (path.endsWith("/release")) return Promise.resolve(new Response("{}", { status: 200 }));
    return keepalive();
  };
}

/** `actual` is `expected`, give or take floating-point rounding. */
function near(actual: number, expected: number): void {
  assert.ok(Math.abs(actual - expected) < 1e-6, `${actual}, not ${expected}`);
}

/** Resolves when `signal` aborts; rejects if it has not within 10 s. */
function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the loss was never noticed")), 10_000);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

// Tests of the fenced store's options, the barrier, lock values and status, listings and
// sessions (src/kv.ts, src/fence.ts, src/locks.ts, src/session.ts, src/renewal.ts),
// each against a real `palisade serve`.

import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";

import {
  BadRequestError,
  Client,
  IdempotencyConflictError,
  LeaseExpiredError,
  LockHeldError,
  NotFoundError,
  RevisionMismatchError,
  SessionExpiredError,
  StaleSequenceError,
  StaleTokenError,
} from "../src/index.js";
import { startServer } from "./server.js";

const text = (bytes: Uint8Array | null): string | null => (bytes === null ? null : Buffer.from(bytes).toString());

test("put preconditions: ifAbsent, ifMatch, both refused together", async (t) => {
  const c = new Client(await startServer(t));
  const lease = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  const first = await c.put("orders", "k", "one", lease.token, { ifAbsent: true });
  assert.equal(first.replayed, false);
  await assert.rejects(c.put("orders", "k", "again", lease.token, { ifAbsent: true }), (err) => {
    assert.ok(err instanceof RevisionMismatchError, String(err));
    assert.equal(err.currentRevision, first.revision);
    return true;
  });
  const second = await c.put("orders", "k", "two", lease.token, { ifMatch: first.revision });
  assert.ok(second.revision > first.revision);
  await assert.rejects(c.put("orders", "k", "three", lease.token, { ifMatch: first.revision }), RevisionMismatchError);
  await assert.rejects(c.put("orders", "absent", "x", lease.token, { ifMatch: 1n }), (err) => {
    assert.ok(err instanceof RevisionMismatchError);
    assert.equal(err.currentRevision, null);
    return true;
  });
  await assert.rejects(c.put("orders", "k", "x", lease.token, { ifMatch: 1n, ifAbsent: true }), TypeError);
  assert.equal(text((await c.get("orders", "k")).value), "two");
});

test("an idempotency key replays the first outcome once, and refuses another request", async (t) => {
  const c = new Client(await startServer(t));
  const lease = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  const first = await c.put("orders", "k", "v", lease.token, { idempotencyKey: "op-1" });
  const again = await c.put("orders", "k", "v", lease.token, { idempotencyKey: "op-1" });
  assert.deepEqual([again.revision, again.epoch, again.replayed], [first.revision, first.epoch, true]);
  assert.equal((await c.get("orders", "k")).revision, first.revision, "applied twice");
  await assert.rejects(c.put("orders", "k", "other", lease.token, { idempotencyKey: "op-1" }), IdempotencyConflictError);
  await assert.rejects(c.put("orders", "k", "v", lease.token, { idempotencyKey: "has space" }), BadRequestError);
});

test("delete is fenced, and list answers keys in order up to its limit", async (t) => {
  const c = new Client(await startServer(t));
  const a = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  for (const key of ["b/2", "a/1", "b/1", "c"]) await c.put("orders", key, key, a.token);
  assert.deepEqual(await c.list("orders"), ["a/1", "b/1", "b/2", "c"]);
  assert.deepEqual(await c.list("orders", { prefix: "b/" }), ["b/1", "b/2"]);
  assert.deepEqual(await c.list("orders", { limit: 2 }), ["a/1", "b/1"]);
  const deleted = await c.delete("orders", "c", a.token);
  assert.equal(deleted.epoch, a.epoch);
  await assert.rejects(c.get("orders", "c"), NotFoundError);
  await assert.rejects(c.delete("orders", "c", a.token), NotFoundError);
  await c.release(a.leaseId);
  const b = await c.acquire("orders", { holder: "b", ttlMs: 10_000 });
  await c.put("orders", "a/1", "b's", b.token);
  await assert.rejects(c.delete("orders", "b/1", a.token), StaleTokenError);
  assert.deepEqual(await c.list("orders"), ["a/1", "b/1", "b/2"]);
});

test("the sequence policy: (epoch, seq) must increase within a namespace", async (t) => {
  const c = new Client(await startServer(t, { args: ["--policy", "seq-*=sequence"] }));
  const lease = await c.acquire("seq-jobs", { holder: "a", ttlMs: 10_000 });
  await c.put("seq-jobs", "k", "1", lease.token, { seq: 5n });
  assert.deepEqual(await c.highWater("seq-jobs"), { lock: "seq-jobs", highWater: lease.epoch, seq: 5n, policy: "sequence" });
  await assert.rejects(c.put("seq-jobs", "k", "2", lease.token, { seq: 5n }), (err) => {
    assert.ok(err instanceof StaleSequenceError, String(err));
    assert.deepEqual([err.highWater, err.highWaterSeq, err.epoch, err.seq], [lease.epoch, 5n, lease.epoch, 5n]);
    return true;
  });
  await c.put("seq-jobs", "k", "2", lease.token, { seq: 6n });
  assert.equal((await c.fence("seq-jobs", lease.token, { seq: 7n })).highWater, lease.epoch);
  assert.equal((await c.highWater("seq-jobs")).seq, 7n);
});

test("the barrier shuts out the previous holder; checkToken before and after", async (t) => {
  const c = new Client(await startServer(t));
  assert.deepEqual(await c.highWater("orders"), { lock: "orders", highWater: 0n, seq: 0n, policy: "epoch" });
  const a = await c.acquire("orders", { holder: "a", ttlMs: 10_000 });
  const before = await c.checkToken(a.token);
  assert.ok(before.genuine);
  assert.deepEqual(
    [before.lock, before.epoch, before.holder, before.currentEpoch, before.current, before.leaseAlive],
    ["orders", a.epoch, "a", a.epoch, true, true],
  );
  await c.release(a.leaseId);
  const b = await c.acquire("orders", { holder: "b", ttlMs: 10_000 });
  const fenced = await c.fence("orders", b.token);
  assert.deepEqual(fenced, { lock: "orders", highWater: b.epoch, epoch: b.epoch });
  assert.equal((await c.highWater("orders")).highWater, b.epoch);
  await assert.rejects(c.put("orders", "k", "late", a.token), (err) => {
    assert.ok(err instanceof StaleTokenError);
    assert.equal(err.highWater, b.epoch);
    return true;
  });
  const after = await c.checkToken(a.token);
  assert.ok(after.genuine);
  assert.deepEqual([after.currentEpoch, after.current, after.leaseAlive], [b.epoch, false, false]);
  const forged = await c.checkToken("not-a-token");
  assert.equal(forged.genuine, false);
  assert.ok(!forged.genuine && forged.reason.length > 0);
});

test("lock values, proclaim, lock-delay and the full lock status", async (t) => {
  const c = new Client(await startServer(t));
  const free = await c.lockStatus("leader");
  assert.deepEqual(
    [free.epoch, free.holder, free.leaseId, free.remainingMs, free.waiters, free.leaseEpoch, free.value, free.lockDelayMs, free.session],
    [0n, null, null, null, 0, null, null, null, null],
  );
  const lease = await c.acquire("leader", { holder: "a", ttlMs: 10_000, value: new TextEncoder().encode("http://a:80"), lockDelayMs: 250 });
  assert.equal(text(lease.value), "http://a:80");
  assert.equal(lease.lockDelayMs, 250);
  const held = await c.lockStatus("leader");
  assert.deepEqual(
    [held.lock, held.epoch, held.holder, held.leaseId, held.waiters, held.leaseEpoch, text(held.value), held.lockDelayMs, held.session],
    ["leader", lease.epoch, "a", lease.leaseId, 0, lease.epoch, "http://a:80", 250, null],
  );
  assert.ok(held.remainingMs !== null && held.remainingMs > 0 && held.remainingMs <= 10_000);
  assert.ok(held.epochBound === null || held.epochBound >= lease.epoch);
  const proclaimed = await c.proclaim(lease.leaseId, new Uint8Array([0, 1, 255]));
  assert.deepEqual([proclaimed.epoch, [...proclaimed.value!]], [lease.epoch, [0, 1, 255]]);
  assert.deepEqual([...(await c.lockStatus("leader")).value!], [0, 1, 255]);
  assert.equal((await c.proclaim(lease.leaseId, null)).value, null);
  assert.equal((await c.lockStatus("leader")).value, null);
  await c.release(lease.leaseId);
  await assert.rejects(c.proclaim(lease.leaseId, null), LeaseExpiredError);
  // A lease that expires leaves its lock ungrantable for its lock-delay, holder null.
  const short = await c.acquire("delayed", { holder: "a", ttlMs: 100, lockDelayMs: 5_000 });
  for (;;) {
    const status = await c.lockStatus("delayed");
    if (status.holder === null) break;
    await delay(20);
  }
  await assert.rejects(c.acquire("delayed", { holder: "b", ttlMs: 1_000 }), (err) => {
    assert.ok(err instanceof LockHeldError);
    assert.equal(err.holder, null);
    return true;
  });
  assert.ok(short.epoch > 0n);
});

test("locks are listed a page at a time", async (t) => {
  const c = new Client(await startServer(t));
  const names = ["jobs.a", "jobs.b", "jobs.c", "jobs.d", "jobs.e", "other"];
  for (const name of names) await c.acquire(name, { holder: "a", ttlMs: 10_000 });
  const first = await c.listLocks({ prefix: "jobs.", limit: 2 });
  assert.deepEqual(first.locks.map((s) => s.lock), ["jobs.a", "jobs.b"]);
  assert.equal(first.next, "jobs.b");
  const second = await c.listLocks({ prefix: "jobs.", limit: 2, after: first.next });
  assert.deepEqual(second.locks.map((s) => s.lock), ["jobs.c", "jobs.d"]);
  const all: string[] = [];
  for await (const status of c.locks({ prefix: "jobs.", limit: 2 })) {
    assert.equal(status.holder, "a");
    all.push(status.lock);
  }
  assert.deepEqual(all, names.slice(0, 5));
  const last = await c.listLocks({ prefix: "jobs.", after: "jobs.d" });
  assert.deepEqual([last.locks.map((s) => s.lock), last.next], [["jobs.e"], null]);
});

test("a session: leases in it, keepalive, get, close releasing them all", async (t) => {
  const c = new Client(await startServer(t));
  const session = await c.createSession({ holder: "a", ttlMs: 10_000 });
  assert.deepEqual([session.holder, session.ttlMs, session.leases], ["a", 10_000, []]);
  const x = await c.acquire("x", { holder: "a", session: session.sessionId });
  const y = await c.acquire("y", { holder: "a", session: session.sessionId });
  assert.deepEqual([x.session, x.ttlMs], [session.sessionId, 10_000]);
  assert.equal((await c.lockStatus("x")).session, session.sessionId);
  const got = await c.getSession(session.sessionId);
  assert.deepEqual(got.leases.map((l) => l.lock).sort(), ["x", "y"]);
  const renewed = await c.keepAliveSession(session.sessionId);
  assert.ok(renewed.remainingMs > 9_000);
  const closed = await c.closeSession(session.sessionId);
  assert.deepEqual(closed.leases.map((l) => l.leaseId).sort(), [x.leaseId, y.leaseId].sort());
  assert.equal((await c.lockStatus("x")).holder, null);
  await assert.rejects(c.getSession(session.sessionId), SessionExpiredError);
  await assert.rejects(c.acquire("z", { holder: "a", session: session.sessionId }), SessionExpiredError);
  await assert.rejects(c.acquire("z", { holder: "a" }), TypeError); // neither ttlMs nor session
});

test("a session guard keeps two leases past four TTLs and releases both on close", async (t) => {
  const c = new Client(await startServer(t));
  const ttlMs = 600;
  const guard = await c.holdSession({ holder: "a", ttlMs });
  const x = await c.acquire("x", { holder: "a", session: guard.id });
  const y = await c.acquire("y", { holder: "a", session: guard.id });
  const deadline = performance.now() + 4 * ttlMs;
  while (performance.now() < deadline) {
    for (const lock of ["x", "y"]) await assert.rejects(c.acquire(lock, { holder: "b", ttlMs }), LockHeldError);
    await delay(ttlMs / 4);
  }
  assert.equal(guard.lost, false);
  assert.ok(guard.safeForMs > 0 && guard.safeForMs <= ttlMs * 0.99, `${guard.safeForMs} ms`);
  assert.ok(guard.renewDeadline < guard.safeUntil);
  const closed = await guard.close();
  assert.equal(guard.safeForMs, 0); // closed: no time left to act under any of its leases
  assert.deepEqual(closed.leases.map((l) => l.leaseId).sort(), [x.leaseId, y.leaseId].sort());
  assert.equal(await guard.close(), closed); // the same outcome again
  assert.ok((await c.acquire("x", { holder: "b", ttlMs })).epoch > x.epoch);
});

test("a session guard notices its session was closed; `await using` closes it", async (t) => {
  const c = new Client(await startServer(t));
  const guard = await c.holdSession({ holder: "a", ttlMs: 600 });
  await c.closeSession(guard.id); // as an expiry would end it
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the loss was never noticed")), 10_000);
    guard.signal.addEventListener("abort", () => (clearTimeout(timer), resolve()));
  });
  assert.ok(guard.error instanceof SessionExpiredError, String(guard.error));
  assert.equal(guard.safeForMs, 0); // the session ended at the server before that answer
  await assert.rejects(guard.close(), SessionExpiredError);
  let id: string;
  {
    await using held = await c.holdSession({ holder: "a", ttlMs: 10_000 });
    id = held.id;
    await c.acquire("z", { holder: "a", session: id });
  }
  await assert.rejects(c.getSession(id), SessionExpiredError);
  assert.equal((await c.lockStatus("z")).holder, null);
});

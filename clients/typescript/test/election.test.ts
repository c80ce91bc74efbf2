// Tests of leader election (src/election.ts) against a real `palisade serve`: two
// candidates handing leadership on while an observer watches, the new leader's barrier
// refusing the old one's late write, a campaign given up by its signal or its timeout, a
// proclaimed value seen by polling, and `await using` resigning.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, LockHeldError, StaleTokenError } from "../src/index.js";
import { startServer } from "./server.js";

const text = (v: Uint8Array | null | undefined): string | null => (v == null ? null : Buffer.from(v).toString());

test("two candidates hand leadership on; the observer sees each change; the barrier shuts the old leader out", async (t) => {
  const c = new Client(await startServer(t));
  const election = c.election("leader", { ttlMs: 5_000 });
  await using observer = election.observe();
  assert.equal(await observer.changed(), null); // nobody leads yet: answered at once
  const one = await election.campaign("http://one", { candidate: "one" });
  const seenOne = await observer.changed({ timeoutMs: 10_000 });
  assert.deepEqual([seenOne?.holder, seenOne?.epoch, text(seenOne?.value)], ["one", one.term, "http://one"]);
  await one.fence();
  await one.put("config", "from one");
  // The second waits in line until the first resigns.
  const twoCampaign = election.campaign("http://two", { candidate: "two" });
  for (;;) {
    if ((await c.lockStatus("leader")).waiters === 1) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const late = one.token;
  await one.resign();
  const two = await twoCampaign;
  assert.ok(two.term > one.term);
  // Resigned and next granted may come as one change or two (a gap between reads).
  let seen = await observer.changed({ timeoutMs: 10_000 });
  if (seen === null) seen = await observer.changed({ timeoutMs: 10_000 });
  assert.deepEqual([seen?.holder, seen?.epoch, text(seen?.value)], ["two", two.term, "http://two"]);
  assert.deepEqual(await election.leader(), seen);
  const fenced = await two.fence();
  assert.equal(fenced.highWater, two.term);
  await assert.rejects(c.put("leader", "config", "late from one", late), StaleTokenError);
  // A proclaim is no event: the observer sees it by polling.
  await two.proclaim("http://two:8080");
  const proclaimed = await observer.changed({ timeoutMs: 5_000 });
  assert.equal(text(proclaimed?.value), "http://two:8080");
  await two.resign();
  assert.equal(await observer.changed({ timeoutMs: 5_000 }), null);
});

test("a campaign gives up on its signal and on its timeout; `await using` resigns", async (t) => {
  const c = new Client(await startServer(t));
  const election = c.election("leader");
  let term: bigint;
  {
    await using leader = await election.campaign("me", { candidate: "a" });
    term = leader.term;
    assert.equal(leader.signal.aborted, false);
    const controller = new AbortController();
    const waiting = election.campaign("you", { candidate: "b", signal: controller.signal });
    for (;;) {
      if ((await c.lockStatus("leader")).waiters === 1) break;
      await new Promise((r) => setTimeout(r, 10));
    }
    controller.abort(new Error("stop campaigning"));
    await assert.rejects(waiting, /stop campaigning/);
    const started = performance.now();
    await assert.rejects(election.campaign("you", { candidate: "b", timeoutMs: 300 }), LockHeldError);
    assert.ok(performance.now() - started >= 250);
  }
  const next = await election.campaign("b", { candidate: "b" });
  assert.ok(next.term > term);
  await next.resign();
});

test("an observer as an async iterator, polling only", async (t) => {
  const c = new Client(await startServer(t));
  const election = c.election("leader", { useEvents: false, pollIntervalMs: 50 });
  const observer = election.observe();
  const seen: (string | null)[] = [];
  const watching = (async () => {
    for await (const info of observer) {
      seen.push(info?.holder ?? null);
      if (seen.length === 3) await observer.close();
    }
  })();
  const deadline = Date.now() + 10_000;
  const until = async (n: number): Promise<void> => {
    while (seen.length < n) {
      assert.ok(Date.now() < deadline, `saw ${JSON.stringify(seen)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  await until(1);
  const a = await election.campaign("a", { candidate: "a" });
  await until(2);
  await a.resign();
  await watching;
  assert.deepEqual(seen, [null, "a", null]);
});

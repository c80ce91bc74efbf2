// Tests of the renewal schedule and the deadlines a holder can trust (src/renewal.ts),
// with made-up clocks (milliseconds), as the Python client's tests/test_protocol.py and
// the Rust client's paused-time tests do: renewals every third of the TTL moving both
// deadlines, the deadlines counted from the send with no more than the first TTL, quick
// retries until the renewal deadline, a lease known to have ended, and the settings
// (ClientOptions.deadlines) with the ones that cannot hold refused. No server.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, DEFAULT_DEADLINES, type Deadlines } from "../src/index.js";
import { Schedule, checkDeadlines } from "../src/renewal.js";

/** `actual` is `expected`, give or take floating-point rounding. */
function near(actual: number, expected: number): void {
  assert.ok(Math.abs(actual - expected) < 1e-6, `${actual}, not ${expected}`);
}

function deadlinesOf(s: Schedule): [number, number, number] {
  return [s.due(), s.renewBy, s.safeUntil];
}

function nearAll(actual: number[], expected: number[]): void {
  assert.equal(actual.length, expected.length);
  actual.forEach((a, i) => near(a, expected[i]!));
}

test("renewals are due every third of the TTL and move both deadlines", () => {
  const s = new Schedule(900, 100_000);
  // Due at 1/3, given up at 2/3, safe until the TTL less 1 % for clock drift.
  nearAll(deadlinesOf(s), [100_300, 100_600, 100_891]);
  s.renewed(100_300, 900);
  nearAll(deadlinesOf(s), [100_600, 100_900, 101_191]);
  assert.equal(s.givenUp(100_899), false);
  assert.equal(s.givenUp(100_900), true);
});

test("the deadlines count from the send and never trust a longer TTL", () => {
  const s = new Schedule(900, 0);
  s.renewed(300, 60_000); // a server granting more is not believed
  nearAll([s.renewBy, s.safeUntil], [900, 1_191]);
  assert.equal(s.due(), 600); // the next renewal counts from this one's send too
});

test("failed renewals retry quickly until the renewal deadline", () => {
  const s = new Schedule(1_500, 0);
  assert.equal(s.retryMs, 150); // a tenth of the TTL
  s.failed(500);
  near(s.due(), 650);
  s.failed(950);
  near(s.due(), 1_000); // never past the renewal deadline
  assert.equal(s.givenUp(999), false);
  assert.equal(s.givenUp(1_000), true);
  near(s.timeoutMs(950), 50); // a renewal sent then may take until the renewal deadline
  // Given up, but what already runs may go on until the safe deadline.
  s.end();
  near(s.safeUntil, 1_485);
  // A short TTL retries after 10 ms at least.
  assert.equal(new Schedule(50, 0).retryMs, 10);
});

test("a lease known to have ended is safe no longer", () => {
  const s = new Schedule(1_000, 0);
  s.end(400); // the server said so to a renewal sent at 400, or it was released then
  assert.equal(s.safeUntil, 400);
  s.end(700); // never moves later
  assert.equal(s.safeUntil, 400);
  s.renewed(600, 1_000); // an answer arriving afterwards counts no more
  assert.equal(s.safeUntil, 400);
  near(s.renewBy, 2_000 / 3);
});

test("the deadlines follow the settings and refuse what cannot hold", () => {
  const s = new Schedule(1_000, 0, checkDeadlines({ renewDeadline: 0.5, clockDrift: 0.1 }));
  nearAll(deadlinesOf(s), [1_000 / 3, 500, 900]);
  assert.deepEqual(checkDeadlines(), DEFAULT_DEADLINES);
  assert.deepEqual({ ...DEFAULT_DEADLINES }, { renewDeadline: 2 / 3, clockDrift: 0.01 });
  // A field left out takes its default; the client keeps what it was given.
  assert.deepEqual({ ...checkDeadlines({ clockDrift: 0.2 }) }, { renewDeadline: 2 / 3, clockDrift: 0.2 });
  const client = new Client("http://127.0.0.1:1", { deadlines: { renewDeadline: 0.99, clockDrift: 0.01 } });
  assert.deepEqual({ ...client.deadlines }, { renewDeadline: 0.99, clockDrift: 0.01 });
  assert.deepEqual(new Client("http://127.0.0.1:1").deadlines, DEFAULT_DEADLINES);
  assert.deepEqual({ ...checkDeadlines({ renewDeadline: 0.5, clockDrift: 0 }) }, { renewDeadline: 0.5, clockDrift: 0 });
  const refused: Partial<Deadlines>[] = [
    { renewDeadline: 1 / 3 }, // no renewal would ever be tried
    { renewDeadline: 0.2, clockDrift: 0 },
    { renewDeadline: 1 }, // the client would give up after the safe deadline
    { clockDrift: 0.4 }, // 2/3 is past 1 - 0.4
    { renewDeadline: 0.45, clockDrift: 0.6 }, // drift out of range
    { clockDrift: -0.1 },
    { renewDeadline: Number.NaN },
    { clockDrift: Number.NaN },
  ];
  for (const deadlines of refused) {
    assert.throws(
      () => new Client("http://127.0.0.1:1", { deadlines }),
      (err) => err instanceof RangeError && /deadlines\.(renewDeadline|clockDrift)/.test(err.message),
      JSON.stringify(deadlines),
    );
  }
});

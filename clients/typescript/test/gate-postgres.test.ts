// Tests of the PostgreSQL gate (src/gates/postgres.ts) on a real PostgreSQL the file
// starts (test/postgres.ts), each test in a fresh schema of its own with the fence table
// and a kv table the gate guards: the cases of the Go gate's postgres_test.go (the fencing
// scenario, bad tokens, racing epochs, rolled-back writes, the sequence policy, the SQL
// range, a commit after a refusal, REPEATABLE READ, an edited fence table, the migration),
// and what is particular to pg: a connection outside a transaction, and bigints read
// exactly whatever the caller's type parsers.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import pg from "pg";

import {
  InvalidTokenError,
  MissingTokenError,
  PalisadeError,
  StaleSequenceError,
  StaleTokenError,
  StorageFailedError,
  WriteConflictError,
  WrongLockError,
} from "../src/errors.js";
import { MIGRATION, UnsafeDatabase, admit, admitSequenced, checkSettings, highWater, migrate, preflight } from "../src/gates/postgres.js";
import { BadSignatureError, MalformedTokenError, UnknownKeyError, Verifier } from "../src/token.js";
import { type Issuer, newIssuer } from "./issuer.js";
import { fileCluster, schemaName } from "./postgres.js";
import { PACKAGE, REPO } from "./server.js";

const LOCK = "orders";
const OTHER_LOCK = "invoices";
const UPSERT = "INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v";

const cluster = fileCluster();

const FAIL_AFTER = new Error("the caller's own failure after the admit");

interface RunOptions {
  /** The sequence policy, with this seq. */
  seq?: bigint;
  /** A write of the caller's own before the admit. */
  ownKey?: string;
  /** Fail after the admit and the write, before COMMIT. */
  failAfter?: boolean;
}

/** A fresh schema with the fence table and kv, a pool whose connections use it, and an
 * issuer the gate's verifier trusts. */
class Fixture {
  readonly issuer: Issuer = newIssuer();
  readonly verifier: Verifier;

  private constructor(
    readonly pool: pg.Pool,
    readonly schema: string,
  ) {
    this.verifier = new Verifier(this.issuer.ring(), { cacheSize: 64 });
  }

  static async create(t: TestContext, poolConfig: pg.PoolConfig = {}): Promise<Fixture> {
    const schema = schemaName("t");
    const admin = new pg.Client(cluster().config());
    await admin.connect();
    await admin.query(`CREATE SCHEMA ${schema}`);
    await admin.end();
    const pool = new pg.Pool({ ...cluster().config(), options: `-csearch_path=${schema}`, max: 10, ...poolConfig });
    pool.on("error", () => {}); // an idle client's error; the test's own queries report theirs
    t.after(() => pool.end());
    await migrate(pool);
    await migrate(pool); // idempotent
    await pool.query("CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL)");
    return new Fixture(pool, schema);
  }

  /** One guarded transaction: an own write first when asked, the admit, the write, the
   * commit (or a failure of the caller's own after the write). */
  async run(token: string, lock: string, key: string, value: string, options: RunOptions = {}): Promise<void> {
    await this.withClient(async (client) => {
      try {
        await client.query("BEGIN");
        if (options.ownKey !== undefined) await client.query(UPSERT, [options.ownKey, "own"]);
        if (options.seq !== undefined) await admitSequenced(client, this.verifier, token, lock, options.seq);
        else await admit(client, this.verifier, token, lock);
        await client.query(UPSERT, [key, value]);
        if (options.failAfter === true) throw FAIL_AFTER;
        await client.query("COMMIT");
      } catch (err) {
        await client.query("ROLLBACK").catch(() => {});
        throw err;
      }
    });
  }

  /** `body` with a connection of the pool, given back to the pool however `body` ends. */
  async withClient(body: (client: pg.PoolClient) => Promise<void>): Promise<void> {
    const client = await this.pool.connect();
    try {
      await body(client);
    } finally {
      client.release();
    }
  }

  /** `body` in a transaction `begin` opens on a connection of the pool, rolled back at the
   * end (when `body` did not commit it). */
  async inTransaction(begin: string, body: (client: pg.PoolClient) => Promise<void>): Promise<void> {
    await this.withClient(async (client) => {
      try {
        await client.query(begin);
        await body(client);
      } finally {
        await client.query("ROLLBACK").catch(() => {});
      }
    });
  }

  write(token: string, lock: string, key: string, value: string): Promise<void> {
    return this.run(token, lock, key, value);
  }

  /** Retries write_conflict, as a caller should. */
  async writeRetrying(token: string, lock: string, key: string, value: string): Promise<void> {
    for (;;) {
      try {
        return await this.write(token, lock, key, value);
      } catch (err) {
        if (!(err instanceof WriteConflictError)) throw err;
      }
    }
  }

  async read(key: string): Promise<string> {
    const result = await this.pool.query<{ v: string }>("SELECT v FROM kv WHERE k = $1", [key]);
    return result.rows[0]?.v ?? "<absent>";
  }

  async mark(lock: string): Promise<bigint> {
    return (await highWater(this.pool, lock)).epoch;
  }

  async state(key: string, value: string, mark: bigint): Promise<void> {
    assert.equal(await this.read(key), value, `value at ${key}`);
    assert.equal(await this.mark(LOCK), mark, "mark");
  }
}

/** The rejection of `p`; a failure (saying `what`) if it resolves. */
async function refusal(p: Promise<unknown>, what = "admitted, want a refusal"): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  assert.fail(what);
}

function code(err: unknown): string {
  return err instanceof PalisadeError ? err.code : `<${String(err)}>`;
}

function assertStale(err: unknown, highWater: bigint, epoch: bigint): void {
  assert.ok(err instanceof StaleTokenError, `want stale_token, got ${String(err)}`);
  assert.deepEqual([err.code, err.highWater, err.epoch], ["stale_token", highWater, epoch]);
}

test("the fencing scenario, step by step", async (t) => {
  const f = await Fixture.create(t);
  const key = "fencing-py";
  const old = f.issuer.token(LOCK, 1n);
  const next = f.issuer.token(LOCK, 2n);
  // The old leader writes first and is admitted: the resource has not seen 2 (S10).
  await f.write(old, LOCK, key, "old-leader-1");
  await f.state(key, "old-leader-1", 1n);
  await f.write(next, LOCK, key, "new-leader");
  await f.state(key, "new-leader", 2n);
  // The old leader again: refused, value and mark unchanged.
  assertStale(await refusal(f.write(old, LOCK, key, "old-leader-late")), 2n, 1n);
  await f.state(key, "new-leader", 2n);
  // The new leader again with the same epoch: admitted (S8).
  await f.write(next, LOCK, key, "new-leader-again");
  // Missing and not-a-token are refused (S12), nothing changes.
  for (const missing of ["", "  ", "\u00a0\t"]) {
    const err = await refusal(f.write(missing, LOCK, key, "missing"));
    assert.ok(err instanceof MissingTokenError && err.code === "missing_token", JSON.stringify(missing));
  }
  for (const bad of ["2", "true"]) {
    const err = await refusal(f.write(bad, LOCK, key, bad));
    assert.ok(err instanceof InvalidTokenError && err.code === "invalid_token", bad);
    assert.ok(err.cause instanceof MalformedTokenError, bad);
  }
  await f.state(key, "new-leader-again", 2n);
  // A third acquisition: epoch 3 admitted, epoch 2 now refused.
  await f.write(f.issuer.token(LOCK, 3n), LOCK, key, "newest");
  assertStale(await refusal(f.write(next, LOCK, key, "too-late")), 3n, 2n);
  await f.state(key, "newest", 3n);
});

test("a barrier admit with no data, committed on its own, shuts out older holders before any write", async (t) => {
  const f = await Fixture.create(t);
  await f.write(f.issuer.token(LOCK, 1n), LOCK, "k", "v1");
  await f.withClient(async (client) => {
    await client.query("BEGIN");
    const admitted = await admit(client, f.verifier, f.issuer.token(LOCK, 2n), LOCK);
    assert.deepEqual([admitted.previous.epoch, admitted.highWater.epoch], [1n, 2n]);
    await client.query("COMMIT");
  });
  assertStale(await refusal(f.write(f.issuer.token(LOCK, 1n), LOCK, "k", "late")), 2n, 1n);
  await f.state("k", "v1", 2n);
});

test("malformed, forged, foreign and other-lock tokens change nothing", async (t) => {
  const f = await Fixture.create(t);
  const key = "bad-tokens";
  await f.write(f.issuer.token(LOCK, 1n), LOCK, key, "genuine");
  const genuine = f.issuer.token(LOCK, 99n);
  const at = genuine.length - 10;
  const forged = genuine.slice(0, at) + (genuine[at] === "A" ? "B" : "A") + genuine.slice(at + 1);
  for (const [name, token, cause] of [
    ["garbage", "pal1.garbage.signature", MalformedTokenError],
    ["forged signature", forged, BadSignatureError],
    ["unknown key", newIssuer().token(LOCK, 1000n), UnknownKeyError],
  ] as const) {
    const err = await refusal(f.write(token, LOCK, key, name));
    assert.ok(err instanceof InvalidTokenError && err.code === "invalid_token", `${name}: ${String(err)}`);
    assert.ok(err.cause instanceof cause, `${name}: ${String(err.cause)}`);
  }
  const wrong = await refusal(f.write(f.issuer.token(OTHER_LOCK, 1_000_000n), LOCK, key, "other-lock"));
  assert.ok(wrong instanceof WrongLockError, String(wrong));
  assert.deepEqual([wrong.code, wrong.tokenLock], ["wrong_lock", OTHER_LOCK]);
  await f.state(key, "genuine", 1n);
  assert.equal(await f.mark(OTHER_LOCK), 0n, "the other lock got a mark");
});

// Two holders race, each on its own connection, over many rounds, each on a fresh lock
// (so the first admit, which creates the mark, races too). Afterwards the mark is the
// larger epoch, its holder's last write is the value, and no write of the smaller epoch
// was admitted after one of the larger epoch had committed.
test("two epochs racing over twelve fresh locks", async (t) => {
  const f = await Fixture.create(t);
  const rounds = 12;
  const writes = 6;
  let landed = 0;
  for (let r = 0; r < rounds; r++) {
    const lock = `race-${r}`;
    const key = `${lock}-key`;
    const old = f.issuer.token(lock, 1n);
    const next = f.issuer.token(lock, 2n);
    let newCommitted = false;
    const newer = async (): Promise<void> => {
      for (let i = 0; i < writes; i++) {
        await f.writeRetrying(next, lock, key, `2:${i}`);
        newCommitted = true;
      }
    };
    const older = async (): Promise<void> => {
      for (let i = 0; i < writes; i++) {
        const afterNew = newCommitted;
        try {
          await f.writeRetrying(old, lock, key, `1:${i}`);
        } catch (err) {
          assertStale(err, 2n, 1n);
          continue;
        }
        assert.ok(!afterNew, "epoch 1 admitted after epoch 2 committed");
        landed++;
      }
    };
    await Promise.all([newer(), older()]);
    assert.equal(await f.mark(lock), 2n, lock);
    assert.equal(await f.read(key), `2:${writes - 1}`, lock);
  }
  // Not asserted (timing decides), but reported: 0 would mean the race never happened.
  t.diagnostic(`${landed} of ${rounds * writes} epoch-1 writes landed before epoch 2`);
});

test("a refused admit commits nothing, not even the caller's own earlier writes", async (t) => {
  const f = await Fixture.create(t);
  const key = "own-writes";
  await f.run(f.issuer.token(LOCK, 2n), LOCK, key, "v2", { ownKey: "audit-admitted" });
  assert.equal(await f.read("audit-admitted"), "own", "the admitted transaction's own write is missing");
  assertStale(await refusal(f.run(f.issuer.token(LOCK, 1n), LOCK, key, "v1", { ownKey: "audit-stale" })), 2n, 1n);
  for (const [token, ownKey] of [
    ["", "audit-missing"],
    ["true", "audit-malformed"],
    [f.issuer.token(OTHER_LOCK, 9n), "audit-other-lock"],
  ] as const) {
    await refusal(f.run(token, LOCK, key, "bad", { ownKey }));
    assert.equal(await f.read(ownKey), "<absent>", `${ownKey} committed`);
  }
  assert.equal(await f.read("audit-stale"), "<absent>", "the stale transaction's own write committed");
  await f.state(key, "v2", 2n);
});

test("an admitted epoch whose transaction failed later leaves no trace", async (t) => {
  const f = await Fixture.create(t);
  const key = "fail-after";
  await f.write(f.issuer.token(LOCK, 2n), LOCK, key, "v2");
  assert.equal(await refusal(f.run(f.issuer.token(LOCK, 5n), LOCK, key, "v5", { failAfter: true })), FAIL_AFTER);
  await f.state(key, "v2", 2n);
  await f.write(f.issuer.token(LOCK, 2n), LOCK, key, "v2-again");
  await f.state(key, "v2-again", 2n);
});

test("the sequence policy refuses a replayed or reordered operation; a new epoch restarts", async (t) => {
  const f = await Fixture.create(t);
  const key = "seq-key";
  const lock = "sequenced";
  const t1 = f.issuer.token(lock, 1n);
  for (const seq of [1n, 5n]) await f.run(t1, lock, key, String(seq), { seq });
  assert.deepEqual(await highWater(f.pool, lock), { epoch: 1n, seq: 5n });
  for (const seq of [5n, 4n]) {
    const replay = await refusal(f.run(t1, lock, key, "replay", { seq }));
    assert.ok(replay instanceof StaleSequenceError, String(replay));
    assert.deepEqual(
      [replay.code, replay.highWater, replay.highWaterSeq, replay.epoch, replay.seq],
      ["stale_sequence", 1n, 5n, 1n, seq],
    );
  }
  await f.run(f.issuer.token(lock, 2n), lock, key, "c", { seq: 1n });
  assertStale(await refusal(f.run(t1, lock, key, "d", { seq: 99n })), 2n, 1n);
  assert.equal(await f.read(key), "c");
  assert.deepEqual(await highWater(f.pool, lock), { epoch: 2n, seq: 1n });
  // A sequence number that is not one is refused too, and poisons like any refusal.
  const bad = await refusal(f.run(f.issuer.token(lock, 3n), lock, key, "e", { seq: -1n, ownKey: "own-bad-seq" }));
  assert.ok(bad instanceof RangeError, String(bad));
  assert.equal(await f.read("own-bad-seq"), "<absent>");
});

test("an epoch past 2^63-1 is refused as storage_failed, never wrapped; 2^63-1 is read back exactly", async (t) => {
  const f = await Fixture.create(t);
  const err = await refusal(f.write(f.issuer.token(LOCK, 1n << 63n), LOCK, "k", "v"));
  assert.ok(err instanceof StorageFailedError && err.code === "storage_failed", String(err));
  assert.equal(await f.read("k"), "<absent>");
  assert.equal(await f.mark(LOCK), 0n);
  const max = (1n << 63n) - 1n;
  await f.write(f.issuer.token(LOCK, max), LOCK, "k", "max");
  assert.equal(await f.mark(LOCK), max);
});

test("a commit after a refusal commits nothing: the refusal aborted the transaction inside PostgreSQL", async (t) => {
  const f = await Fixture.create(t);
  await f.write(f.issuer.token(LOCK, 2n), LOCK, "k", "v2");
  await f.inTransaction("BEGIN", async (client) => {
    await client.query(UPSERT, ["careless", "own write"]);
    assertStale(await refusal(admit(client, f.verifier, f.issuer.token(LOCK, 1n), LOCK)), 2n, 1n);
    // A careless caller carries on.
    const next = await refusal(client.query(UPSERT, ["k", "stale write"]), "a statement after the refusal succeeded");
    assert.equal((next as { code?: string }).code, "25P02", `a statement after the refusal: ${String(next)}`); // in_failed_sql_transaction
    const commit = await client.query("COMMIT");
    assert.equal(commit.command, "ROLLBACK", "PostgreSQL turned the COMMIT into a rollback");
  });
  assert.equal(await f.read("careless"), "<absent>");
  assert.equal(await f.read("k"), "v2");
});

test("under REPEATABLE READ, a mark changed after the snapshot is write_conflict", async (t) => {
  const f = await Fixture.create(t);
  await f.write(f.issuer.token(LOCK, 1n), LOCK, "k", "v1");
  await f.inTransaction("BEGIN ISOLATION LEVEL REPEATABLE READ", async (client) => {
    await client.query("SELECT count(*) FROM kv"); // takes the snapshot
    await f.write(f.issuer.token(LOCK, 2n), LOCK, "k", "v2");
    const err = await refusal(admit(client, f.verifier, f.issuer.token(LOCK, 3n), LOCK));
    assert.ok(err instanceof WriteConflictError && err.code === "write_conflict", String(err));
    assert.equal((err.cause as { code?: string }).code, "40001", "the database's own error is the cause");
  });
  assert.equal(await f.mark(LOCK), 2n);
});

test("a fence row edited by hand to a negative mark is refused, not guessed at", async (t) => {
  const f = await Fixture.create(t);
  await f.write(f.issuer.token(LOCK, 3n), LOCK, "k", "v3");
  await f.pool.query("ALTER TABLE palisade_fence DROP CONSTRAINT palisade_fence_epoch_check");
  await f.pool.query("UPDATE palisade_fence SET epoch = -1 WHERE lock_name = $1", [LOCK]);
  const err = await refusal(f.write(f.issuer.token(LOCK, 4n), LOCK, "k", "v4"));
  assert.equal(code(err), "storage_failed");
  assert.match((err as Error).message, /unreadable fence record/);
  assert.equal(await f.read("k"), "v3", "a write went through an unreadable mark");
  assert.equal(code(await refusal(highWater(f.pool, LOCK))), "storage_failed");
});

test("a connection outside a transaction is refused before anything is written", async (t) => {
  const f = await Fixture.create(t);
  await f.withClient(async (client) => {
    const err = await refusal(admit(client, f.verifier, f.issuer.token(LOCK, 1n), LOCK));
    assert.ok(!(err instanceof PalisadeError) && err instanceof Error, String(err));
    assert.match(err.message, /must run inside a transaction/);
    assert.equal(client.getTransactionStatus(), "I");
  });
  assert.equal(await f.mark(LOCK), 0n);
  assert.equal((await f.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM palisade_fence")).rows[0]?.n, 0);
});

test("bigint columns are read exactly whatever the caller's type parsers, which the gate leaves alone", async (t) => {
  // The caller's pool reads bigint columns as JavaScript numbers, losing precision.
  const lossy = (oid: number, format?: "text" | "binary"): unknown =>
    oid === 20 ? (text: string) => Number(text) : pg.types.getTypeParser(oid, format);
  const f = await Fixture.create(t, { types: { getTypeParser: lossy as typeof pg.types.getTypeParser } });
  const epoch = (1n << 62n) + 1n; // not a double
  await f.write(f.issuer.token(LOCK, epoch), LOCK, "k", "v");
  assert.equal(await f.mark(LOCK), epoch);
  assert.equal((await f.pool.query<{ epoch: number }>("SELECT epoch FROM palisade_fence")).rows[0]?.epoch, Number(epoch), "the caller's parser is still used");
  assertStale(await refusal(f.write(f.issuer.token(LOCK, epoch - 1n), LOCK, "k", "late")), epoch, epoch - 1n);
  assert.equal((pg.types.getTypeParser(20, "text") as (text: string) => unknown)("9223372036854775807"), "9223372036854775807", "pg's global parser untouched");
});

test("the migration is the Rust adapters' own, byte for byte", () => {
  const rust = readFileSync(join(REPO, "crates", "adapters", "migrations", "postgres.sql"));
  assert.ok(Buffer.from(MIGRATION, "utf8").equals(rust), "the shipped postgres.sql differs from crates/adapters/migrations/postgres.sql");
  const shipped = join(PACKAGE, "dist", "src", "gates", "postgres.sql");
  assert.ok(readFileSync(shipped).equals(rust), `${shipped} differs from crates/adapters/migrations/postgres.sql`);
});

test("the preflight (and migrate) refuses synchronous_commit = off, naming it; accepted again when on", async (t) => {
  const f = await Fixture.create(t);
  await f.withClient(async (client) => {
    await preflight(client);
    await client.query("SET synchronous_commit = off");
    for (const [step, run] of [["preflight", () => preflight(client)], ["migrate", () => migrate(client)]] as const) {
      const err = await refusal(run(), `${step} accepted an unsafe database`);
      assert.ok(err instanceof StorageFailedError, `${step}: ${String(err)}`);
      assert.equal(err.code, "storage_failed");
      assert.ok(err.cause instanceof UnsafeDatabase, `${step}: cause ${String(err.cause)}`);
      assert.deepEqual(err.cause.settings, [
        { name: "synchronous_commit", value: "off", needs: "on (or local without standbys)" },
      ]);
    }
    await client.query("SET synchronous_commit = on");
    await migrate(client);
  });
});

test("the preflight's rule names each unsafe setting, as the other gates' rule does", () => {
  const names = (...args: Parameters<typeof checkSettings>): string[] =>
    checkSettings(...args)?.settings.map((s) => s.name) ?? [];
  assert.deepEqual(names("on", "on", "on", "", 0), []);
  assert.deepEqual(names("off", "on", "on", "", 0), ["fsync"]);
  assert.deepEqual(names("on", "on", "off", "", 0), ["full_page_writes"]);
  assert.deepEqual(names("on", "off", "on", "", 0), ["synchronous_commit"]);
  assert.deepEqual(names("on", "local", "on", "", 0), []);
  assert.deepEqual(names("on", "local", "on", "standby1", 1), ["synchronous_commit"]);
  assert.deepEqual(names("on", "remote_write", "on", "", 0), []);
  assert.deepEqual(names("on", "remote_apply", "on", "", 0), []);
  assert.deepEqual(names("on", "on", "on", "", 2), ["synchronous_standby_names"]);
  assert.deepEqual(names("on", "on", "on", "FIRST 1 (a, b)", 2), []);
  assert.deepEqual(names("off", "off", "off", "", 1), [
    "fsync",
    "full_page_writes",
    "synchronous_commit",
    "synchronous_standby_names",
  ]);
});

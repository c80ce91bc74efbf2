// The gate inside a PostgreSQL transaction (node-postgres, `pg`), sharing palisade_fence
// and its rules with the Rust palisade_adapters::postgres and the Python, Go and Java
// gates, so that writers in every language can guard one database together.
// @palisade/client/gates/postgres.
//
//   await migrate(pool);   // at deploy time: checks the settings, creates the table
//   await preflight(pool); // at every start of the application
//   const client = await pool.connect();
//   try {
//     await client.query("BEGIN");
//     await admit(client, verifier, token, "orders"); // StaleTokenError when a newer holder wrote first
//     await client.query("UPDATE orders SET state = 'shipped' WHERE id = $1", [42]);
//     await client.query("COMMIT");
//   } catch (err) {
//     await client.query("ROLLBACK");
//     throw err;
//   } finally {
//     client.release();
//   }
//
// How it serialises: admit locks the lock's row of palisade_fence with SELECT ... FOR
// UPDATE (creating it first with INSERT ... ON CONFLICT DO NOTHING when the database has
// never seen the lock). A second transaction admitting for the same lock, in any
// language, waits on that row lock until the first commits or rolls back, then reads the
// mark it left. Admits for different locks do not wait on each other. Under REPEATABLE
// READ or SERIALIZABLE, PostgreSQL refuses to lock a row changed after the snapshot was
// taken: that is WriteConflictError; roll back and retry.
//
// A refusal poisons the transaction: when admit rejects it has also raised an error
// inside PostgreSQL, which marks the transaction aborted, so every later statement fails
// and COMMIT becomes a rollback. Writes the caller made before admit can never commit
// alongside a refused token, even if the caller ignores the error. (A savepoint rolled
// back to after the refusal would clear that state: do not admit inside a savepoint you
// then roll back to and carry on.)
//
// The client must be inside a transaction the caller began (`await client.query("BEGIN")`):
// on a connection outside one, each statement would commit on its own, so admit refuses
// with an Error (pg's client reports its transaction status since 8.21; the native
// client does not, and is not checked). Bigint columns are read as their text with this
// module's own type parsers, per query: the caller's pg type parsers are neither used nor
// changed. This module imports only pg's types: nothing of pg is loaded at run time.

import { readFileSync } from "node:fs";
import type { ClientBase, CustomTypesConfig, Pool, QueryResult } from "pg";

import { type Admitted, type HighWater, NO_HIGH_WATER, type Policy, decide, fromSql, storageFailed, verifyForLock, writeConflict } from "../gate.js";
import type { Verifier } from "../token.js";

export type { Admitted, HighWater, Policy } from "../gate.js";

/** The SQL that creates the fence table: crates/adapters/migrations/postgres.sql itself,
 * copied next to the built module by `npm run build` (a test checks the shipped bytes). */
export const MIGRATION: string = readFileSync(new URL("./postgres.sql", import.meta.url), "utf8");

const SELECT_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = $1";
const LOCK_MARK = `${SELECT_MARK} FOR UPDATE`;
const CREATE_MARK =
  "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES ($1, 0, 0) ON CONFLICT (lock_name) DO NOTHING";
const STORE_MARK = "UPDATE palisade_fence SET epoch = $1, seq = $2, updated_at = now() WHERE lock_name = $3";
/** Raising an error is how a refusal is made final: PostgreSQL will not commit a
 * transaction that saw one. */
const POISON = "DO $$ BEGIN RAISE EXCEPTION 'palisade: fenced operation refused; roll back'; END $$";
/** serialization_failure, deadlock_detected, lock_not_available: lost races. */
const RETRY = new Set(["40001", "40P01", "55P03"]);
/** Every column as the text PostgreSQL sent, whatever parsers the caller set globally. */
const AS_TEXT: CustomTypesConfig = { getTypeParser: () => (text: string) => text };

/** What runs a statement: a pg Client, a PoolClient, or a Pool. */
export type Queryable = ClientBase | Pool;

/** What {@link checkSettings} takes, in its argument order. */
const SETTINGS =
  "SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('full_page_writes'), " +
  "current_setting('synchronous_standby_names'), (SELECT count(*) FROM pg_stat_replication)";

/** A setting that breaks the gate's durability: its name, its value now, what it needs. */
export interface UnsafeSetting {
  readonly name: string;
  readonly value: string;
  readonly needs: string;
}

/** Why the database cannot keep the gate's promise (S6): the `cause` of the
 * storage_failed error that {@link preflight} and {@link migrate} throw; `settings` names
 * each unsafe setting. */
export class UnsafeDatabase extends Error {
  constructor(
    message: string,
    readonly settings: readonly UnsafeSetting[],
  ) {
    super(message);
    this.name = "UnsafeDatabase";
  }
}

/** The rule (the Rust gate's, crates/adapters/src/preflight.rs, and the Python, Go and
 * Java gates'): fsync and full_page_writes on; synchronous_commit not off, and not local
 * while synchronous standbys are configured; streaming replicas only with
 * synchronous_standby_names (a failover to an asynchronous standby can lose marks). The
 * refusal, or undefined. */
export function checkSettings(
  fsync: string,
  synchronousCommit: string,
  fullPageWrites: string,
  standbyNames: string,
  replicas: number,
): UnsafeDatabase | undefined {
  const bad: UnsafeSetting[] = [];
  if (fsync !== "on") bad.push({ name: "fsync", value: fsync, needs: "on" });
  if (fullPageWrites !== "on") bad.push({ name: "full_page_writes", value: fullPageWrites, needs: "on" });
  const standbys = standbyNames.trim() !== "";
  if (synchronousCommit === "local") {
    if (standbys) {
      bad.push({
        name: "synchronous_commit",
        value: synchronousCommit,
        needs: "on, remote_write or remote_apply while synchronous standbys are configured",
      });
    }
  } else if (!["on", "remote_apply", "remote_write"].includes(synchronousCommit)) {
    bad.push({ name: "synchronous_commit", value: synchronousCommit, needs: "on (or local without standbys)" });
  }
  if (replicas > 0 && !standbys) {
    bad.push({
      name: "synchronous_standby_names",
      value: standbyNames,
      needs: "the streaming replicas named (they are asynchronous: a failover to one can lose marks)",
    });
  }
  if (bad.length === 0) return undefined;
  const parts = bad.map((s) => `${s.name} is ${JSON.stringify(s.value)}, needs ${s.needs}`).join("; ");
  return new UnsafeDatabase(
    `PostgreSQL cannot keep fenced writes durable: ${parts} (docs/protecting-your-database.md, "Preflight"; ` +
      "migrateUnchecked skips this check, for tests only)",
    bad,
  );
}

/** Checks that the database can keep a mark durable ({@link checkSettings}): a
 * storage_failed error whose `cause` is an {@link UnsafeDatabase} naming every setting
 * that breaks it. Run it when the application starts; {@link migrate} runs it too. */
export async function preflight(db: Queryable): Promise<void> {
  let result: QueryResult<string[]>;
  try {
    result = await db.query({ text: SETTINGS, rowMode: "array", types: AS_TEXT });
  } catch (err) {
    throw dbError(err);
  }
  const row = result.rows[0];
  if (row === undefined) throw storageFailed("PostgreSQL answered no row to the settings query");
  const unsafe = checkSettings(row[0]!, row[1]!, row[2]!, row[3]!, Number(row[4]!));
  if (unsafe !== undefined) throw storageFailed(unsafe.message, unsafe);
}

/** Checks the database's settings ({@link preflight}), then creates the fence table if it
 * does not exist (idempotent). On a client outside a transaction it commits at once;
 * inside one, with it. Run it once at deploy time, not concurrently from many processes.
 * A failure is storage_failed (write_conflict for a lost race). */
export async function migrate(db: Queryable): Promise<void> {
  await preflight(db);
  await migrateUnchecked(db);
}

/** {@link migrate} without the settings check: for a database whose durability is
 * ensured some other way, and for tests on a throwaway database. */
export async function migrateUnchecked(db: Queryable): Promise<void> {
  try {
    await db.query(MIGRATION);
  } catch (err) {
    throw dbError(err);
  }
}

/** Admits `token` for `lock` inside `client`'s transaction under the epoch policy: an
 * equal or larger epoch passes and raises the mark, a smaller one is refused with
 * StaleTokenError. On success the new mark is part of the transaction and commits or
 * rolls back with the caller's writes; on any rejection the transaction is aborted and
 * must be rolled back. */
export function admit(client: ClientBase, verifier: Verifier, token: string | null | undefined, lock: string): Promise<Admitted> {
  return run(client, () => steps(client, verifier, token, lock, "epoch", 0n));
}

/** {@link admit} under the sequence policy: (epoch, `seq`) must strictly exceed the mark,
 * so a delayed or replayed operation of the current holder is refused too
 * (StaleSequenceError). `seq` is a bigint from 0 to 2^64 − 1 (a RangeError otherwise;
 * past 2^63 − 1, storage_failed). Use one policy per lock: an epoch-policy admit resets
 * the stored sequence to 0. */
export function admitSequenced(
  client: ClientBase,
  verifier: Verifier,
  token: string | null | undefined,
  lock: string,
  seq: bigint,
): Promise<Admitted> {
  return run(client, () => steps(client, verifier, token, lock, "sequence", seq));
}

/** The lock's committed mark as `db` sees it ((0, 0) if never admitted). For inspection
 * only: deciding on it outside the transaction that writes would re-open the
 * check-then-write race (S6). */
export async function highWater(db: Queryable, lock: string): Promise<HighWater> {
  let result: QueryResult<string[]>;
  try {
    result = await db.query({ text: SELECT_MARK, values: [lock], rowMode: "array", types: AS_TEXT });
  } catch (err) {
    throw dbError(err);
  }
  const row = result.rows[0];
  return row === undefined ? NO_HIGH_WATER : fromSql(row[0]!, row[1]!);
}

/** The outcome of `admission` (the steps below), with the transaction aborted on any failure. */
async function run(client: ClientBase, admission: () => Promise<Admitted>): Promise<Admitted> {
  try {
    return await admission();
  } catch (err) {
    // Any refusal, or a failure of the gate's own statements, aborts the transaction. The
    // poison's own error is the point; if the connection is gone, the transaction cannot
    // commit anyway.
    await client.query(POISON).catch(() => {});
    throw err;
  }
}

/** Verify, lock the mark's row (creating it first if missing), decide, store. */
async function steps(
  client: ClientBase,
  verifier: Verifier,
  token: string | null | undefined,
  lock: string,
  policy: Policy,
  seq: bigint,
): Promise<Admitted> {
  const claims = verifyForLock(verifier, token, lock);
  if (policy === "sequence" && (typeof seq !== "bigint" || seq < 0n || seq >= 1n << 64n)) {
    throw new RangeError(`the sequence policy needs a sequence number (a bigint) from 0 to 2^64-1, not ${String(seq)}`);
  }
  let current = await lockRow(client, lock);
  requireTransaction(client);
  if (current === undefined) {
    await query(client, CREATE_MARK, [lock]);
    current = await lockRow(client, lock);
    if (current === undefined) throw storageFailed(`the mark of ${JSON.stringify(lock)} vanished after it was created`);
  }
  const next = decide(current, policy, claims.epoch, seq);
  await query(client, STORE_MARK, [next.epoch.toString(), next.seq.toString(), lock]);
  return Object.freeze({ claims, previous: current, highWater: next });
}

/** The locked mark, or undefined when the lock has no row yet. */
async function lockRow(client: ClientBase, lock: string): Promise<HighWater | undefined> {
  const result = await query(client, LOCK_MARK, [lock]);
  const row = result.rows[0];
  return row === undefined ? undefined : fromSql(row[0]!, row[1]!);
}

/** After the gate's first statement, the status PostgreSQL reported with it: idle means
 * that statement ran (and committed) on its own, outside any transaction. */
function requireTransaction(client: ClientBase): void {
  const status = typeof client.getTransactionStatus === "function" ? client.getTransactionStatus() : null;
  if (status === "I") {
    throw new Error(
      "admit must run inside a transaction (await client.query(\"BEGIN\") first): " +
        "outside one, each statement would commit on its own",
    );
  }
}

async function query(client: ClientBase, text: string, values: string[]): Promise<QueryResult<string[]>> {
  try {
    return await client.query({ text, values, rowMode: "array", types: AS_TEXT });
  } catch (err) {
    throw dbError(err);
  }
}

/** Lost races are write_conflict (retry); anything else is storage_failed. pg's
 * DatabaseError is recognised by its SQLSTATE `code`, not its class, so that another copy
 * of pg than this package would load is read the same. */
function dbError(err: unknown): Error {
  const code = typeof err === "object" && err !== null ? (err as { code?: unknown }).code : undefined;
  if (typeof code === "string" && RETRY.has(code)) return writeConflict(err);
  return storageFailed(`PostgreSQL failed: ${err instanceof Error ? err.message : String(err)}`, err);
}

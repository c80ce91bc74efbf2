// Tests of the command-line writer (test/fenced-writer.ts, run as the built
// dist/test/fenced-writer.js) on a real PostgreSQL the file starts: every outcome line of
// the contract scripts/cross-language-test relies on, the exit status 2 on usage and
// database errors (storage_failed included), and the libpq conninfo it reads.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import pg from "pg";

import { migrate } from "../src/gates/postgres.js";
import { parseConninfo, pgConfig } from "./fenced-writer.js";
import { newIssuer } from "./issuer.js";
import { fileCluster, schemaName } from "./postgres.js";

const WRITER = fileURLToPath(new URL("./fenced-writer.js", import.meta.url));
const LOCK = "orders";

const cluster = fileCluster();

/** A fresh schema with the fence table and `table` (key, value); its conninfo. */
async function schema(table = "kv"): Promise<string> {
  return (await namedSchema(table)).conninfo;
}

async function namedSchema(table: string): Promise<{ name: string; conninfo: string }> {
  const name = schemaName("w");
  const client = new pg.Client({ ...cluster().config(), options: `-csearch_path=${name}` });
  await client.connect();
  try {
    await client.query(`CREATE SCHEMA ${name}`);
    await migrate(client);
    await client.query(`CREATE TABLE ${client.escapeIdentifier(table)} (key text PRIMARY KEY, value text NOT NULL)`);
  } finally {
    await client.end();
  }
  return { name, conninfo: cluster().conninfo(`options=-csearch_path=${name}`) };
}

interface Outcome {
  status: number;
  stdout: string;
  stderr: string;
}

function writer(args: string[]): Promise<Outcome> {
  return new Promise((resolve) => {
    execFile(process.execPath, [WRITER, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      const status = err === null ? 0 : typeof err.code === "number" ? err.code : -1;
      resolve({ status, stdout, stderr });
    });
  });
}

function writeArgs(conninfo: string, keys: string, token: string, value: string, extra: string[] = []): string[] {
  return ["write", "--db", `postgres:${conninfo}`, "--table", "kv", "--public-key", keys, "--lock", LOCK, "--key", "shared", "--value", value, "--token", token, ...extra];
}

async function line(args: string[]): Promise<string> {
  const done = await writer(args);
  assert.equal(done.status, 0, `exit ${done.status}: ${done.stderr}`);
  assert.match(done.stdout, /^[^\n]*\n$/, "exactly one line");
  return done.stdout.trimEnd();
}

async function value(conninfo: string, table = "kv"): Promise<string | undefined> {
  const client = new pg.Client(pgConfig(conninfo));
  await client.connect();
  try {
    const result = await client.query<{ value: string }>(`SELECT value FROM ${client.escapeIdentifier(table)} WHERE key = 'shared'`);
    return result.rows[0]?.value;
  } finally {
    await client.end();
  }
}

test("every outcome line of the contract", async () => {
  const db = await schema();
  const issuer = newIssuer();
  const hex = (key: Uint8Array): string => Buffer.from(key).toString("hex");
  const keys = hex(issuer.publicKey);
  const w = (token: string, v: string, extra: string[] = []): Promise<string> => line(writeArgs(db, keys, token, v, extra));

  assert.equal(await w(issuer.token(LOCK, 1n), "one"), "admitted 1 1");
  assert.equal(await w(issuer.token(LOCK, 2n), "two"), "admitted 2 2");
  assert.equal(await w(issuer.token(LOCK, 2n), "two-again"), "admitted 2 2");
  assert.equal(await w(issuer.token(LOCK, 1n), "late"), "refused stale_token 2:1");
  assert.equal(await w("", "x"), "refused missing_token -");
  assert.equal(await w(" \t", "x"), "refused missing_token -");
  assert.equal(await w("2", "x"), "refused invalid_token malformed");
  assert.equal(await w(newIssuer().token(LOCK, 9n), "x"), "refused invalid_token unknown_key");
  const genuine = issuer.token(LOCK, 9n);
  const at = genuine.length - 10;
  assert.equal(await w(genuine.slice(0, at) + (genuine[at] === "A" ? "B" : "A") + genuine.slice(at + 1), "x"), "refused invalid_token bad_signature");
  assert.equal(await w(issuer.token("invoices", 9n), "x"), "refused wrong_lock invoices");
  assert.equal(await value(db), "two-again");

  // A second trusted key, listed after a comma; the sequence policy.
  const second = newIssuer();
  const both = `${keys},${hex(second.publicKey).toUpperCase()}`;
  assert.equal(await line(writeArgs(db, both, second.token(LOCK, 3n), "seq-5", ["--seq", "5"])), "admitted 3 3");
  assert.equal(await line(writeArgs(db, both, second.token(LOCK, 3n), "seq-5-again", ["--seq", "5"])), "refused stale_sequence 3:5:3:5");
  assert.equal(await line(writeArgs(db, both, second.token(LOCK, 3n), "seq-6", ["--seq", "6"])), "admitted 3 3");
  assert.equal(await value(db), "seq-6");
});

test("exit 2, with no outcome line, on usage and database errors, storage_failed included", async () => {
  const db = await schema();
  const issuer = newIssuer();
  const keys = Buffer.from(issuer.publicKey).toString("hex");
  const token = issuer.token(LOCK, 1n);
  for (const [name, args, stderr] of [
    ["no command", [], /usage/],
    ["another command", ["verify", "--lock", LOCK], /usage/],
    ["a flag without a value", [...writeArgs(db, keys, token, "v"), "--seq"], /unexpected argument/],
    ["a missing flag", writeArgs(db, keys, token, "v").slice(0, -2), /missing --token/],
    ["not postgres", writeArgs(db, keys, token, "v").map((a) => (a.startsWith("postgres:") ? "sqlite:x.db" : a)), /postgres:/],
    ["a bad key", writeArgs(db, "zz", token, "v"), /public-key/],
    ["a bad seq", writeArgs(db, keys, token, "v", ["--seq", "-1"]), /--seq/],
    ["an unknown conninfo keyword", writeArgs(`${db} frobnicate=1`, keys, token, "v"), /frobnicate/],
    ["a table that does not exist", writeArgs(db, keys, token, "v").map((a) => (a === "kv" ? "nowhere" : a)), /nowhere/],
    ["no server", writeArgs("host=127.0.0.1 port=1 user=postgres dbname=postgres", keys, token, "v"), /ECONNREFUSED/],
    ["an epoch past 2^63-1 (storage_failed)", writeArgs(db, keys, issuer.token(LOCK, 1n << 63n), "v"), /SQL integer range/],
  ] as const) {
    const done = await writer([...args]);
    assert.equal(done.status, 2, `${name}: exit ${done.status}, stdout ${JSON.stringify(done.stdout)}`);
    assert.equal(done.stdout, "", name);
    assert.match(done.stderr, /^fenced-writer: /, name);
    assert.match(done.stderr, stderr, name);
  }
  assert.equal(await value(db), undefined, "nothing was written");
});

test("the conninfo is libpq's: quoted values, escapes, white space around =, a table name quoted", async () => {
  assert.deepEqual(
    [...parseConninfo(` host = 127.0.0.1  user='post gres' password='it\\'s' options=-csearch_path=a\\ b dbname=''`)],
    [["host", "127.0.0.1"], ["user", "post gres"], ["password", "it's"], ["options", "-csearch_path=a b"], ["dbname", ""]],
  );
  assert.throws(() => parseConninfo("host"), /missing "="/);
  assert.throws(() => parseConninfo("host='x"), /unterminated/);
  assert.deepEqual(pgConfig("host=h port=5 user=u dbname=d options=-cx=y sslmode=disable"), {
    ssl: false, host: "h", port: 5, user: "u", database: "d", options: "-cx=y",
  });
  assert.throws(() => pgConfig("sslmode=require"), /not supported/);

  const table = 'odd "table"';
  const { name, conninfo } = await namedSchema(table);
  const spelled = `host = '127.0.0.1'  port=${cluster().port} user='postgres' dbname=postgres options='-csearch_path=${name}'`;
  const issuer = newIssuer();
  const args = writeArgs(spelled, Buffer.from(issuer.publicKey).toString("hex"), issuer.token(LOCK, 1n), "quoted");
  assert.equal(await line(args.map((a) => (a === "kv" ? table : a))), "admitted 1 1");
  assert.equal(await value(conninfo, table), "quoted");
});

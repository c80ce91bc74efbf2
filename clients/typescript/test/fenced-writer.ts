// The TypeScript gate driven from the command line (built to dist/test/fenced-writer.js),
// for the cross-language test (clients/python/tests/test_five_languages.py, run by
// scripts/cross-language-test): the same arguments and the same outcome lines as the
// Rust adapters' fenced_writer example and Go's internal/cmd/fenced-writer, so that one
// test can put writers of every language on one PostgreSQL table.
//
//   node dist/test/fenced-writer.js write --db postgres:<conninfo> --table <name>
//        --public-key <hex>[,<hex>...] --lock <lock> --key <key> --value <value>
//        --token <token> [--seq <n>]
//
// <conninfo> is libpq's key=value form (host, hostaddr, port, user, password, dbname,
// options, sslmode=disable|allow|prefer, application_name). One transaction admits the
// token (retried on write_conflict, as the docs tell users) and upserts key = value into
// <table> (key, value). The outcome is one line on stdout: `admitted <epoch> <high_water>`
// or `refused <code> <detail>`. Exit 0 when the line was printed, 2 on a usage or
// database error (storage_failed included).

import { pathToFileURL } from "node:url";
import pg from "pg";

import { PalisadeError, StaleSequenceError, StaleTokenError, WriteConflictError, WrongLockError } from "../src/errors.js";
import type { Admitted } from "../src/gate.js";
import { admit, admitSequenced } from "../src/gates/postgres.js";
import { KeyRing, TokenError, Verifier } from "../src/token.js";

const REQUIRED = ["db", "table", "public-key", "lock", "key", "value", "token"];
const U64_MAX = (1n << 64n) - 1n;

class UsageError extends Error {}

/** libpq's key=value connection string: keywords separated by white space, `=` with
 * optional white space around it, values bare or in single quotes, `\` escaping the next
 * character in both. */
export function parseConninfo(text: string): Map<string, string> {
  const out = new Map<string, string>();
  let i = 0;
  const space = (): void => {
    while (i < text.length && /\s/.test(text[i]!)) i++;
  };
  for (space(); i < text.length; space()) {
    const start = i;
    while (i < text.length && text[i] !== "=" && !/\s/.test(text[i]!)) i++;
    const key = text.slice(start, i);
    space();
    if (key === "" || text[i] !== "=") throw new UsageError(`conninfo: missing "=" after ${JSON.stringify(key)}`);
    i++;
    space();
    let value = "";
    if (text[i] === "'") {
      for (i++; ; i++) {
        if (i >= text.length) throw new UsageError("conninfo: unterminated quoted value");
        if (text[i] === "'") break;
        if (text[i] === "\\") i++;
        if (i < text.length) value += text[i];
      }
      i++;
    } else {
      for (; i < text.length && !/\s/.test(text[i]!); i++) {
        if (text[i] === "\\") i++;
        if (i < text.length) value += text[i];
      }
    }
    out.set(key, value);
  }
  return out;
}

/** pg's connection settings for a libpq conninfo. */
export function pgConfig(conninfo: string): pg.ClientConfig {
  const config: pg.ClientConfig = { ssl: false };
  for (const [key, value] of parseConninfo(conninfo)) {
    switch (key) {
      case "host":
      case "hostaddr":
        config.host = value;
        break;
      case "port":
        if (!/^[0-9]{1,5}$/.test(value)) throw new UsageError(`conninfo: bad port ${JSON.stringify(value)}`);
        config.port = Number(value);
        break;
      case "user":
        config.user = value;
        break;
      case "password":
        config.password = value;
        break;
      case "dbname":
        config.database = value;
        break;
      case "options":
        config.options = value;
        break;
      case "application_name":
        config.application_name = value;
        break;
      case "sslmode":
        if (!["disable", "allow", "prefer"].includes(value)) {
          throw new UsageError(`conninfo: sslmode=${value} is not supported by this writer`);
        }
        break;
      default:
        throw new UsageError(`conninfo: keyword ${JSON.stringify(key)} is not supported by this writer`);
    }
  }
  return config;
}

function parseFlags(args: string[]): Map<string, string> {
  if (args[0] !== "write") throw new UsageError("usage: fenced-writer write --db postgres:<conninfo> ...");
  const flags = new Map<string, string>();
  for (let i = 1; i < args.length; i += 2) {
    const arg = args[i]!;
    if (!arg.startsWith("--") || i + 1 >= args.length) throw new UsageError(`unexpected argument ${JSON.stringify(arg)}`);
    flags.set(arg.slice(2), args[i + 1]!);
  }
  for (const name of REQUIRED) {
    if (!flags.has(name)) throw new UsageError(`missing --${name}`);
  }
  return flags;
}

async function main(args: string[]): Promise<void> {
  const flags = parseFlags(args);
  const flag = (name: string): string => flags.get(name)!; // required: checked
  const ring = new KeyRing();
  for (const hex of flag("public-key").split(",")) {
    if (!/^(?:[0-9a-fA-F]{2})*$/.test(hex)) throw new UsageError(`--public-key: not hex: ${JSON.stringify(hex)}`);
    ring.add(new Uint8Array(Buffer.from(hex, "hex")));
  }
  const verifier = new Verifier(ring, { cacheSize: 16 });
  const db = flag("db");
  if (!db.startsWith("postgres:")) throw new UsageError("--db must be postgres:<conninfo>");
  let seq: bigint | undefined;
  const seqText = flags.get("seq");
  if (seqText !== undefined) {
    if (!/^[0-9]+$/.test(seqText) || BigInt(seqText) > U64_MAX) throw new UsageError(`--seq: not a number from 0 to 2^64-1: ${JSON.stringify(seqText)}`);
    seq = BigInt(seqText);
  }
  const client = new pg.Client(pgConfig(db.slice("postgres:".length)));
  let lost: Error | undefined;
  client.on("error", (err) => (lost = err)); // the connection failed between queries
  await client.connect();
  try {
    const upsert =
      `INSERT INTO ${client.escapeIdentifier(flag("table"))} (key, value) VALUES ($1, $2) ` +
      "ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    for (;;) {
      let admitted: Admitted;
      try {
        await client.query("BEGIN");
        admitted =
          seq === undefined
            ? await admit(client, verifier, flag("token"), flag("lock"))
            : await admitSequenced(client, verifier, flag("token"), flag("lock"), seq);
        await client.query(upsert, [flag("key"), flag("value")]);
        await client.query("COMMIT");
      } catch (err) {
        await client.query("ROLLBACK").catch(() => {});
        if (err instanceof WriteConflictError) continue; // rolled back: retry the whole transaction
        report(err);
        return;
      }
      if (lost !== undefined) throw lost;
      console.log(`admitted ${admitted.claims.epoch} ${admitted.highWater.epoch}`);
      return;
    }
  } finally {
    await client.end().catch(() => {});
  }
}

/** Prints the refusal's line; anything that is not a refusal (storage_failed included) is
 * an error of the run. */
function report(err: unknown): void {
  if (!(err instanceof PalisadeError) || err.code === "storage_failed") throw err;
  let detail = "-";
  if (err instanceof StaleTokenError) detail = `${err.highWater}:${err.epoch}`;
  else if (err instanceof StaleSequenceError) detail = `${err.highWater}:${err.highWaterSeq}:${err.epoch}:${err.seq}`;
  else if (err instanceof WrongLockError) detail = err.tokenLock;
  else if (err.cause instanceof TokenError) detail = err.cause.kind;
  console.log(`refused ${err.code} ${detail}`);
}

// Run only as the program, not when imported (a test may import parseConninfo).
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : "";
    console.error(`fenced-writer: ${err instanceof Error ? err.message : String(err)}${cause}`);
    process.exitCode = 2;
  });
}

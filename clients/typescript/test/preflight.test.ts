// The preflight vectors (vectors/preflight.json, made from the Rust rules in
// crates/adapters/src/preflight.rs): checkSettings gives the same verdict on every
// PostgreSQL case, each unsafe setting with its value and what it needs, in the same
// order. A rule changed here and not in the other gates fails this test.

import assert from "node:assert/strict";
import { test } from "node:test";

import { checkSettings, type UnsafeSetting } from "../src/gates/postgres.js";
import { vectorsFile } from "./server.js";

interface PostgresCase {
  fsync: string;
  synchronous_commit: string;
  full_page_writes: string;
  synchronous_standby_names: string;
  replicas: number;
  unsafe: UnsafeSetting[];
}

test("checkSettings gives every PostgreSQL case of vectors/preflight.json its verdict", () => {
  const file = JSON.parse(vectorsFile("preflight.json")) as { postgres: PostgresCase[] };
  assert.ok(file.postgres.length > 0, "no PostgreSQL cases");
  let safe = 0;
  for (const c of file.postgres) {
    const verdict = checkSettings(
      c.fsync,
      c.synchronous_commit,
      c.full_page_writes,
      c.synchronous_standby_names,
      c.replicas,
    );
    if (verdict === undefined) safe++;
    const found = (verdict?.settings ?? []).map((s) => ({ name: s.name, value: s.value, needs: s.needs }));
    assert.deepEqual(found, c.unsafe, `case ${JSON.stringify(c)}`);
  }
  assert.ok(safe > 0, "no safe case: the file would not notice a rule that refuses everything");
});

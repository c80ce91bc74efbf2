//! `vectors/preflight.json`: the preflight rules' verdicts on a set of database settings,
//! made here from the Rust rules (`palisade_adapters::preflight`). Every other gate runs
//! its own copy of the PostgreSQL rule over the same cases in its tests
//! (`clients/python/tests/test_preflight_vectors.py`, `clients/go/gate/postgres/`,
//! `clients/java/.../gate/PreflightVectorsTest.java`, `clients/typescript/test/preflight.test.ts`),
//! so a rule changed in one language and not the others fails a test. The Redis cases are
//! the Rust gate's only: no other language has a Redis gate yet.

use palisade_adapters::preflight::{self, PostgresSettings, UnsafeDatabase};
use serde_json::{json, Value};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/preflight.json");

/// (fsync, synchronous_commit, full_page_writes, synchronous_standby_names, replicas):
/// every branch of the rule, and the cases between them.
const POSTGRES: &[(&str, &str, &str, &str, i64)] = &[
    ("on", "on", "on", "", 0),
    ("off", "on", "on", "", 0),
    ("on", "on", "off", "", 0),
    ("on", "off", "on", "", 0),
    ("on", "local", "on", "", 0),
    ("on", "local", "on", "standby1", 1),
    ("on", "remote_write", "on", "standby1", 1),
    ("on", "remote_apply", "on", "FIRST 1 (a, b)", 2),
    ("on", "on", "on", "", 1),
    ("on", "on", "on", "   ", 2),
    ("on", "on", "on", "ANY 1 (*)", 3),
    ("on", "On", "on", "", 0),
    ("off", "off", "off", "", 2),
];

/// (appendonly, appendfsync).
const REDIS: &[(&str, &str)] = &[
    ("yes", "always"),
    ("no", "always"),
    ("yes", "everysec"),
    ("yes", "no"),
    ("no", "everysec"),
];

fn verdict(result: Result<(), UnsafeDatabase>) -> Value {
    match result {
        Ok(()) => json!([]),
        Err(e) => e
            .settings
            .iter()
            .map(|s| json!({"name": s.name, "value": s.value, "needs": s.needs}))
            .collect(),
    }
}

fn generate() -> Value {
    let postgres: Vec<Value> = POSTGRES
        .iter()
        .map(|&(fsync, sync, fpw, standbys, replicas)| {
            let settings = PostgresSettings {
                fsync: fsync.into(),
                synchronous_commit: sync.into(),
                full_page_writes: fpw.into(),
                synchronous_standby_names: standbys.into(),
                replicas,
            };
            json!({
                "fsync": fsync,
                "synchronous_commit": sync,
                "full_page_writes": fpw,
                "synchronous_standby_names": standbys,
                "replicas": replicas,
                "unsafe": verdict(preflight::postgres(&settings)),
            })
        })
        .collect();
    let redis: Vec<Value> = REDIS
        .iter()
        .map(|&(appendonly, appendfsync)| {
            json!({
                "appendonly": appendonly,
                "appendfsync": appendfsync,
                "unsafe": verdict(preflight::redis(appendonly, appendfsync)),
            })
        })
        .collect();
    json!({
        "about": "The preflight rules' verdicts (crates/adapters/src/preflight.rs): for each \
                  case, the unsafe settings in the order the rule names them (empty: the \
                  database can keep the gate's promise). Every gate runs its rule over the \
                  PostgreSQL cases; the Redis cases are the Rust gate's. Regenerate: \
                  PALISADE_UPDATE_VECTORS=1 cargo test -p palisade-adapters --test preflight_vectors",
        "postgres": postgres,
        "redis": redis,
    })
}

#[test]
fn the_committed_preflight_vectors_are_the_rules_verdicts() {
    palisade_test_support::vectors::assert_committed(
        FILE,
        &generate(),
        "cargo test -p palisade-adapters --test preflight_vectors",
    );
}

#[test]
fn the_cases_reach_every_verdict() {
    // Each unsafe setting appears in some case, and some case is safe: the file tests
    // every branch of each rule in the other languages.
    let made = generate();
    let names: std::collections::BTreeSet<String> = ["postgres", "redis"]
        .iter()
        .flat_map(|db| made[db].as_array().unwrap().clone())
        .flat_map(|case| case["unsafe"].as_array().unwrap().clone())
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    for name in [
        "fsync",
        "full_page_writes",
        "synchronous_commit",
        "synchronous_standby_names",
        "appendonly",
        "appendfsync",
    ] {
        assert!(names.contains(name), "no case flags {name}");
    }
    for db in ["postgres", "redis"] {
        assert!(made[db]
            .as_array()
            .unwrap()
            .iter()
            .any(|case| case["unsafe"].as_array().unwrap().is_empty()));
    }
}

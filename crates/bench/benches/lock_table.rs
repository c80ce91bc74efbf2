//! The issuer's lock table with 1,000,000 known locks: acquire + release of a random
//! lock, and keepalive of one of 10,000 live leases.
//!
//! Time advances by one millisecond per operation and the table is polled as the server
//! would, so timer entries are retired at the same rate they are created (as in a server
//! running for a long time) instead of piling up.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use palisade_core::lock_table::{AcquireOutcome, AcquireRequest, LockTable, TableConfig};

const LOCKS: usize = 1_000_000;
const LEASES: usize = 10_000;
const TTL_MS: u64 = 60_000;

fn table() -> (LockTable, Vec<String>) {
    let names: Vec<String> = (0..LOCKS).map(|i| format!("lock-{i}")).collect();
    let mut table = LockTable::new(TableConfig::default());
    table.restore(0, names.iter().map(|n| (n.clone(), 1)), []);
    (table, names)
}

fn request(lock: &str, lease_id: String) -> AcquireRequest {
    AcquireRequest {
        lock: lock.to_owned(),
        holder: "worker-1".to_owned(),
        ttl_ms: TTL_MS,
        wait_ms: 0,
        lease_id,
        ..AcquireRequest::default()
    }
}

/// Resident memory of this process (Linux), in bytes.
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn lock_table(c: &mut Criterion) {
    let before = rss();
    let (mut table, names) = table();
    if let (Some(before), Some(after)) = (before, rss()) {
        // The names vector is counted too (about 40 bytes a name); the table holds its own.
        eprintln!(
            "lock_table: {LOCKS} locks (and their names) take {:.0} bytes each",
            after.saturating_sub(before) as f64 / LOCKS as f64
        );
    }
    let mut now = 1;
    let mut i: usize = 0;
    c.bench_function("lock_table/acquire_release_1m_locks", |b| {
        b.iter(|| {
            now += 1;
            i = (i + 7919) % LOCKS;
            let lease = format!("lease-{i}");
            let granted = table.acquire(now, request(&names[i], lease.clone()));
            assert!(matches!(granted, AcquireOutcome::Granted(_)));
            black_box(table.release(now, &lease)).ok();
            table.poll(now);
            table.drain_events();
        })
    });

    for (j, name) in names.iter().take(LEASES).enumerate() {
        table.acquire(now, request(name, format!("held-{j}")));
    }
    let leases: Vec<String> = (0..LEASES).map(|j| format!("held-{j}")).collect();
    let mut j = 0;
    c.bench_function("lock_table/keepalive_10k_leases_1m_locks", |b| {
        b.iter(|| {
            now += 1;
            j = (j + 1) % LEASES;
            black_box(table.keepalive(now, &leases[j])).ok();
            table.poll(now);
            table.drain_events();
        })
    });
    assert_eq!(
        table.live_leases(),
        LEASES,
        "a lease expired during the bench"
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = lock_table
}
criterion_main!(benches);

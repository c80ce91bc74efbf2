//! The comparison that chose the shape of the embedded storage engine (issue 11, section 1):
//! what one durable batch of small writes costs on each candidate, on this machine's disk.
//!
//! - `redb_commit`: the old shape. One redb write transaction per batch, committed with
//!   `Durability::Immediate` (copy-on-write of the touched B-tree pages, checksums, one
//!   commit with its fsyncs).
//! - `fjall_persist`: fjall's journal and LSM. One atomic write batch, then
//!   `Database::persist(PersistMode::SyncData)` (an fdatasync of the journal).
//! - `wal_fdatasync`: a write-ahead log in front of redb. The batch is encoded into one
//!   record, written at the end of a preallocated, zero-filled log file, and fdatasync'd;
//!   the in-memory index (a `BTreeMap`) takes the writes. The checkpoint into redb runs
//!   later, in the background, off the acknowledgement path, so it is not in this number.
//!
//! Each iteration is one durable batch of `n` puts of a 128-byte value (`n` = 1 and 64).
//! Results of a run are in `docs/storage-engine.md`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const VALUE: [u8; 128] = [b'v'; 128];
const LOG_BYTES: u64 = 256 * 1024 * 1024;

fn key(i: u64) -> String {
    format!("bench/k{}", i % 4096)
}

fn redb_commit(c: &mut Criterion, n: u64) {
    const KV: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("kv");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = redb::Database::create(dir.path().join("bench.redb")).expect("redb");
    let mut i = 0;
    c.benchmark_group("engines")
        .sample_size(20)
        .throughput(Throughput::Elements(n))
        .bench_function(BenchmarkId::new("redb_commit", n), |b| {
            b.iter(|| {
                let mut txn = db.begin_write().expect("txn");
                txn.set_durability(redb::Durability::Immediate);
                {
                    let mut table = txn.open_table(KV).expect("table");
                    for _ in 0..n {
                        i += 1;
                        table.insert(key(i).as_str(), &VALUE[..]).expect("insert");
                    }
                }
                txn.commit().expect("commit");
            })
        });
}

fn fjall_persist(c: &mut Criterion, n: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = fjall::Database::builder(dir.path().join("fjall"))
        .open()
        .expect("fjall");
    let kv = db
        .keyspace("kv", fjall::KeyspaceCreateOptions::default)
        .expect("keyspace");
    let mut i = 0;
    c.benchmark_group("engines")
        .sample_size(20)
        .throughput(Throughput::Elements(n))
        .bench_function(BenchmarkId::new("fjall_persist", n), |b| {
            b.iter(|| {
                let mut batch = db.batch();
                for _ in 0..n {
                    i += 1;
                    batch.insert(&kv, key(i), VALUE);
                }
                batch.commit().expect("commit");
                db.persist(fjall::PersistMode::SyncData).expect("persist");
            })
        });
}

fn wal_fdatasync(c: &mut Criterion, n: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.wal");
    let log = File::create(&path).expect("log");
    // Zero-filled ahead of time, as the engine prepares its log files, so an fdatasync
    // flushes data only, never the file's size.
    let zeros = vec![0u8; 1 << 20];
    for at in (0..LOG_BYTES).step_by(zeros.len()) {
        log.write_all_at(&zeros, at).expect("preallocate");
    }
    log.sync_all().expect("sync");
    let mut index: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let (mut i, mut offset) = (0u64, 0u64);
    let mut record = Vec::with_capacity(64 * 200);
    c.benchmark_group("engines")
        .sample_size(20)
        .throughput(Throughput::Elements(n))
        .bench_function(BenchmarkId::new("wal_fdatasync", n), |b| {
            b.iter(|| {
                record.clear();
                record.extend_from_slice(&[0xA5; 32]); // header: magic, length, seq, crc
                for _ in 0..n {
                    i += 1;
                    let k = key(i);
                    record.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    record.extend_from_slice(k.as_bytes());
                    record.extend_from_slice(&(VALUE.len() as u32).to_le_bytes());
                    record.extend_from_slice(&VALUE);
                    index.insert(k, VALUE.to_vec());
                }
                if offset + record.len() as u64 > LOG_BYTES {
                    offset = 0;
                }
                log.write_all_at(&record, offset).expect("append");
                offset += record.len() as u64;
                log.sync_data().expect("fdatasync");
            })
        });
}

fn engines(c: &mut Criterion) {
    for n in [1, 64] {
        redb_commit(c, n);
        fjall_persist(c, n);
        wal_fdatasync(c, n);
    }
}

criterion_group!(benches, engines);
criterion_main!(benches);

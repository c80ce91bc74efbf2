//! The storage commit path, `RedbBackend::apply`: one fenced put per commit (each waits
//! for its own log record's fdatasync), and 64 concurrent puts that the writer groups into
//! one record (while the previous one's fdatasync runs).
//!
//! Both are bound by the disk's fdatasync latency; compare with the fdatasync figure in
//! docs/benchmarks.md. The numbers are per iteration: one op, or a batch of 64. The
//! comparison of engines that chose this one is `benches/engines.rs`.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use palisade_core::gate::Policy;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{Action, FencedOp, FencedStore, Precondition};

fn put(key: usize) -> FencedOp {
    FencedOp {
        namespace: "bench".to_owned(),
        epoch: 1,
        seq: None,
        policy: Policy::Epoch,
        idempotency: None,
        action: Action::Put {
            key: format!("k{}", key % 1024),
            value: Bytes::from_static(&[b'v'; 128]),
            precondition: Precondition::None,
        },
    }
}

fn storage(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let store = RedbBackend::open(&dir.path().join("bench.redb"), RedbOptions::default())
        .expect("open redb");
    let mut n = 0;

    let mut group = c.benchmark_group("storage");
    group.sample_size(20);
    group.throughput(Throughput::Elements(1));
    group.bench_function("apply_one_per_commit", |b| {
        b.iter(|| {
            n += 1;
            runtime.block_on(store.apply(put(n))).expect("applied")
        })
    });
    let single = store.commit_stats();
    group.throughput(Throughput::Elements(64));
    group.bench_function("apply_batch_of_64", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let (base, store) = (n, &store);
                n += 64;
                let ops = (0..64).map(move |i| store.apply(put(base + i)));
                for result in futures::future::join_all(ops).await {
                    result.expect("applied");
                }
            })
        })
    });
    group.finish();
    let all = store.commit_stats();
    let (ops, commits) = (all.ops - single.ops, all.commits - single.commits);
    eprintln!(
        "storage: apply_one_per_commit: {} ops in {} commits; apply_batch_of_64: {ops} ops \
         in {commits} commits ({:.1} ops per commit)",
        single.ops,
        single.commits,
        ops as f64 / commits.max(1) as f64
    );
    runtime.block_on(store.close());
}

criterion_group!(benches, storage);
criterion_main!(benches);

//! The gate rule, `palisade_core::gate::admit`: a pure comparison, run inside every
//! fenced write transaction.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use palisade_core::gate::{admit, HighWater, Policy};

fn gate(c: &mut Criterion) {
    let mark = HighWater { epoch: 41, seq: 7 };
    c.bench_function("gate/admit_epoch", |b| {
        b.iter(|| admit(black_box(mark), Policy::Epoch, black_box(42), None))
    });
    c.bench_function("gate/admit_sequence", |b| {
        b.iter(|| admit(black_box(mark), Policy::Sequence, black_box(41), Some(8)))
    });
    c.bench_function("gate/reject_stale", |b| {
        b.iter(|| admit(black_box(mark), Policy::Epoch, black_box(40), None))
    });
}

criterion_group!(benches, gate);
criterion_main!(benches);

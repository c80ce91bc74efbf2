//! Token verification: a cold (uncached) Ed25519 verification, and the cached hit path
//! that every write of an epoch after its first takes (target: under 1 µs).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use palisade_token::{KeyRing, Signer, Verifier};

fn verification(c: &mut Criterion) {
    let signer = Signer::generate();
    let mut ring = KeyRing::new();
    ring.insert(signer.public_key());
    let verifier = Verifier::new(ring, 65_536);
    let token = signer.issue("orders", 42, "worker-1");

    c.bench_function("token/issue", |b| {
        b.iter(|| signer.issue(black_box("orders"), black_box(42), black_box("worker-1")))
    });
    c.bench_function("token/verify_uncached", |b| {
        b.iter(|| verifier.verify_uncached(black_box(&token)))
    });
    verifier.verify(&token).expect("genuine token");
    c.bench_function("token/verify_cached", |b| {
        b.iter(|| verifier.verify(black_box(&token)))
    });
    // The cache holds many live tokens in a busy server; a hit must stay cheap.
    let many: Vec<String> = (0..10_000)
        .map(|i| signer.issue(&format!("lock-{i}"), 1, "w"))
        .collect();
    for t in &many {
        verifier.verify(t).expect("genuine token");
    }
    let mut i = 0;
    c.bench_function("token/verify_cached_10k_tokens", |b| {
        b.iter(|| {
            i = (i + 7919) % many.len();
            verifier.verify(black_box(&many[i]))
        })
    });
}

criterion_group!(benches, verification);
criterion_main!(benches);

//! `palisade verify --topology etcd3`: three etcd members and three Palisade nodes on
//! loopback, the workers spread over the nodes, every fault of the topology (etcd leader
//! killed, an etcd member paused past the election timeout, a Palisade node killed and
//! one cut off from etcd, plus the worker faults). The lock-set history must show no
//! violation, every kind of fault must have been injected, and the report must name the
//! topology, the workers' failover and the nemesis timeline.
//!
//! Needs `etcd` and a build with `--features etcd` (scripts/test, etcd section). The
//! etcd-lock controls are `verify_etcd_lock.rs`, a separate binary so the two never run
//! at the same time.

#![cfg(feature = "etcd")]

mod common;

use common::verify::VerifyRun;

#[test]
fn lock_set_on_etcd3_under_every_fault_has_no_violations() {
    let run = VerifyRun::start(&[
        "--topology",
        "etcd3",
        "--workload",
        "lock-set",
        "--time",
        "30",
        "--seed",
        "7",
    ]);
    run.assert_clean_lock_set(&[
        "pause",
        "kill",
        "delay",
        "drop",
        "partition",
        "etcd-kill",
        "etcd-pause",
        "node-partition",
    ]);
    let (summary, stdout) = (&run.summary, &run.stdout);
    assert_eq!(summary["topology"], "etcd3");
    // A 503 while etcd had no quorum is never an acknowledgement.
    assert!(
        summary["fail_codes"].get("storage_failed").is_none(),
        "{stdout}"
    );
    let report = run.report();
    for text in [
        "Topology: etcd3",
        "etcd member m0",
        "Palisade node 2",
        "failover is the workers",
        "Nemesis timeline",
        "node-partition",
        "no violations found",
        "<svg",
    ] {
        assert!(report.contains(text), "the report lacks {text:?}");
    }
}

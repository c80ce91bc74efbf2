//! The controls beside the etcd3 topology: etcd's own lock (lease + lock key, as etcd's
//! `concurrency.Mutex`) under the same lock-set workload and the same etcd and worker
//! faults.
//!
//! - Guarding a store that checks no token, it must lose acknowledged updates, as Jepsen
//!   found for etcd 3.4.3: a holder paused past its lease keeps writing.
//! - With the lock key's revision checked at the store by the gate rule, the same run must
//!   come out clean, with late writes refused as stale: the protection is the check at the
//!   resource, not the lock.
//!
//! One test runs both in turn, so two etcd clusters never compete for the machine. Needs
//! `etcd`; built with `--features etcd` like the other etcd tests (scripts/test).

#![cfg(feature = "etcd")]

mod common;

use common::verify::VerifyRun;

fn control(target: &str) -> VerifyRun {
    VerifyRun::start(&[
        "--target",
        target,
        "--workload",
        "lock-set",
        "--time",
        "25",
        "--seed",
        "7",
    ])
}

#[test]
fn etcd_lock_is_safe_only_when_the_store_checks_its_revision() {
    let unfenced = control("etcd-lock");
    let (summary, stdout) = (&unfenced.summary, &unfenced.stdout);
    // Exit code 1 means "violations found"; 2 would mean the run itself failed.
    assert_eq!(unfenced.status.code(), Some(1), "{stdout}");
    assert_eq!(summary["topology"], "etcd3");
    assert_eq!(
        summary["checkers"]["lockset"]["valid"], "invalid",
        "{stdout}"
    );
    assert!(unfenced.faults("pause") >= 1, "{stdout}");
    assert!(unfenced.report().contains("checks no token"));

    let fenced = control("etcd-lock-fenced");
    let (summary, stdout) = (&fenced.summary, &fenced.stdout);
    assert!(fenced.status.success(), "fenced control failed: {stdout}");
    assert_eq!(summary["violations"], 0, "{stdout}");
    for checker in ["tokens", "fencing", "lockset", "reads"] {
        assert_eq!(summary["checkers"][checker]["valid"], "valid", "{stdout}");
    }
    assert!(
        summary["fail_codes"]["stale_token"].as_u64().unwrap_or(0) >= 1,
        "no late write was refused, so the clean run proves little: {stdout}"
    );
    for kind in ["pause", "etcd-kill", "etcd-pause"] {
        assert!(
            fenced.faults(kind) >= 1,
            "no {kind} fault injected: {stdout}"
        );
    }
}

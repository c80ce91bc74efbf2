//! The disk fault against the embedded store: after a SIGKILL, one bit of the newest
//! commit is flipped (the newest record of the write-ahead log) before the restart.
//!
//! **A documented regression case.** The store before the write-ahead log (redb alone,
//! one-phase commit) fell back to the commit before the damaged one and served it as if
//! nothing had happened: writes it acknowledged were gone and their store revisions were
//! handed out again (seed 7 found 14 violations; docs/verification.md, "Disk faults").
//! The store now notices: a damaged commit that is not a torn write refuses to start, so
//! the run stops at the first disk fault with the refusal, before any stale state could
//! be served, and the history recorded up to it is clean.

mod common;

use common::verify::VerifyRun;

#[test]
fn disk_fault_is_detected_and_the_store_refuses_to_serve() {
    let run = VerifyRun::attempt(&[
        "--faults",
        "disk",
        "--workload",
        "register",
        "--time",
        "30",
        "--seed",
        "7",
    ]);
    let said = format!("{}{}", run.stdout, run.stderr);
    // Exit code 2: the run could not go on, because the server refused its damaged store.
    assert_eq!(run.status.code(), Some(2), "{said}");
    assert!(said.contains("the disk fault was detected"), "{said}");
    // It was the newest log record that was damaged, and the store said so by name.
    assert!(
        said.contains("palisade.redb.wal.") && said.contains("is damaged"),
        "{said}"
    );
}

//! Each checker must catch the violations planted here, and name the operations involved.

mod common;

use std::time::Duration;

use common::*;
use palisade_checker::{
    fencing, linear, lockset, reads, tokens, FinalState, History, Op, OpKind, Pending, Validity,
    Violation,
};

const BUDGET: Duration = Duration::from_secs(10);

fn indices(v: &Violation) -> Vec<usize> {
    match v {
        Violation::StaleAccepted {
            op, established_by, ..
        } => vec![established_by.index, op.index],
        Violation::EpochRegression { before, after, .. } => vec![before.index, after.index],
        Violation::ReusedEpoch { first, second, .. } => vec![first.index, second.index],
        Violation::EpochNotIncreasing { earlier, later, .. } => vec![earlier.index, later.index],
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn stale_write_accepted() {
    let h = History::new(vec![
        write(2, "a", "new", 2, (0, 10), 1),
        // Invoked after epoch 2 was acknowledged, yet accepted with epoch 1.
        write(1, "a", "old", 1, (20, 30), 2),
    ]);
    let end = final_state(NS, 2, &[("a", "old")]);

    let report = fencing::check(&h);
    assert_eq!(report.valid, Validity::Invalid);
    let kinds: Vec<Vec<usize>> = report.violations.iter().map(indices).collect();
    assert_eq!(kinds, vec![vec![0, 1], vec![0, 1]], "{}", report.summary());
    assert!(matches!(
        report.violations[0],
        Violation::EpochRegression { .. }
    ));
    assert!(matches!(
        report.violations[1],
        Violation::StaleAccepted { .. }
    ));

    let report = linear::check(&h, &end, BUDGET);
    assert_eq!(report.valid, Validity::Invalid, "{}", report.summary());
    match &report.violations[..] {
        [Violation::NotLinearizable {
            linearized, stuck, ..
        }] => {
            assert_eq!(linearized, &vec![0]);
            assert!(matches!(&stuck[..], [Pending::Op(op)] if op.index == 1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn write_accepted_after_a_fence() {
    let h = History::new(vec![
        fence(2, 3, (0, 10)),
        write(1, "a", "late", 2, (20, 30), 1),
    ]);
    let report = fencing::check(&h);
    assert!(matches!(
        &report.violations[..],
        [Violation::StaleAccepted { established_by, op, .. }] if established_by.index == 0 && op.index == 1
    ));
    assert_eq!(
        linear::check(&h, &FinalState::default(), BUDGET).valid,
        Validity::Invalid
    );

    // A fence at revision 1 sits between revisions 1 and 2: revision 2 with a lower
    // epoch went backwards even though the two overlap in time.
    let h = History::new(vec![
        write(1, "a", "x", 3, (0, 5), 1),
        fence(2, 3, (0, 50)).revision(1),
        write(3, "a", "y", 2, (0, 50), 2),
    ]);
    let report = fencing::check(&h);
    assert!(report
        .violations
        .iter()
        .all(|v| matches!(v, Violation::EpochRegression { .. })));
    assert!(!report.violations.is_empty());
}

#[test]
fn unjustified_rejection_and_unfenced_write() {
    let h = History::new(vec![
        write(1, "a", "x", 2, (0, 10), 1),
        // Epoch 2 equals the mark: it must be admitted (S8), not refused.
        stale(1, "a", "y", 2, (20, 30)),
        Op::new(3, OpKind::Delete, 40)
            .lock(NS)
            .key("a")
            .revision(2)
            .ok(50),
    ]);
    let report = fencing::check(&h);
    assert!(
        matches!(
            &report.violations[..],
            [Violation::Unfenced { op: u }, Violation::UnjustifiedRejection { op: r, max_possible_high_water: 2, .. }]
                if u.index == 2 && r.index == 1
        ),
        "{}",
        report.summary()
    );
    let report = linear::check(
        &History::new(h.ops()[..2].to_vec()),
        &FinalState::default(),
        BUDGET,
    );
    assert_eq!(report.valid, Validity::Invalid);
}

#[test]
fn lost_acknowledged_write_in_the_register() {
    let h = History::new(vec![
        write(1, "a", "x", 1, (0, 10), 1),
        write(1, "a", "y", 1, (20, 30), 2),
    ]);
    // The final state still shows the first value: the acknowledged second write is lost.
    let end = final_state(NS, 1, &[("a", "x")]);
    let report = linear::check(&h, &end, BUDGET);
    assert_eq!(report.valid, Validity::Invalid);
    match &report.violations[..] {
        [Violation::NotLinearizable { stuck, state, .. }] => {
            assert!(state.contains("a=\"y\""), "{state}");
            assert_eq!(stuck, &vec![Pending::Final(end.namespaces[NS].clone())]);
            assert_eq!(stuck[0].to_string(), "final state: high-water 1, a=\"x\"");
        }
        other => panic!("{other:?}"),
    }
    // A later read showing the old value is caught the same way, without a final state.
    let mut ops = h.ops().to_vec();
    ops.push(read(2, "a", Some("x"), (40, 50)));
    let report = linear::check(&History::new(ops), &FinalState::default(), BUDGET);
    assert_eq!(report.valid, Validity::Invalid);
}

#[test]
fn lost_acknowledged_add_in_the_lock_set() {
    let read_set = |p: u64, set: &str, span: (u64, u64)| {
        Op::new(p, OpKind::ReadSet, span.0)
            .lock("set")
            .key("s")
            .value(set)
            .ok(span.1)
    };
    let h = History::new(vec![
        acquire(1, "set", 1, 0, 1),
        read_set(1, "[]", (2, 3)),
        // Worker 1 pauses; its lease expires and worker 2 takes over.
        acquire(2, "set", 2, 10, 11),
        read_set(2, "[]", (12, 13)),
        add(2, "2", 2, (14, 15), 1),
        // Worker 1 wakes and writes back its stale set: the store wrongly accepts it.
        add(1, "1", 1, (20, 21), 2),
        read_set(3, "[\"1\"]", (30, 31)),
    ]);
    let end = final_state("set", 2, &[("s", "[\"1\"]")]);
    let report = lockset::check(&h, &end);
    assert_eq!(report.valid, Validity::Invalid);
    assert!(
        matches!(
            &report.violations[..],
            [Violation::LostUpdate { element, op, .. }, Violation::SetReadMissing { read, .. }]
                if element == "2" && op.index == 4 && read.index == 6
        ),
        "{}",
        report.summary()
    );
    assert!(report
        .summary()
        .contains("\"2\" missing from the final set"));
    // The fencing checker names the cause: a stale add accepted.
    assert!(fencing::check(&h)
        .violations
        .iter()
        .any(|v| matches!(v, Violation::StaleAccepted { op, .. } if op.index == 5)));
    // Without a final state for the namespace the lock-set verdict is unknown.
    assert_eq!(
        lockset::check(&History::new(h.ops()[..5].to_vec()), &FinalState::default()).valid,
        Validity::Unknown
    );
}

#[test]
fn reused_epoch() {
    let h = History::new(vec![
        acquire(1, "L", 3, 0, 10),
        acquire(2, "L", 3, 20, 30),
        acquire(3, "other", 3, 20, 30),
    ]);
    let report = tokens::check(&h);
    assert_eq!(report.valid, Validity::Invalid);
    assert_eq!(report.violations.len(), 1, "{}", report.summary());
    assert_eq!(indices(&report.violations[0]), vec![0, 1]);
}

#[test]
fn epoch_going_backwards_across_a_restart() {
    let h = History::new(vec![
        acquire(1, "L", 5, 0, 10),
        restart(15),
        acquire(2, "L", 2, 20, 30),
        // Concurrent with the first: either order is fine.
        acquire(3, "L", 1, 5, 40),
    ]);
    let report = tokens::check(&h);
    match &report.violations[..] {
        [Violation::EpochNotIncreasing {
            earlier,
            later,
            restarts_between: 1,
            ..
        }] => assert_eq!((earlier.index, later.index), (0, 2)),
        _ => panic!("{}", report.summary()),
    }
    assert!(report.summary().contains("1 restart(s) between"));
}

#[test]
fn read_of_a_value_never_written() {
    let h = History::new(vec![
        write(1, "a", "x", 1, (0, 10), 1),
        stale(1, "a", "refused", 0, (10, 20)),
        read(2, "a", Some("ghost"), (20, 30)),
        read(2, "a", Some("refused"), (20, 30)),
        read(2, "b", Some("later"), (20, 30)),
        write(1, "b", "later", 1, (40, 50), 2),
    ]);
    let end = final_state(NS, 1, &[("a", "x"), ("b", "later"), ("c", "junk")]);
    let report = reads::check(&h, &end);
    let found: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(found[0].contains("read \"ghost\", never written"));
    assert!(found[1].contains("read \"refused\", never written"));
    assert!(found[2].starts_with("read a value before its only writes were invoked"));
    assert!(found[3].contains("final state holds \"junk\""));
    assert_eq!(linear::check(&h, &end, BUDGET).valid, Validity::Invalid);
}

#[test]
fn duplicate_revision_and_epoch_echo() {
    let mut echoed = write(2, "b", "y", 1, (20, 30), 1);
    echoed.returned_epoch = Some(7);
    let h = History::new(vec![write(1, "a", "x", 1, (0, 10), 1), echoed]);
    let report = fencing::check(&h);
    assert!(
        matches!(
            &report.violations[..],
            [
                Violation::DuplicateRevision { revision: 1, .. },
                Violation::EpochMismatch { .. }
            ]
        ),
        "{}",
        report.summary()
    );
}

#[test]
fn budget_spent_gives_unknown() {
    let mut ops = Vec::new();
    for i in 0..3000u64 {
        ops.push(write(
            1,
            "a",
            &i.to_string(),
            1,
            (i * 10, i * 10 + 5),
            i + 1,
        ));
    }
    let report = linear::check(&History::new(ops), &FinalState::default(), Duration::ZERO);
    assert_eq!(report.valid, Validity::Unknown);
    assert!(
        report.stats.notes[0].contains("time budget"),
        "{:?}",
        report.stats
    );
}

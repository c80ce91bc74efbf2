//! Correct histories pass every checker; the JSONL format reads and writes as documented.

mod common;

use std::time::Duration;

use common::*;
use palisade_checker::{
    check_all, linear, FinalState, History, HistoryError, Op, OpKind, Outcome, Validity,
};

const BUDGET: Duration = Duration::from_secs(10);

/// The sample scenario of the source article (NOTES.md), as a concurrent history, plus a
/// lock-set round, unknown outcomes and a restart.
fn fencing_py() -> (History, FinalState) {
    let h = History::new(vec![
        acquire(1, NS, 1, 0, 5),
        acquire(2, NS, 2, 10, 15),
        // The old leader writes before the store has seen epoch 2: accepted (S10).
        write(1, "v", "old-1", 1, (20, 30), 1),
        write(2, "v", "new-1", 2, (25, 40), 2),
        stale(1, "v", "old-2", 1, (50, 60)),
        read(3, "v", Some("new-1"), (55, 65)),
        write(2, "v", "new-2", 2, (70, 80), 3), // equal epoch: accepted (S8)
        restart(85),
        acquire(3, NS, 3, 90, 95),
        // A write that timed out: it may or may not have landed.
        unknown(2, "w", "maybe", 2, 96),
        write(3, "v", "newest", 3, (100, 110), 4),
        stale(2, "v", "late", 2, (120, 130)),
        read(1, "v", Some("newest"), (140, 150)),
        read(1, "gone", None, (140, 150)),
        acquire(4, "set", 1, 0, 1),
        add(4, "a", 1, (2, 3), 5),
        acquire(5, "set", 2, 10, 11),
        Op::new(5, OpKind::ReadSet, 12)
            .lock("set")
            .key("s")
            .value("[\"a\"]")
            .ok(13),
        add(5, "b", 2, (14, 15), 6),
        Op::new(6, OpKind::Add, 20)
            .lock("set")
            .key("s")
            .value("c")
            .epoch(1)
            .fail(21, "stale_token"),
    ]);
    let mut end = final_state(NS, 3, &[("v", "newest"), ("w", "maybe")]);
    end.namespaces
        .extend(final_state("set", 2, &[("s", "[\"a\",\"b\"]")]).namespaces);
    (h, end)
}

#[test]
fn correct_history_passes_every_checker() {
    let (h, end) = fencing_py();
    let reports = check_all(&h, &end, BUDGET);
    let names: Vec<&str> = reports.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        ["tokens", "fencing", "linearizability", "lockset", "reads"]
    );
    assert_all_valid(&reports);
    // The unknown write may also never have landed.
    let mut end = end;
    end.namespaces.get_mut(NS).unwrap().values.remove("w");
    assert_eq!(linear::check(&h, &end, BUDGET).valid, Validity::Valid);
}

#[test]
fn overlapping_old_write_is_not_a_violation() {
    // S10: epoch 1 overlaps the first write of epoch 2 and lands first. Legitimate.
    let h = History::new(vec![
        write(1, "a", "old", 1, (0, 100), 1),
        write(2, "a", "new", 2, (10, 20), 2),
        read(3, "a", Some("new"), (110, 120)),
    ]);
    assert_all_valid(&check_all(&h, &final_state(NS, 2, &[("a", "new")]), BUDGET));
}

#[test]
fn cross_key_mark_is_respected() {
    // Epoch 2 on key b raises the namespace mark, so epoch 1 on key a is rightly refused.
    let h = History::new(vec![
        write(1, "b", "x", 2, (0, 10), 1),
        stale(2, "a", "y", 1, (20, 30)),
        read(3, "a", None, (40, 50)),
    ]);
    assert_all_valid(&check_all(&h, &final_state(NS, 2, &[("b", "x")]), BUDGET));
}

#[test]
fn long_concurrent_history_is_decided_quickly() {
    // Five workers, epochs rising every 50 ops, overlapping intervals, some timeouts;
    // results computed from a real linearization, so the history is correct.
    let mut ops = Vec::new();
    let (mut value, mut high_water, mut rev) = (None::<String>, 0u64, 0u64);
    let mut seed = 7u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for i in 0..1500u64 {
        let p = i % 5;
        let at = i * 10;
        let span = (at.saturating_sub(next() % 30), at + next() % 30);
        let epoch = (i / 50 + 1).saturating_sub(next() % 2);
        match next() % 4 {
            0 => ops.push(read(p, "k", value.as_deref(), span)),
            1 if next() % 10 == 0 => {
                let v = format!("v{i}");
                if next() % 2 == 0 && epoch >= high_water {
                    (value, high_water) = (Some(v.clone()), epoch);
                }
                ops.push(unknown(p, "k", &v, epoch, span.0));
            }
            _ if epoch >= high_water => {
                rev += 1;
                let v = format!("v{i}");
                ops.push(write(p, "k", &v, epoch, span, rev));
                (value, high_water) = (Some(v), epoch);
            }
            _ => ops.push(stale(p, "k", "x", epoch, span)),
        }
    }
    let h = History::new(ops);
    let end = final_state(NS, high_water, &[("k", value.as_deref().unwrap_or(""))]);
    let started = std::time::Instant::now();
    let report = linear::check(&h, &end, Duration::from_secs(60));
    assert_eq!(report.valid, Validity::Valid, "{}", report.summary());
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn jsonl_round_trip_and_field_names() {
    let text = r#"
{"process":1,"kind":"acquire","lock":"L","epoch":4,"invoke":10,"complete":20,"outcome":"ok","holder":"extra fields are ignored"}
{"process":1,"kind":"write","lock":"L","key":"k","value":"v","epoch":4,"invoke":30,"complete":40,"outcome":"ok","revision":9,"returned_epoch":4}
{"process":2,"kind":"write","lock":"L","key":"k","value":"w","epoch":3,"invoke":35,"complete":45,"outcome":"fail","error":"stale_token"}
{"process":3,"kind":"read","lock":"L","key":"k","invoke":50,"outcome":"info","error":"timeout"}
{"kind":"restart","invoke":60,"complete":60,"outcome":"ok"}
"#;
    let h = History::from_jsonl(text.as_bytes()).unwrap();
    assert_eq!(h.ops().len(), 5);
    let w = &h.ops()[1];
    assert_eq!(
        (w.index, w.kind, w.outcome),
        (1, OpKind::Write, Outcome::Ok)
    );
    assert_eq!((w.revision, w.returned_epoch), (Some(9), Some(4)));
    assert!(h.ops()[2].is_stale_rejection());
    assert_eq!(h.ops()[3].end(), None);
    assert_eq!(
        h.ops()[1].to_string(),
        "#1 p1 write L/k=\"v\" e4 [30..40] ok rev9"
    );

    let mut out = Vec::new();
    h.to_jsonl(&mut out).unwrap();
    let again = History::from_jsonl(out.as_slice()).unwrap();
    assert_eq!(again, h);
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 5);

    let end: FinalState =
        serde_json::from_str(r#"{"namespaces":{"L":{"high_water":4,"values":{"k":"v"}}}}"#)
            .unwrap();
    let mut out = Vec::new();
    end.to_json(&mut out).unwrap();
    assert_eq!(FinalState::from_json(out.as_slice()).unwrap(), end);
}

#[test]
fn malformed_lines_are_refused_with_their_line_number() {
    let bad_json =
        "{\"kind\":\"write\",\"invoke\":1,\"outcome\":\"ok\",\"complete\":2}\n{not json}";
    assert!(matches!(
        History::from_jsonl(bad_json.as_bytes()),
        Err(HistoryError::Json { line: 2, .. })
    ));
    let no_complete = "{\"kind\":\"write\",\"invoke\":1,\"outcome\":\"ok\"}";
    assert!(matches!(
        History::from_jsonl(no_complete.as_bytes()),
        Err(HistoryError::Invalid { line: 1, .. })
    ));
    let backwards = "{\"kind\":\"read\",\"invoke\":9,\"complete\":2,\"outcome\":\"ok\"}";
    let err = History::from_jsonl(backwards.as_bytes()).unwrap_err();
    assert_eq!(err.to_string(), "line 1: `complete` is before `invoke`");
    let bad_kind = "{\"kind\":\"upsert\",\"invoke\":1,\"outcome\":\"ok\",\"complete\":2}";
    assert!(History::from_jsonl(bad_kind.as_bytes()).is_err());
}

#[test]
fn summary_counts_outcomes() {
    let (h, end) = fencing_py();
    let reports = check_all(&h, &end, BUDGET);
    let fencing = &reports[1].1;
    assert_eq!(
        fencing.summary(),
        "valid: 10 ops examined (6 ok, 3 fail, 1 info), 0 skipped, 0 violation(s)"
    );
    let linear = &reports[2].1.summary();
    assert!(linear.contains("note: set: lock-set namespace"), "{linear}");
}

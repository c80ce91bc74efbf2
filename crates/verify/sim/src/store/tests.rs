use super::*;

fn put(epoch: Epoch, value: &str) -> Job {
    Job::Mutate {
        lock: "ns".into(),
        epoch,
        action: Action::Put {
            key: "k".into(),
            value: value.into(),
        },
    }
}

fn answer(req_id: u64) -> Option<Answer> {
    Some(Answer {
        client: 0,
        req_id,
        lock: "ns".into(),
    })
}

#[test]
fn answers_wait_for_fsync_and_a_crash_loses_the_unsynced() {
    let mut store = Store::default();
    assert!(store.submit(put(2, "a"), answer(1)));
    assert!(!store.submit(put(1, "old"), answer(2)), "joins the batch");
    assert!(store.begin_commit(None).early.is_empty());
    assert!(
        store.durable().namespaces.is_empty(),
        "not durable before fsync"
    );
    let (out, more) = store.finish_commit();
    assert!(!more);
    let replies: Vec<Reply> = out.answers.into_iter().map(|(_, r)| r).collect();
    assert_eq!(
        replies,
        vec![
            Reply::Applied {
                revision: 1,
                epoch: 2
            },
            Reply::Refused("stale_token")
        ]
    );

    store.submit(put(3, "lost"), answer(3));
    store.begin_commit(None);
    store.crash(false);
    assert!(store.idle());
    let ns = &store.durable().namespaces["ns"];
    assert_eq!((ns.high_water.epoch, ns.values["k"].as_str()), (2, "a"));

    store.submit(put(3, "torn"), answer(4));
    store.begin_commit(None);
    store.crash(true);
    assert_eq!(store.durable().namespaces["ns"].values["k"], "torn");
}

#[test]
fn broken_variants_break_what_they_say() {
    let mut store = Store::default();
    store.submit(put(2, "a"), answer(1));
    store.submit(put(1, "b"), answer(2));
    let commit = store.begin_commit(Some(Bug::AckBeforeFsync));
    assert_eq!(commit.early.len(), 2, "acknowledged before the fsync");
    store.finish_commit();
    let ns = &store.durable().namespaces["ns"];
    assert_eq!(ns.high_water.epoch, 2);
    assert_eq!(ns.values["k"], "a");

    let mut store = Store::default();
    store.submit(put(2, "a"), None);
    store.submit(put(1, "b"), None);
    store.begin_commit(Some(Bug::GateAdmitsStale));
    store.finish_commit();
    let ns = &store.durable().namespaces["ns"];
    assert_eq!((ns.high_water.epoch, ns.values["k"].as_str()), (2, "b"));
}

#[test]
fn reservations_never_lower_the_ceiling_and_lazy_records_need_no_answer() {
    let reservation = |ceiling, max_ttl_ms, active| Reservation {
        ceiling,
        max_ttl_ms,
        active,
    };
    let mut store = Store::default();
    let reserve = Job::Reserve {
        lock: "l".into(),
        reservation: reservation(8, 300, true),
        lease: None,
        write: 7,
    };
    assert!(store.submit(reserve, None));
    // An idle marker from an older reservation, queued behind it.
    let idle = Job::LazyReservation {
        lock: "l".into(),
        reservation: reservation(4, 100, false),
    };
    store.submit(idle, None);
    assert!(store.begin_commit(None).early.is_empty());
    let (durable, _) = store.finish_commit();
    assert_eq!(durable.written, vec![7], "only the reservation is reported");
    assert!(durable.answers.is_empty());
    let records = store.durable();
    // The ceiling stays; an inactive reservation's TTL is its own (nothing live to cover).
    assert_eq!(records.reservations["l"], reservation(8, 100, false));
    assert_eq!(records.epochs["l"], 8, "the last epoch follows the ceiling");
}

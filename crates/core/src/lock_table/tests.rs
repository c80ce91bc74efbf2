use super::*;
use proptest::prelude::*;

/// Per lock: (last epoch, live lease id and deadline, unused).
type Model = HashMap<String, (Epoch, Option<(String, Millis)>, Millis)>;

fn req(lock: &str, holder: &str, ttl_ms: Millis, wait_ms: Millis, id: &str) -> AcquireRequest {
    AcquireRequest {
        lock: lock.into(),
        holder: holder.into(),
        ttl_ms,
        wait_ms,
        lease_id: id.into(),
    }
}

fn granted(outcome: AcquireOutcome) -> Grant {
    match outcome {
        AcquireOutcome::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn epochs_count_up_and_held_lock_is_refused() {
    let mut t = LockTable::new(TableConfig::default());
    let a = granted(t.acquire(0, req("L", "a", 1000, 0, "l1")));
    assert_eq!(a.epoch, 1);
    assert_eq!(
        t.acquire(10, req("L", "b", 1000, 0, "l2")),
        AcquireOutcome::Held {
            holder: Some("a".into()),
            retry_after_ms: 990
        }
    );
    t.release(20, "l1").unwrap();
    assert_eq!(
        granted(t.acquire(30, req("L", "b", 1000, 0, "l2"))).epoch,
        2
    );
    // Another lock has its own sequence.
    assert_eq!(
        granted(t.acquire(30, req("M", "b", 1000, 0, "l3"))).epoch,
        1
    );
}

#[test]
fn lease_expires_unless_kept_alive() {
    let mut t = LockTable::new(TableConfig::default());
    granted(t.acquire(0, req("L", "a", 100, 0, "l1")));
    assert_eq!(t.keepalive(90, "l1").unwrap().remaining_ms, 100);
    assert!(matches!(
        t.acquire(150, req("L", "b", 100, 0, "x")),
        AcquireOutcome::Held { .. }
    ));
    assert_eq!(t.keepalive(189, "l1").unwrap().epoch, 1);
    // Hours later, without renewal, the lease is gone.
    assert_eq!(t.keepalive(3_600_000, "l1"), Err(LeaseExpired));
    assert_eq!(t.release(3_600_000, "l1"), Err(LeaseExpired));
    let g = granted(t.acquire(3_600_000, req("L", "b", 100, 0, "l2")));
    assert_eq!(g.epoch, 2);
}

#[test]
fn lock_delay_applies_after_expiry_not_release() {
    let mut t = LockTable::new(TableConfig { lock_delay_ms: 500 });
    granted(t.acquire(0, req("L", "a", 100, 0, "l1")));
    // Expired at 100: ungrantable until 600.
    assert_eq!(
        t.acquire(200, req("L", "b", 100, 0, "l2")),
        AcquireOutcome::Held {
            holder: None,
            retry_after_ms: 400
        }
    );
    assert_eq!(
        granted(t.acquire(600, req("L", "b", 100, 0, "l2"))).epoch,
        2
    );
    // Released: no delay.
    t.release(610, "l2").unwrap();
    assert_eq!(
        granted(t.acquire(611, req("L", "c", 100, 0, "l3"))).epoch,
        3
    );
}

#[test]
fn waiters_are_served_in_order_and_time_out() {
    let mut t = LockTable::new(TableConfig::default());
    granted(t.acquire(0, req("L", "a", 1000, 0, "l1")));
    let AcquireOutcome::Queued(tb) = t.acquire(1, req("L", "b", 1000, 5000, "l2")) else {
        panic!()
    };
    let AcquireOutcome::Queued(tc) = t.acquire(2, req("L", "c", 1000, 50, "l3")) else {
        panic!()
    };
    let AcquireOutcome::Queued(td) = t.acquire(3, req("L", "d", 1000, 5000, "l4")) else {
        panic!()
    };
    t.poll(60);
    assert_eq!(
        t.drain_events(),
        vec![Event::TimedOut {
            ticket: tc,
            holder: Some("a".into()),
            retry_after_ms: 940
        }]
    );
    t.release(100, "l1").unwrap();
    let events = t.drain_events();
    assert!(
        matches!(&events[..], [Event::Granted { ticket, grant }] if *ticket == tb && grant.epoch == 2 && grant.holder == "b")
    );
    // d waits for b's lease to expire.
    t.poll(1099);
    assert!(t.drain_events().is_empty());
    assert!(t.next_wakeup().is_some_and(|w| w <= 1100));
    t.poll(1100);
    let events = t.drain_events();
    assert!(matches!(&events[0], Event::Expired { lease_id, epoch: 2, .. } if lease_id == "l2"));
    assert!(
        matches!(&events[1], Event::Granted { ticket, grant } if *ticket == td && grant.epoch == 3)
    );
}

#[test]
fn newcomer_without_wait_does_not_jump_the_queue() {
    let mut t = LockTable::new(TableConfig { lock_delay_ms: 100 });
    granted(t.acquire(0, req("L", "a", 10, 0, "l1")));
    t.poll(10); // expired, delayed until 110
    t.drain_events();
    assert!(matches!(
        t.acquire(20, req("L", "b", 10, 1000, "l2")),
        AcquireOutcome::Queued(_)
    ));
    assert!(matches!(
        t.acquire(110, req("L", "c", 10, 0, "l3")),
        AcquireOutcome::Held { .. }
    ));
    // The acquire at 110 settled the lock: b got it.
    assert!(matches!(&t.drain_events()[..], [Event::Granted { grant, .. }] if grant.holder == "b"));
}

#[test]
fn cancelled_waiter_is_skipped() {
    let mut t = LockTable::new(TableConfig::default());
    granted(t.acquire(0, req("L", "a", 1000, 0, "l1")));
    let AcquireOutcome::Queued(tb) = t.acquire(1, req("L", "b", 1000, 5000, "l2")) else {
        panic!()
    };
    t.cancel(tb);
    t.release(5, "l1").unwrap();
    assert!(t.drain_events().is_empty());
    assert_eq!(t.status(5, "L").lease, None);
}

#[test]
fn restore_honours_leases_for_a_full_ttl_and_never_reissues() {
    let mut t = LockTable::new(TableConfig::default());
    t.restore(
        1_000,
        [("L".to_string(), 7), ("M".to_string(), 3)],
        [
            Grant {
                lock: "L".into(),
                holder: "old".into(),
                epoch: 6,
                lease_id: "a".into(),
                ttl_ms: 500,
            },
            Grant {
                lock: "L".into(),
                holder: "new".into(),
                epoch: 7,
                lease_id: "b".into(),
                ttl_ms: 500,
            },
        ],
    );
    assert_eq!(
        t.lease(1_000, "a"),
        None,
        "only the newest lease of a lock can be live"
    );
    assert!(
        matches!(t.acquire(1_499, req("L", "x", 10, 0, "c")), AcquireOutcome::Held { holder: Some(h), .. } if h == "new")
    );
    assert_eq!(t.keepalive(1_200, "b").unwrap().remaining_ms, 500);
    assert_eq!(
        granted(t.acquire(1_700, req("L", "x", 10, 0, "c"))).epoch,
        8
    );
    assert_eq!(granted(t.acquire(0, req("M", "x", 10, 0, "d"))).epoch, 4);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { lock: u8, wait: Millis, ttl: Millis },
    Release(u8),
    Keepalive(u8),
    Cancel(u8),
    Advance(Millis),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, prop_oneof![Just(0), 1u64..300], 1u64..200)
            .prop_map(|(lock, wait, ttl)| Op::Acquire { lock, wait, ttl }),
        (0u8..16).prop_map(Op::Release),
        (0u8..16).prop_map(Op::Keepalive),
        (0u8..16).prop_map(Op::Cancel),
        (0u64..150).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Random interleavings of acquire/wait/release/keepalive/cancel/time: epochs per lock
    /// strictly increase, a lock is never granted while an earlier lease of it is live,
    /// lock-delay is respected, and waiters are served in arrival order.
    #[test]
    fn grants_are_exclusive_and_epochs_increase(ops in proptest::collection::vec(op(), 1..300), delay in 0u64..50) {
        let mut t = LockTable::new(TableConfig { lock_delay_ms: delay });
        let mut now = 0;
        let mut next_id = 0u32;
        // Per lock: (last epoch, lease id, deadline of the live grant or None when released)
        let mut model: Model = HashMap::new();
        let mut lease_ids: Vec<String> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        let mut queued_order: HashMap<String, Vec<Ticket>> = HashMap::new();
        let mut ttl_of: HashMap<String, Millis> = HashMap::new();

        let check_grant = |g: &Grant, now: Millis, model: &mut Model| -> Result<(), TestCaseError> {
            let entry = model.entry(g.lock.clone()).or_insert((0, None, 0));
            prop_assert_eq!(g.epoch, entry.0 + 1, "epochs must count up by one");
            if let Some((_, deadline)) = &entry.1 {
                prop_assert!(*deadline <= now, "granted {} while lease live until {}", g.lock, deadline);
                prop_assert!(deadline + delay <= now, "lock-delay not respected");
            }
            entry.0 = g.epoch;
            entry.1 = Some((g.lease_id.clone(), now + g.ttl_ms));
            Ok(())
        };

        for op in ops {
            match op {
                Op::Acquire { lock, wait, ttl } => {
                    let id = format!("lease{next_id}");
                    next_id += 1;
                    ttl_of.insert(id.clone(), ttl);
                    let name = format!("L{lock}");
                    match t.acquire(now, req(&name, "h", ttl, wait, &id)) {
                        AcquireOutcome::Granted(g) => { check_grant(&g, now, &mut model)?; lease_ids.push(id); }
                        AcquireOutcome::Queued(ticket) => { tickets.push(ticket); queued_order.entry(name).or_default().push(ticket); }
                        AcquireOutcome::Held { .. } => {}
                    }
                }
                Op::Release(i) => {
                    if let Some(id) = lease_ids.get(i as usize).cloned() {
                        if let Ok(view) = t.release(now, &id) {
                            let entry = model.get_mut(&view.lock).unwrap();
                            prop_assert_eq!(entry.1.as_ref().map(|(l, _)| l.clone()), Some(id));
                            entry.1 = None;
                        }
                    }
                }
                Op::Keepalive(i) => {
                    if let Some(id) = lease_ids.get(i as usize).cloned() {
                        if let Ok(view) = t.keepalive(now, &id) {
                            let entry = model.get_mut(&view.lock).unwrap();
                            let (live_id, deadline) = entry.1.as_mut().unwrap();
                            prop_assert_eq!(&*live_id, &id);
                            prop_assert!(*deadline > now, "renewed an expired lease");
                            *deadline = now + ttl_of[&id];
                        }
                    }
                }
                Op::Cancel(i) => {
                    if let Some(&ticket) = tickets.get(i as usize) {
                        t.cancel(ticket);
                        for q in queued_order.values_mut() { q.retain(|&x| x != ticket); }
                    }
                }
                Op::Advance(ms) => { now += ms; t.poll(now); }
            }
            for event in t.drain_events() {
                match event {
                    Event::Granted { ticket, grant } => {
                        check_grant(&grant, now, &mut model)?;
                        let q = queued_order.get_mut(&grant.lock).unwrap();
                        prop_assert_eq!(q.first().copied(), Some(ticket), "waiters out of order");
                        q.remove(0);
                        lease_ids.push(grant.lease_id);
                    }
                    Event::TimedOut { ticket, .. } => {
                        for q in queued_order.values_mut() { q.retain(|&x| x != ticket); }
                    }
                    Event::Expired { lock, lease_id, .. } => {
                        let entry = model.get_mut(&lock).unwrap();
                        let (live_id, deadline) = entry.1.clone().unwrap();
                        prop_assert_eq!(live_id, lease_id);
                        prop_assert!(deadline <= now, "expired early");
                    }
                }
            }
        }
    }
}

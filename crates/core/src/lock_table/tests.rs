use super::*;
use palisade_api::QuotaResource;
use proptest::prelude::*;

fn req(lock: &str, holder: &str, ttl_ms: Millis, wait_ms: Millis, id: &str) -> AcquireRequest {
    AcquireRequest {
        lock: lock.into(),
        holder: holder.into(),
        ttl_ms,
        wait_ms,
        lease_id: id.into(),
        ..Default::default()
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
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 500,
        ..Default::default()
    });
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
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 100,
        ..Default::default()
    });
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
                reserve: None,
                generation: 0,
                ..Default::default()
            },
            Grant {
                lock: "L".into(),
                holder: "new".into(),
                epoch: 7,
                lease_id: "b".into(),
                ttl_ms: 500,
                reserve: None,
                generation: 0,
                ..Default::default()
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

#[test]
fn reservations_cover_hand_offs_and_survive_a_restart() {
    let config = TableConfig {
        lock_delay_ms: 0,
        epoch_block: 100,
        idle_grace_ms: 0,
        ..Default::default()
    };
    let mut t = LockTable::new(config);
    let first = granted(t.acquire(0, req("L", "a", 1000, 0, "l1")));
    let r = first
        .reserve
        .expect("an idle lock needs a durable reservation first");
    assert_eq!((r.ceiling, r.max_ttl_ms, r.active), (100, 1000, true));
    t.confirm(0, "L", r, first.generation);
    // Hand-offs inside the reservation need no disk write.
    let AcquireOutcome::Queued(_) = t.acquire(1, req("L", "b", 1000, 5000, "l2")) else {
        panic!()
    };
    t.release(2, "l1").unwrap();
    let events = t.drain_events();
    assert!(
        matches!(&events[..], [Event::Granted { grant, .. }] if grant.epoch == 2 && grant.reserve.is_none())
    );
    // A longer TTL than reserved needs a new reservation.
    t.release(3, "l2").unwrap();
    let idle = t.drain_events();
    assert!(matches!(&idle[..], [Event::Idle { reservation, .. }] if !reservation.active));
    let third = granted(t.acquire(4, req("L", "c", 5000, 0, "l3")));
    assert_eq!(third.reserve.map(|r| r.max_ttl_ms), Some(5000));
    t.confirm(4, "L", third.reserve.unwrap(), third.generation);

    // Crash: only the reservation survives (no lease records at all).
    let mut t = LockTable::new(config);
    t.restore_reservations(
        10,
        [(
            "L".to_string(),
            Reservation {
                ceiling: 102,
                max_ttl_ms: 5000,
                active: true,
            },
        )],
    );
    assert!(matches!(
        t.acquire(5009, req("L", "d", 10, 0, "l4")),
        AcquireOutcome::Held { holder: None, .. }
    ));
    let g = granted(t.acquire(5010, req("L", "d", 10, 0, "l4")));
    assert_eq!(g.epoch, 103, "epochs continue above the ceiling");
    assert!(g.reserve.is_some());
}

#[test]
fn a_restored_lease_expiring_early_does_not_cut_the_reservation_block_short() {
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 10,
        epoch_block: 100,
        idle_grace_ms: 0,
        ..Default::default()
    });
    // An old lease record (its lazy removal was lost) and an active reservation for
    // leases of up to 1000 ms: a newer holder may have been answered without a record.
    t.restore(
        0,
        [("L".to_string(), 4)],
        [Grant {
            lock: "L".into(),
            holder: "old".into(),
            epoch: 4,
            lease_id: "a".into(),
            ttl_ms: 100,
            reserve: None,
            generation: 0,
            ..Default::default()
        }],
    );
    let active = Reservation {
        ceiling: 5,
        max_ttl_ms: 1000,
        active: true,
    };
    t.restore_reservations(0, [("L".to_string(), active)]);
    t.poll(200); // the old lease expired at 100; its lock-delay would end at 110
    assert!(matches!(
        t.acquire(500, req("L", "x", 10, 0, "l1")),
        AcquireOutcome::Held { .. }
    ));
    assert_eq!(
        granted(t.acquire(1010, req("L", "x", 10, 0, "l1"))).epoch,
        6
    );
}

#[test]
fn a_lock_taken_again_within_the_idle_grace_needs_no_disk_write() {
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 0,
        epoch_block: 100,
        idle_grace_ms: 50,
        ..Default::default()
    });
    let first = granted(t.acquire(0, req("L", "a", 1000, 0, "l1")));
    t.confirm(
        0,
        "L",
        first.reserve.expect("an idle lock reserves first"),
        first.generation,
    );
    t.release(10, "l1").unwrap();
    assert!(
        t.drain_events().is_empty(),
        "no idle marker inside the grace"
    );
    assert_eq!(t.next_wakeup(), Some(60), "a timer at the end of the grace");
    // Taken again inside the grace: covered, no disk write.
    let second = granted(t.acquire(40, req("L", "b", 1000, 0, "l2")));
    assert_eq!((second.epoch, second.reserve), (2, None));
    t.release(45, "l2").unwrap();
    // The grace counts from the latest release, not the first.
    t.poll(60);
    assert!(t.drain_events().is_empty(), "{:?}", t.drain_events());
    t.poll(95);
    let idle = t.drain_events();
    assert!(
        matches!(&idle[..], [Event::Idle { lock, reservation }] if lock == "L" && !reservation.active),
        "{idle:?}"
    );
    // Once marked idle, the next grant waits for the disk again.
    let third = granted(t.acquire(100, req("L", "c", 1000, 0, "l3")));
    assert!(third.reserve.is_some());
}

#[test]
fn epoch_floor_applies_to_locks_the_table_never_saw() {
    let mut t = LockTable::new(TableConfig::default());
    t.restore(0, [("known".to_string(), 5)], []);
    t.set_epoch_floor(1000);
    assert_eq!(
        granted(t.acquire(0, req("known", "a", 10, 0, "l1"))).epoch,
        1001
    );
    assert_eq!(
        granted(t.acquire(0, req("unseen", "a", 10, 0, "l2"))).epoch,
        1001
    );
}

fn owned(lock: &str, owner: &str, wait_ms: Millis, id: &str) -> AcquireRequest {
    AcquireRequest {
        owner: Some(Owner {
            name: owner.into(),
            max_leases: 2,
            max_waiters: 1,
        }),
        ..req(lock, &format!("{owner}/w"), 1000, wait_ms, id)
    }
}

#[test]
fn owners_quotas_count_live_leases_and_waiters() {
    let mut t = LockTable::new(TableConfig::default());
    granted(t.acquire(0, owned("a", "p", 0, "1")));
    granted(t.acquire(0, owned("b", "p", 0, "2")));
    let refused = AcquireOutcome::QuotaExceeded {
        resource: QuotaResource::LeasesPerPrincipal,
        limit: 2,
    };
    assert_eq!(t.acquire(0, owned("c", "p", 0, "3")), refused);
    // Another owner, and nobody's requests, are not affected.
    granted(t.acquire(0, owned("c", "q", 0, "4")));
    granted(t.acquire(0, req("d", "x", 1000, 0, "5")));
    // Releasing one makes room; so does an expiry.
    t.release(1, "1").unwrap();
    granted(t.acquire(1, owned("e", "p", 0, "6")));
    assert_eq!(t.acquire(1, owned("f", "p", 0, "7")), refused);
    t.poll(5000);
    granted(t.acquire(5000, owned("f", "p", 0, "8")));
    granted(t.acquire(5000, owned("g", "p", 0, "9")));
    // Waiting counts separately: one waiter at most, and not while at the lease limit.
    t.release(5000, "9").unwrap();
    granted(t.acquire(5000, req("w", "x", 60_000, 0, "held")));
    assert!(matches!(
        t.acquire(5000, owned("w", "p", 100, "10")),
        AcquireOutcome::Queued(_)
    ));
    assert_eq!(
        t.acquire(5000, owned("w", "p", 100, "11")),
        AcquireOutcome::QuotaExceeded {
            resource: QuotaResource::WaitersPerPrincipal,
            limit: 1
        }
    );
    // The waiter times out: its place is free again.
    t.poll(5100);
    assert!(t
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::TimedOut { .. })));
    assert!(matches!(
        t.acquire(5100, owned("w", "p", 100, "12")),
        AcquireOutcome::Queued(_)
    ));
}

#[test]
fn a_lock_line_has_a_length_limit() {
    let mut t = LockTable::new(TableConfig {
        max_waiters_per_lock: 2,
        ..Default::default()
    });
    granted(t.acquire(0, req("L", "a", 1000, 0, "1")));
    for id in ["2", "3"] {
        assert!(matches!(
            t.acquire(0, req("L", "b", 1000, 100, id)),
            AcquireOutcome::Queued(_)
        ));
    }
    assert_eq!(
        t.acquire(0, req("L", "b", 1000, 100, "4")),
        AcquireOutcome::QuotaExceeded {
            resource: QuotaResource::WaitersPerLock,
            limit: 2
        }
    );
    // Without waiting the answer is the usual one.
    assert!(matches!(
        t.acquire(0, req("L", "b", 1000, 0, "5")),
        AcquireOutcome::Held { .. }
    ));
}

#[test]
fn a_sweep_that_empties_the_table_gives_its_memory_back() {
    let mut t = LockTable::new(TableConfig {
        max_locks: 4096,
        epoch_block: 10,
        ..Default::default()
    });
    // A full table of idle locks whose state is all on disk, as after a restart.
    t.restore_reservations(
        0,
        (0..4096).map(|i| (format!("old{i}"), Reservation::default())),
    );
    let full = t.locks.capacity();
    assert!(full >= 4096);
    let g = granted(t.acquire(0, req("new", "h", 1000, 0, "1")));
    let events = t.drain_events();
    assert!(
        matches!(&events[..], [Event::Forgotten { count: 4096, .. }]),
        "{events:?}"
    );
    assert!(g.epoch > 0 && t.knows("new") && !t.knows("old0"));
    assert_eq!(t.lock_count(), 1);
    assert!(
        t.locks.capacity() < full / 4,
        "{} slots kept for one lock",
        t.locks.capacity()
    );
}

#[test]
fn a_full_table_forgets_idle_locks_and_new_epochs_continue_above_them() {
    let mut t = LockTable::new(TableConfig {
        max_locks: 2,
        epoch_block: 10,
        ..Default::default()
    });
    let a = granted(t.acquire(0, req("a", "h", 10_000, 0, "1")));
    t.confirm(0, "a", a.reserve.unwrap(), a.generation);
    let b = granted(t.acquire(0, req("b", "h", 10_000, 0, "2")));
    t.confirm(0, "b", b.reserve.unwrap(), b.generation);
    // Full, and both held: a third lock is refused and nothing is forgotten.
    assert_eq!(
        t.acquire(0, req("c", "h", 10_000, 0, "3")),
        AcquireOutcome::QuotaExceeded {
            resource: QuotaResource::Locks,
            limit: 2
        }
    );
    assert!(t.drain_events().is_empty());
    // `a` is released and marked idle on disk: it can go. A second later (the sweep of a
    // full table waits that long after one that freed too little), `c` finds room.
    t.release(10, "1").unwrap();
    assert!(matches!(&t.drain_events()[..], [Event::Idle { lock, .. }] if lock == "a"));
    let c = granted(t.acquire(1000, req("c", "h", 10_000, 0, "3")));
    let events = t.drain_events();
    assert!(
        events.contains(&Event::Forgotten {
            count: 1,
            floor: 10
        }),
        "{events:?}"
    );
    assert!(!t.knows("a") && t.knows("b") && t.knows("c"));
    // Epochs of locks the table no longer knows continue above everything forgotten.
    assert_eq!(c.epoch, 11);
    t.confirm(1000, "c", c.reserve.unwrap(), c.generation);
    t.release(1000, "3").unwrap();
    t.release(1000, "2").unwrap();
    t.drain_events();
    let again = granted(t.acquire(2000, req("a", "h", 100, 0, "4")));
    assert!(again.epoch > 10, "{again:?}");
    assert!(
        again.reserve.is_some(),
        "a lock met again needs its reservation written"
    );
}

/// A lock whose last lease expired leaves a full table like a released one: a principal
/// that fills the table with short leases and lets them run out does not lock every new
/// name out for good.
#[test]
fn a_full_table_forgets_locks_whose_leases_expired() {
    let mut t = LockTable::new(TableConfig {
        max_locks: 3,
        epoch_block: 10,
        ..Default::default()
    });
    for (i, lock) in ["a", "b", "c"].into_iter().enumerate() {
        let g = granted(t.acquire(0, req(lock, "h", 300, 0, &i.to_string())));
        t.confirm(0, lock, g.reserve.unwrap(), g.generation);
    }
    assert!(matches!(
        t.acquire(0, req("d", "h", 300, 0, "9")),
        AcquireOutcome::QuotaExceeded { .. }
    ));
    // The leases run out (each lock's timer settles it); none was released.
    t.poll(300);
    let events = t.drain_events();
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Expired { .. }))
            .count(),
        3,
        "{events:?}"
    );
    let d = granted(t.acquire(1300, req("d", "h", 300, 0, "10")));
    let events = t.drain_events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Forgotten { count: 3, .. })),
        "{events:?}"
    );
    assert!(d.epoch > 1 && d.reserve.is_some(), "{d:?}");
    // A forgotten lock met again continues above its epochs, with a durable write first.
    let a = granted(t.acquire(1300, req("a", "h", 300, 0, "11")));
    assert!(a.epoch > 1 && a.reserve.is_some(), "{a:?}");
}

#[test]
fn the_restart_block_follows_the_leases_since_the_lock_was_last_idle() {
    let mut t = LockTable::new(TableConfig {
        epoch_block: 100,
        ..Default::default()
    });
    // One hour-long lease, released.
    let long = granted(t.acquire(0, req("L", "a", 3_600_000, 0, "1")));
    t.confirm(0, "L", long.reserve.unwrap(), long.generation);
    t.release(10, "1").unwrap();
    let idle = t.drain_events();
    assert!(
        matches!(&idle[..], [Event::Idle { reservation, .. }] if reservation.max_ttl_ms == 0 && !reservation.active)
    );
    // The next lease needs a new reservation, sized for itself only.
    let short = granted(t.acquire(20, req("L", "b", 5_000, 0, "2")));
    let r = short
        .reserve
        .expect("an idle lock writes its reservation first");
    assert_eq!((r.max_ttl_ms, r.active), (5_000, true));
}

/// Found by the simulator (seeds 523 and 1716): a reservation whose write was queued
/// before an idle marker reaches the disk and is then overwritten by the marker; confirming
/// it late must not make the table believe in its TTL.
#[test]
fn a_reservation_confirmed_after_the_idle_marker_that_followed_it_is_ignored() {
    let mut t = LockTable::new(TableConfig {
        epoch_block: 10,
        idle_grace_ms: 1000,
        ..Default::default()
    });
    let a = granted(t.acquire(0, req("L", "a", 100, 0, "a")));
    t.confirm(0, "L", a.reserve.unwrap(), a.generation);
    t.release(1, "a").unwrap();
    // B needs a longer TTL: a reservation whose write is slow, so slow that B expires.
    let b = granted(t.acquire(2, req("L", "b", 300, 0, "b")));
    let slow = b.reserve.expect("a longer TTL needs a new reservation");
    t.poll(302);
    // The lock stays idle through the grace: the idle marker is queued (after B's).
    t.poll(1302);
    let events = t.drain_events();
    assert!(
        events.iter().any(|e| matches!(e, Event::Idle { .. })),
        "{events:?}"
    );
    // C is granted on a reservation of its own, queued after the marker.
    let c = granted(t.acquire(1303, req("L", "c", 50, 0, "c")));
    let own = c.reserve.expect("an idle lock needs a reservation");
    assert_eq!(own.max_ttl_ms, 50);
    // The disk now says: B's (300 ms), then the marker (inactive, 0), then C's (50 ms).
    // B's confirmation arrives only now; it must change nothing.
    t.confirm(1303, "L", slow, b.generation);
    t.confirm(1303, "L", own, c.generation);
    t.release(1304, "c").unwrap();
    let d = granted(t.acquire(1305, req("L", "d", 200, 0, "d")));
    assert!(
        d.reserve.is_some(),
        "a 200 ms lease answered on a 50 ms reservation"
    );
}

fn in_session(lock: &str, session: &str, wait_ms: Millis, id: &str) -> AcquireRequest {
    AcquireRequest {
        session: Some(session.into()),
        // Ignored in a session: the session's TTL applies.
        ttl_ms: 1,
        ..req(lock, "s", 0, wait_ms, id)
    }
}

fn session(id: &str, ttl_ms: Millis) -> SessionRequest {
    SessionRequest {
        session_id: id.into(),
        holder: "s".into(),
        ttl_ms,
        owner: None,
    }
}

#[test]
fn a_value_rides_with_its_lease_and_its_holder_replaces_it() {
    let mut t = LockTable::new(TableConfig::default());
    let a = granted(t.acquire(
        0,
        AcquireRequest {
            value: Some(b"10.0.0.1:80".to_vec()),
            ..req("L", "a", 1000, 0, "l1")
        },
    ));
    assert_eq!(a.value.as_deref(), Some(&b"10.0.0.1:80"[..]));
    let seen = |t: &mut LockTable, now| t.status(now, "L").lease.and_then(|l| l.value);
    assert_eq!(seen(&mut t, 1).as_deref(), Some(&b"10.0.0.1:80"[..]));
    let view = t.proclaim(2, "l1", Some(b"10.0.0.2:80".to_vec())).unwrap();
    assert_eq!(
        (view.epoch, view.remaining_ms),
        (1, 998),
        "nothing else changes"
    );
    assert_eq!(seen(&mut t, 3).as_deref(), Some(&b"10.0.0.2:80"[..]));
    // A waiter's value arrives with its grant; the old lease cannot proclaim any more.
    let AcquireOutcome::Queued(_) = t.acquire(
        4,
        AcquireRequest {
            value: Some(b"b".to_vec()),
            ..req("L", "b", 1000, 5000, "l2")
        },
    ) else {
        panic!()
    };
    t.release(5, "l1").unwrap();
    assert!(
        matches!(&t.drain_events()[..], [Event::Granted { grant, .. }] if grant.value.as_deref() == Some(&b"b"[..]))
    );
    assert_eq!(t.proclaim(6, "l1", None), Err(LeaseExpired));
    assert_eq!(seen(&mut t, 6).as_deref(), Some(&b"b"[..]));
    t.proclaim(7, "l2", None).unwrap();
    assert_eq!(seen(&mut t, 8), None);
    // An expired lease cannot proclaim either.
    assert_eq!(t.proclaim(2000, "l2", Some(vec![1])), Err(LeaseExpired));
}

#[test]
fn each_lease_brings_its_own_lock_delay() {
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 100,
        epoch_block: 10,
        ..Default::default()
    });
    let a = granted(t.acquire(
        0,
        AcquireRequest {
            lock_delay_ms: Some(500),
            ..req("L", "a", 1000, 0, "l1")
        },
    ));
    assert_eq!(a.lock_delay_ms, 500);
    assert_eq!(t.status(1, "L").lease.unwrap().lock_delay_ms, 500);
    // The restart block must cover the TTL and the 400 ms above the default delay.
    assert_eq!(a.reserve.map(|r| r.max_ttl_ms), Some(1400));
    t.confirm(0, "L", a.reserve.unwrap(), a.generation);
    // Expired at 1000: its own delay, not the default, keeps the lock until 1500.
    assert_eq!(
        t.acquire(1499, req("L", "b", 1000, 0, "l2")),
        AcquireOutcome::Held {
            holder: None,
            retry_after_ms: 1
        }
    );
    let b = granted(t.acquire(
        1500,
        AcquireRequest {
            lock_delay_ms: Some(0),
            ..req("L", "b", 1000, 0, "l2")
        },
    ));
    assert_eq!(b.lock_delay_ms, 0);
    // No delay after b's expiry.
    granted(t.acquire(2500, req("L", "c", 1000, 0, "l3")));
    // Without a delay of its own a lease gets the default; a shorter one than the default
    // needs no more reservation than the TTL.
    let d = granted(t.acquire(0, req("M", "d", 1000, 0, "l4")));
    assert_eq!(
        (d.lock_delay_ms, d.reserve.map(|r| r.max_ttl_ms)),
        (100, Some(1000))
    );
}

#[test]
fn a_session_renews_its_leases_at_once_and_they_expire_with_it() {
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 50,
        ..Default::default()
    });
    t.create_session(0, session("s1", 1000)).unwrap();
    let a = granted(t.acquire(10, in_session("A", "s1", 0, "a")));
    granted(t.acquire(20, in_session("B", "s1", 0, "b")));
    assert_eq!((a.ttl_ms, a.session.as_deref()), (1000, Some("s1")));
    // Both leases share the session's deadline (1000), not their own grant time + TTL.
    assert_eq!(t.lease(30, "a").unwrap().remaining_ms, 970);
    assert_eq!(t.lease(30, "b").unwrap().remaining_ms, 970);
    // One keepalive renews both.
    let view = t.keepalive_session(900, "s1").unwrap();
    assert_eq!(view.leases.len(), 2);
    assert_eq!(t.lease(950, "a").unwrap().remaining_ms, 950);
    assert_eq!(t.lease(950, "b").unwrap().remaining_ms, 950);
    // A lease's own keepalive renews its whole session.
    t.keepalive(1000, "b").unwrap();
    assert_eq!(t.lease(1000, "a").unwrap().remaining_ms, 1000);
    // Releasing one leaves the other in the session.
    t.release(1100, "b").unwrap();
    assert_eq!(t.session(1100, "s1").unwrap().leases.len(), 1);
    let b2 = granted(t.acquire(1100, in_session("B", "s1", 0, "b2")));
    assert_eq!(b2.epoch, 2);
    t.drain_events();
    // No renewal: at 2000 the session ends, its end first, then both leases at once.
    t.poll(1999);
    assert!(t.drain_events().is_empty());
    assert_eq!(t.next_wakeup(), Some(2000));
    t.poll(2000);
    let events = t.drain_events();
    assert!(
        matches!(&events[0], Event::SessionExpired { session_id, .. } if session_id == "s1"),
        "{events:?}"
    );
    let expired: Vec<&str> = events[1..]
        .iter()
        .filter_map(|e| match e {
            Event::Expired { lease_id, .. } => Some(lease_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(expired.len(), 2, "{events:?}");
    assert!(expired.contains(&"a") && expired.contains(&"b2"));
    assert_eq!(t.live_leases(), 0);
    assert_eq!(t.live_sessions(), 0);
    // Each lock waits out its lock-delay, as after any expiry.
    assert!(matches!(
        t.acquire(2049, req("A", "x", 100, 0, "x")),
        AcquireOutcome::Held { holder: None, .. }
    ));
    granted(t.acquire(2050, req("A", "x", 100, 0, "x")));
    // The session is gone for good.
    assert_eq!(t.keepalive_session(2050, "s1"), Err(SessionError::Expired));
    assert_eq!(
        t.acquire(2050, in_session("C", "s1", 0, "c")),
        AcquireOutcome::NoSession
    );
}

#[test]
fn a_lock_looked_at_after_its_session_ran_out_ends_the_whole_session_first() {
    let mut t = LockTable::new(TableConfig::default());
    t.create_session(0, session("s1", 100)).unwrap();
    granted(t.acquire(0, in_session("A", "s1", 0, "a")));
    granted(t.acquire(0, in_session("B", "s1", 0, "b")));
    // No poll: a status call on A, past the deadline, is the first to notice.
    assert_eq!(t.status(150, "A").lease, None);
    let events = t.drain_events();
    assert!(
        matches!(&events[0], Event::SessionExpired { .. }),
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Expired { .. }))
            .count(),
        2,
        "{events:?}"
    );
    assert_eq!(t.live_leases(), 0);
}

#[test]
fn closing_a_session_releases_its_leases_and_drops_its_waiters() {
    let mut t = LockTable::new(TableConfig {
        lock_delay_ms: 1000,
        ..Default::default()
    });
    t.create_session(0, session("s1", 5000)).unwrap();
    granted(t.acquire(0, in_session("A", "s1", 0, "a")));
    granted(t.acquire(0, req("B", "other", 5000, 0, "other")));
    // s1 waits for B; someone else waits for A.
    let AcquireOutcome::Queued(mine) = t.acquire(1, in_session("B", "s1", 10_000, "b")) else {
        panic!()
    };
    let AcquireOutcome::Queued(theirs) = t.acquire(2, req("A", "x", 1000, 10_000, "x")) else {
        panic!()
    };
    let closed = t.close_session(3, "s1").unwrap();
    assert_eq!(closed.leases.len(), 1);
    assert_eq!(closed.leases[0].lease_id, "a");
    let events = t.drain_events();
    // A passes to its next waiter at once (a release: no lock-delay)...
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Granted { ticket, .. } if *ticket == theirs)),
        "{events:?}"
    );
    // ...and the session's waiter for B is out of line.
    assert!(
        events.contains(&Event::SessionGone { ticket: mine }),
        "{events:?}"
    );
    assert_eq!(t.status(3, "B").waiters, 0);
    assert_eq!(t.close_session(4, "s1"), Err(SessionError::Expired));
    t.release(5, "other").unwrap();
    assert!(t.drain_events().is_empty(), "nobody left waiting for B");
}

#[test]
fn a_waiter_whose_session_ended_is_passed_over() {
    let mut t = LockTable::new(TableConfig::default());
    t.create_session(0, session("s1", 100)).unwrap();
    granted(t.acquire(0, req("L", "a", 1000, 0, "a")));
    let AcquireOutcome::Queued(mine) = t.acquire(0, in_session("L", "s1", 5000, "m")) else {
        panic!()
    };
    let AcquireOutcome::Queued(next) = t.acquire(0, req("L", "n", 1000, 5000, "n")) else {
        panic!()
    };
    // The session runs out while waiting.
    t.poll(100);
    assert!(t
        .drain_events()
        .contains(&Event::SessionGone { ticket: mine }));
    t.release(200, "a").unwrap();
    assert!(matches!(&t.drain_events()[..], [Event::Granted { ticket, .. }] if *ticket == next));
}

#[test]
fn a_session_is_one_lease_of_its_owners_quota_and_sessions_are_bounded() {
    let mut t = LockTable::new(TableConfig {
        max_sessions: 2,
        ..Default::default()
    });
    let owner = Some(Owner {
        name: "p".into(),
        max_leases: 2,
        max_waiters: 1,
    });
    let mine = |id: &str| SessionRequest {
        owner: owner.clone(),
        ..session(id, 1000)
    };
    t.create_session(0, mine("s1")).unwrap();
    granted(t.acquire(
        0,
        AcquireRequest {
            owner: owner.clone(),
            ..in_session("A", "s1", 0, "a")
        },
    ));
    // The session and its lease: the owner's two.
    assert_eq!(
        t.acquire(0, owned("B", "p", 0, "b")),
        AcquireOutcome::QuotaExceeded {
            resource: QuotaResource::LeasesPerPrincipal,
            limit: 2
        }
    );
    assert_eq!(
        t.create_session(0, mine("s2")),
        Err(SessionError::QuotaExceeded {
            resource: QuotaResource::LeasesPerPrincipal,
            limit: 2
        })
    );
    // Closing gives both places back.
    t.close_session(1, "s1").unwrap();
    granted(t.acquire(1, owned("B", "p", 0, "b")));
    t.create_session(1, mine("s2")).unwrap();
    t.create_session(1, session("s3", 1000)).unwrap();
    assert_eq!(
        t.create_session(1, session("s4", 1000)),
        Err(SessionError::QuotaExceeded {
            resource: QuotaResource::Sessions,
            limit: 2
        })
    );
    // An expired session frees its place.
    t.poll(1001);
    t.create_session(1001, session("s4", 1000)).unwrap();
    assert_eq!(
        t.create_session(1001, session("s4", 1)),
        Err(SessionError::Duplicate)
    );
}

#[test]
fn a_restart_brings_back_sessions_with_their_leases_and_orphans_expire_alone() {
    let mut t = LockTable::new(TableConfig::default());
    t.restore_sessions(100, [("s1".to_string(), "s".to_string(), 1000)]);
    let lease = |lock: &str, id: &str, session: Option<&str>| Grant {
        lock: lock.into(),
        holder: "s".into(),
        epoch: 3,
        lease_id: id.into(),
        ttl_ms: 1000,
        value: Some(b"v".to_vec()),
        lock_delay_ms: 0,
        session: session.map(str::to_owned),
        ..Default::default()
    };
    t.restore(
        100,
        [],
        [
            lease("A", "a", Some("s1")),
            lease("B", "b", Some("s1")),
            // Its session's record is gone: honoured for its own TTL, on its own.
            lease("C", "c", Some("gone")),
        ],
    );
    let view = t.session(100, "s1").unwrap();
    assert_eq!(view.leases.len(), 2);
    assert_eq!(view.leases[0].value.as_deref(), Some(&b"v"[..]));
    t.keepalive_session(900, "s1").unwrap();
    assert_eq!(t.lease(1000, "a").unwrap().remaining_ms, 900);
    assert_eq!(t.lease(1000, "c").unwrap().session, None);
    t.poll(1100);
    assert_eq!(t.lease(1100, "c"), None, "the orphan expired after its TTL");
    assert!(t.lease(1100, "b").is_some(), "the session's leases live on");
    assert_eq!(granted(t.acquire(1100, req("C", "x", 10, 0, "x"))).epoch, 4);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        lock: u8,
        wait: Millis,
        ttl: Millis,
        /// A lock-delay of its own (None: the table's).
        delay: Option<Millis>,
        /// In the nth session created (if there is one).
        session: Option<u8>,
    },
    Release(u8),
    Keepalive(u8),
    Cancel(u8),
    Advance(Millis),
    Crash,
    CreateSession(Millis),
    KeepaliveSession(u8),
    CloseSession(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (
            0u8..3,
            prop_oneof![Just(0), 1u64..300],
            1u64..200,
            prop_oneof![Just(None), (0u64..80).prop_map(Some)],
            prop_oneof![2 => Just(None), 1 => (0u8..4).prop_map(Some)],
        )
            .prop_map(|(lock, wait, ttl, delay, session)| Op::Acquire { lock, wait, ttl, delay, session }),
        4 => (0u8..16).prop_map(Op::Release),
        4 => (0u8..16).prop_map(Op::Keepalive),
        2 => (0u8..16).prop_map(Op::Cancel),
        6 => (0u64..150).prop_map(Op::Advance),
        1 => Just(Op::Crash),
        2 => (1u64..200).prop_map(Op::CreateSession),
        3 => (0u8..4).prop_map(Op::KeepaliveSession),
        1 => (0u8..4).prop_map(Op::CloseSession),
    ]
}

/// What the model knows about each lock: last epoch answered, the live lease (id and
/// deadline) or None once released, and whether a crash happened since the last grant.
type Model = HashMap<String, (Epoch, Option<(String, Millis)>, bool)>;

/// The model's sessions: id -> (deadline, TTL), while the model believes it live.
type Sessions = HashMap<String, (Millis, Millis)>;

/// Moves the deadline of every live lease of `session` in the model to `deadline`.
fn renew_in_model(
    model: &mut Model,
    session_of: &HashMap<String, String>,
    session: &str,
    deadline: Millis,
) {
    for entry in model.values_mut() {
        if let Some((id, d)) = &mut entry.1 {
            if session_of.get(id.as_str()).map(String::as_str) == Some(session) {
                *d = deadline;
            }
        }
    }
}

proptest! {
    /// Random interleavings of acquire/wait/release/keepalive/cancel/time, sessions
    /// (create, acquire in, renew, close, expire) and crashes (the table rebuilt from
    /// durable reservations only, lazy idle markers possibly lost), with lock-delays
    /// chosen per lease: epochs per lock strictly increase (by one between crashes), a
    /// lock is never granted while an earlier lease of it may be live, each lease's own
    /// lock-delay is respected (across crashes too), waiters are served in arrival order,
    /// every grant answered without a disk write is covered by a durable reservation
    /// (its TTL and its lock-delay beyond the default), a session's leases live and die
    /// with their session (renewed together, expired together, released together).
    #[test]
    fn grants_are_exclusive_and_epochs_increase(
        ops in proptest::collection::vec(op(), 1..300),
        delay in 0u64..50,
        block in 1u64..5,
        lose_idle in any::<bool>(),
        grace in prop_oneof![Just(0u64), 1u64..40],
        max_locks in 0usize..4,
    ) {
        let config = TableConfig { lock_delay_ms: delay, epoch_block: block, idle_grace_ms: grace, max_locks, max_waiters_per_lock: 0, max_sessions: 0 };
        // The floor the lazily recorded `Forgotten` events left on disk, and the table's.
        let mut durable_floor: Epoch = 0;
        let mut floor: Epoch = 0;
        // A lock the table has not met starts above its floor, not at 1.
        let meet = |model: &mut Model, lock: &str, floor: Epoch| {
            if floor > 0 {
                model.entry(lock.to_owned()).or_insert((0, None, true));
            }
        };
        let mut t = LockTable::new(config);
        let mut now = 0;
        let mut next_id = 0u32;
        let mut model: Model = HashMap::new();
        let mut durable: HashMap<String, Reservation> = HashMap::new();
        let mut lease_ids: Vec<String> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        let mut queued_order: HashMap<String, Vec<Ticket>> = HashMap::new();
        let mut ttl_of: HashMap<String, Millis> = HashMap::new();
        // Each lease's lock-delay, and the session of each lease id (granted or asked).
        let mut delay_of: HashMap<String, Millis> = HashMap::new();
        let mut session_of: HashMap<String, String> = HashMap::new();
        let mut sessions: Sessions = HashMap::new();
        let mut session_ids: Vec<String> = Vec::new();

        let check_grant = |t: &mut LockTable, g: &Grant, now: Millis, model: &mut Model, durable: &mut HashMap<String, Reservation>, delay_of: &HashMap<String, Millis>, sessions: &Sessions| -> Result<(), TestCaseError> {
            let entry = model.entry(g.lock.clone()).or_insert((0, None, false));
            prop_assert!(g.epoch > entry.0, "epoch {} not above {}", g.epoch, entry.0);
            if !entry.2 {
                prop_assert_eq!(g.epoch, entry.0 + 1, "epochs must count up by one");
            }
            if let Some((prev, deadline)) = &entry.1 {
                prop_assert!(*deadline <= now, "granted {} while lease live until {}", g.lock, deadline);
                let prev_delay = delay_of.get(prev).copied().unwrap_or(delay);
                prop_assert!(deadline + prev_delay <= now, "lock-delay {} of {} not respected", prev_delay, prev);
                // The previous lease expired (it was not released): its record's removal
                // is lazy, so this grant must be durable before it is answered.
                prop_assert!(g.reserve.is_some(), "grant after an expiry answered without a durable write");
            }
            prop_assert_eq!(g.lock_delay_ms, delay_of.get(&g.lease_id).copied().unwrap_or(delay));
            let needed = g.ttl_ms + g.lock_delay_ms.saturating_sub(delay);
            let d = durable.entry(g.lock.clone()).or_default();
            match g.reserve {
                Some(r) => {
                    prop_assert!(r.active && r.ceiling >= g.epoch && r.max_ttl_ms >= needed);
                    d.merge(r);
                    t.confirm(now, &g.lock, r, g.generation);
                }
                None => prop_assert!(d.covers(g.epoch, needed), "unrecorded grant {:?} not covered by {:?}", g, d),
            }
            let deadline = match &g.session {
                Some(s) => {
                    let (deadline, ttl) = sessions.get(s).copied().unwrap_or((0, 0));
                    prop_assert!(deadline > now, "granted in session {} that ended at {}", s, deadline);
                    prop_assert_eq!(g.ttl_ms, ttl, "a session lease has its session's TTL");
                    deadline
                }
                None => now + g.ttl_ms,
            };
            *entry = (g.epoch, Some((g.lease_id.clone(), deadline)), false);
            Ok(())
        };

        for op in ops {
            // What a sweep may forget during this step (a lock it forgets must be one the
            // model knows: the count of a `Forgotten` event checks that).
            let known_before: Vec<String> = model.keys().filter(|l| t.knows(l)).cloned().collect();
            let mut direct: Option<Grant> = None;
            match op {
                Op::Acquire { lock, wait, ttl, delay: own_delay, session } => {
                    let id = format!("lease{next_id}");
                    next_id += 1;
                    ttl_of.insert(id.clone(), ttl);
                    delay_of.insert(id.clone(), own_delay.unwrap_or(delay));
                    let session = session.and_then(|i| session_ids.get(i as usize).cloned());
                    let name = format!("L{lock}");
                    let mut request = req(&name, "h", ttl, wait, &id);
                    request.lock_delay_ms = own_delay;
                    if let Some(s) = &session {
                        session_of.insert(id.clone(), s.clone());
                        request.session = Some(s.clone());
                    }
                    match t.acquire(now, request) {
                        // Checked after the events the call produced (a sweep, an expiry).
                        AcquireOutcome::Granted(g) => direct = Some(g),
                        AcquireOutcome::Queued(ticket) => { tickets.push(ticket); queued_order.entry(name).or_default().push(ticket); }
                        AcquireOutcome::Held { .. } => {}
                        AcquireOutcome::QuotaExceeded { resource, .. } => {
                            prop_assert_eq!(resource, QuotaResource::Locks);
                            prop_assert!(max_locks > 0 && t.lock_count() >= max_locks);
                        }
                        AcquireOutcome::NoSession => {
                            let s = session.as_deref().unwrap_or("");
                            prop_assert!(sessions.get(s).is_none_or(|(deadline, _)| *deadline <= now), "live session {} refused", s);
                        }
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
                            match session_of.get(&id).cloned() {
                                // A session lease renews its whole session.
                                Some(s) => {
                                    let (deadline, ttl) = sessions.get_mut(&s).unwrap();
                                    *deadline = now + *ttl;
                                    let d = *deadline;
                                    renew_in_model(&mut model, &session_of, &s, d);
                                }
                                None => *deadline = now + ttl_of[&id],
                            }
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
                Op::Crash => {
                    t = LockTable::new(config);
                    floor = durable_floor;
                    t.set_epoch_floor(durable_floor);
                    t.restore_reservations(now, durable.iter().map(|(k, v)| (k.clone(), *v)));
                    tickets.clear();
                    queued_order.clear();
                    lease_ids.clear();
                    // No session record survives here (records are the issuer's business).
                    sessions.clear();
                    session_ids.clear();
                    for entry in model.values_mut() { entry.2 = true; }
                }
                Op::CreateSession(ttl) => {
                    let id = format!("session{next_id}");
                    next_id += 1;
                    let view = t.create_session(now, SessionRequest { session_id: id.clone(), holder: "h".into(), ttl_ms: ttl, owner: None });
                    prop_assert!(view.is_ok());
                    sessions.insert(id.clone(), (now + ttl, ttl));
                    session_ids.push(id);
                }
                Op::KeepaliveSession(i) => {
                    if let Some(id) = session_ids.get(i as usize).cloned() {
                        let was = sessions.get(&id).copied();
                        match t.keepalive_session(now, &id) {
                            Ok(view) => {
                                let (deadline, ttl) = was.unwrap();
                                prop_assert!(deadline > now, "renewed a session that ended at {}", deadline);
                                sessions.insert(id.clone(), (now + ttl, ttl));
                                renew_in_model(&mut model, &session_of, &id, now + ttl);
                                for lease in &view.leases {
                                    prop_assert_eq!(lease.remaining_ms, ttl);
                                    prop_assert_eq!(session_of.get(&lease.lease_id), Some(&id));
                                }
                            }
                            Err(e) => {
                                prop_assert_eq!(e, SessionError::Expired);
                                prop_assert!(was.is_none_or(|(deadline, _)| deadline <= now), "live session {} not renewed", id);
                            }
                        }
                    }
                }
                Op::CloseSession(i) => {
                    if let Some(id) = session_ids.get(i as usize).cloned() {
                        let was = sessions.remove(&id);
                        match t.close_session(now, &id) {
                            Ok(view) => {
                                prop_assert!(was.is_some_and(|(deadline, _)| deadline > now));
                                // Exactly the session's live leases were released.
                                let mut live: Vec<String> = model.values().filter_map(|e| e.1.as_ref())
                                    .filter(|(l, _)| session_of.get(l) == Some(&id)).map(|(l, _)| l.clone()).collect();
                                let mut released: Vec<String> = view.leases.iter().map(|l| l.lease_id.clone()).collect();
                                live.sort();
                                released.sort();
                                prop_assert_eq!(&live, &released);
                                for lease in view.leases {
                                    model.get_mut(&lease.lock).unwrap().1 = None;
                                }
                            }
                            Err(e) => {
                                prop_assert_eq!(e, SessionError::Expired);
                                prop_assert!(was.is_none_or(|(deadline, _)| deadline <= now));
                            }
                        }
                    }
                }
            }
            let mut ended_sessions = Vec::new();
            for event in t.drain_events() {
                match event {
                    Event::Granted { ticket, grant } => {
                        meet(&mut model, &grant.lock, floor);
                        check_grant(&mut t, &grant, now, &mut model, &mut durable, &delay_of, &sessions)?;
                        let q = queued_order.get_mut(&grant.lock).unwrap();
                        prop_assert_eq!(q.first().copied(), Some(ticket), "waiters out of order");
                        q.remove(0);
                        lease_ids.push(grant.lease_id);
                    }
                    Event::TimedOut { ticket, .. } => {
                        for q in queued_order.values_mut() { q.retain(|&x| x != ticket); }
                    }
                    Event::SessionGone { ticket } => {
                        for q in queued_order.values_mut() { q.retain(|&x| x != ticket); }
                    }
                    Event::SessionExpired { session_id, .. } => {
                        let (deadline, _) = sessions.remove(&session_id).unwrap();
                        prop_assert!(deadline <= now, "session {} expired early", session_id);
                        ended_sessions.push(session_id);
                    }
                    Event::Expired { lock, lease_id, .. } => {
                        let entry = model.get_mut(&lock).unwrap();
                        let (live_id, deadline) = entry.1.clone().unwrap();
                        prop_assert_eq!(live_id, lease_id);
                        prop_assert!(deadline <= now, "expired early");
                    }
                    Event::Idle { lock, reservation } => {
                        prop_assert!(!reservation.active);
                        prop_assert_eq!(reservation.max_ttl_ms, 0);
                        if !lose_idle {
                            let d = durable.get_mut(&lock).unwrap();
                            // As the store writes it: an inactive reservation's TTL is its own.
                            d.active = false;
                            d.max_ttl_ms = 0;
                        }
                    }
                    Event::Forgotten { count, floor: raised } => {
                        prop_assert!(raised >= floor);
                        floor = raised;
                        // The locks the table held before this step and holds no more.
                        let locks: Vec<String> =
                            known_before.iter().filter(|l| !t.knows(l)).cloned().collect();
                        prop_assert_eq!(locks.len(), count);
                        for lock in &locks {
                            // Only an idle lock with nothing live may be forgotten...
                            let entry = model.get_mut(lock).unwrap();
                            prop_assert!(entry.1.as_ref().is_none_or(|(_, deadline)| *deadline <= now));
                            // ...and no epoch of it is above the floor.
                            prop_assert!(entry.0 <= raised, "forgot {} at {} above floor {}", lock, entry.0, raised);
                            // Its next epoch continues above the floor, not by one.
                            entry.2 = true;
                            if !lose_idle {
                                durable.remove(lock);
                            }
                        }
                        if !lose_idle {
                            durable_floor = durable_floor.max(raised);
                        }
                    }
                }
            }
            if let Some(g) = direct {
                meet(&mut model, &g.lock, floor);
                check_grant(&mut t, &g, now, &mut model, &mut durable, &delay_of, &sessions)?;
                lease_ids.push(g.lease_id);
            }
            // A session that ended took every one of its leases with it, in the same call.
            for ended in ended_sessions {
                for view in model.keys().cloned().collect::<Vec<_>>() {
                    let live = t.status(now, &view).lease;
                    prop_assert!(live.as_ref().and_then(|l| l.session.as_ref()) != Some(&ended), "lease of ended session {} lives on", ended);
                }
                prop_assert!(!model.values().any(|e| e.1.as_ref().is_some_and(|(l, d)| session_of.get(l) == Some(&ended) && *d > now)));
            }
        }
    }
}

/// A lock reports one epoch: its holder's, or the last one granted; never a reservation's
/// ceiling, also after a restart, while the next grant still goes above the ceiling.
#[test]
fn a_lock_reports_the_epoch_granted_never_the_ceiling() {
    let config = TableConfig {
        epoch_block: 1024,
        idle_grace_ms: 0,
        ..Default::default()
    };
    let mut t = LockTable::new(config);
    let first = granted(t.acquire(0, req("L", "a", 100, 0, "l1")));
    assert_eq!(first.reserve.map(|r| r.ceiling), Some(1024));
    assert_eq!(t.status(1, "L").epoch, 1);
    t.release(2, "l1").unwrap();
    assert_eq!(
        t.status(3, "L").epoch,
        1,
        "a free lock: the last one granted"
    );

    // A restart: the records say epoch 1 was granted, and the reservation reaches 1024.
    let mut t = LockTable::new(config);
    t.restore(10, [("L".to_string(), 1)], []);
    t.restore_reservations(
        10,
        [(
            "L".to_string(),
            Reservation {
                ceiling: 1024,
                max_ttl_ms: 100,
                active: false,
            },
        )],
    );
    assert_eq!(t.status(10, "L").epoch, 1);
    assert_eq!(
        t.status(10, "L").granted_up_to,
        1024,
        "what may have been granted"
    );
    let next = granted(t.acquire(20, req("L", "b", 100, 0, "l2")));
    assert_eq!(next.epoch, 1025, "the next grant goes above the ceiling");
    assert_eq!(t.status(21, "L").epoch, 1025);
    assert_eq!(t.status(21, "L").granted_up_to, 1025);
    assert_eq!(t.status(21, "never").epoch, 0);
}

//! The core driven directly, with chosen times: no clock, no disk, no runtime.

use super::*;

const TTL: Millis = 1_000;

fn config() -> TableConfig {
    TableConfig {
        lock_delay_ms: 0,
        epoch_block: 4,
        ..TableConfig::default()
    }
}

fn req(holder: &str, wait_ms: Millis) -> AcquireRequest {
    AcquireRequest {
        lock: "L".into(),
        holder: holder.into(),
        ttl_ms: TTL,
        wait_ms,
        lease_id: format!("lease-{holder}"),
        ..AcquireRequest::default()
    }
}

fn observed() -> IssuerCore {
    let mut core = IssuerCore::new(config());
    core.observe();
    core
}

/// The durable writes among `actions`.
fn writes(actions: &[Action]) -> Vec<(WriteId, Write)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Write { id, write } => Some((*id, write.clone())),
            _ => None,
        })
        .collect()
}

/// The replies among `actions`.
fn replies(actions: &[Action]) -> Vec<(ReqId, Reply)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Reply { to, reply } => Some((*to, reply.clone())),
            _ => None,
        })
        .collect()
}

fn granted(reply: &Reply) -> &Grant {
    match reply {
        Reply::Acquire(Ok(grant)) => grant,
        other => panic!("not a grant: {other:?}"),
    }
}

fn notes(actions: &[Action]) -> Vec<(LeaseChange, String, Epoch)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Note(n) => Some((n.change, n.holder.clone(), n.epoch)),
            _ => None,
        })
        .collect()
}

/// Grants `holder` the free lock "L" at `now` and completes its reservation.
fn grant_now(core: &mut IssuerCore, now: Millis, to: ReqId, holder: &str) -> Grant {
    core.acquire(now, to, req(holder, 0));
    let actions = core.take_actions();
    let [(id, Write::Reserve { .. })] = writes(&actions)[..] else {
        panic!("a first grant needs a reservation: {actions:?}");
    };
    core.written(now, id, Ok(()));
    let actions = core.take_actions();
    let [(answered, ref reply)] = replies(&actions)[..] else {
        panic!("answered once durable: {actions:?}");
    };
    assert_eq!(answered, to);
    granted(reply).clone()
}

#[test]
fn a_grant_needing_a_reservation_is_answered_only_once_it_is_durable() {
    let mut core = observed();
    core.acquire(10, 1, req("h0", 0));
    let actions = core.take_actions();
    assert!(
        replies(&actions).is_empty(),
        "nothing answered before the disk"
    );
    let written = writes(&actions);
    let [(
        id,
        Write::Reserve {
            lock,
            reservation,
            lease,
        },
    )] = &written[..]
    else {
        panic!("one reservation: {actions:?}");
    };
    assert_eq!(lock, "L");
    assert_eq!(reservation.ceiling, 4, "one block of epochs");
    assert!(reservation.active);
    assert_eq!((lease.epoch, lease.holder.as_str()), (1, "h0"));
    assert_eq!(
        notes(&actions),
        vec![(LeaseChange::Granted, "h0".into(), 1)]
    );
    assert_eq!(core.writes_in_flight(), 1);

    core.written(12, *id, Ok(()));
    let actions = core.take_actions();
    let [(1, ref reply)] = replies(&actions)[..] else {
        panic!("answered: {actions:?}");
    };
    assert_eq!(granted(reply).epoch, 1);
    assert_eq!(core.writes_in_flight(), 0);
}

#[test]
fn a_failed_reservation_withdraws_the_grant_and_burns_its_epoch() {
    let mut core = observed();
    core.acquire(0, 1, req("h0", 0));
    let [(id, _)] = writes(&core.take_actions())[..] else {
        panic!("one write");
    };
    let failure = StorageError::Failed("disk gone".into());
    core.written(1, id, Err(failure.clone()));
    let actions = core.take_actions();
    assert_eq!(
        replies(&actions),
        vec![(1, Reply::Acquire(Err(AcquireError::Storage(failure))))]
    );
    assert_eq!(
        notes(&actions),
        vec![(LeaseChange::Released, "h0".into(), 1)]
    );
    assert!(actions.contains(&Action::Lazy(LazyRecord::RemoveLease("lease-h0".into()))));
    assert_eq!(core.status(1, "L").lease, None, "the lock is free again");
    // The next grant does not reuse epoch 1.
    let next = grant_now(&mut core, 2, 2, "h1");
    assert_eq!(next.epoch, 2);
}

#[test]
fn a_hand_off_inside_the_reservation_is_answered_at_once_with_a_lazy_record() {
    let mut core = observed();
    let first = grant_now(&mut core, 0, 1, "h0");
    core.acquire(5, 2, req("h1", 5_000));
    let actions = core.take_actions();
    assert!(replies(&actions).is_empty(), "waiting in line");
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::SignAhead {
                to: 2,
                epoch: 2,
                ..
            }
        )),
        "the head of the line may have its token signed ahead: {actions:?}"
    );
    assert_eq!(core.census(), (1, 1));

    core.release(10, 3, &first.lease_id, None);
    let actions = core.take_actions();
    // The released lease's removal is queued before the hand-off's record.
    let lazies: Vec<&LazyRecord> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Lazy(r) => Some(r),
            _ => None,
        })
        .collect();
    assert!(
        matches!(lazies[..], [LazyRecord::RemoveLease(ref id), LazyRecord::Lease(ref r), ..]
        if id == "lease-h0" && r.holder == "h1" && r.epoch == 2)
    );
    // The waiter is answered without any durable write for its grant; the release
    // itself waits for its removal.
    let answered = replies(&actions);
    assert_eq!(answered.len(), 1, "{actions:?}");
    assert_eq!(answered[0].0, 2);
    assert_eq!(granted(&answered[0].1).epoch, 2);
    let written = writes(&actions);
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].1, Write::RemoveLease("lease-h0".into()));
    assert_eq!(
        notes(&actions),
        vec![
            (LeaseChange::Released, "h0".into(), 1),
            (LeaseChange::Granted, "h1".into(), 2),
        ]
    );
    core.written(11, written[0].0, Ok(()));
    let actions = core.take_actions();
    assert!(matches!(&replies(&actions)[..], [(3, Reply::Lease(Ok(v)))] if v.epoch == 1));
}

#[test]
fn a_grant_for_a_waiter_that_left_is_withdrawn() {
    let mut core = observed();
    let first = grant_now(&mut core, 0, 1, "h0");
    core.acquire(1, 2, req("h1", 5_000));
    core.take_actions();
    // The waiter is granted while its answer is on the way, then its caller leaves
    // and the shell reports the grant undeliverable.
    core.release(2, 3, &first.lease_id, None);
    let actions = core.take_actions();
    let handed = granted(&replies(&actions)[0].1).clone();
    core.undelivered(2, &handed.lease_id);
    let actions = core.take_actions();
    assert_eq!(
        notes(&actions),
        vec![(LeaseChange::Released, "h1".into(), 2)]
    );
    assert_eq!(core.status(2, "L").lease, None);

    // A waiter cancelled before its turn never gets the lock.
    let again = grant_now(&mut core, 3, 4, "h2");
    core.acquire(4, 5, req("h3", 5_000));
    core.cancel(4, 5);
    core.take_actions();
    assert_eq!(core.census(), (1, 0));
    core.release(5, 6, &again.lease_id, None);
    let actions = core.take_actions();
    assert!(replies(&actions).iter().all(|(to, _)| *to != 5));
    assert_eq!(core.status(5, "L").lease, None);
}

#[test]
fn timers_expire_leases_and_end_waits() {
    let mut core = observed();
    core.acquire(0, 1, req("h0", 0));
    let actions = core.take_actions();
    assert!(
        actions.contains(&Action::Timer { at: TTL }),
        "the lease's deadline is asked for: {actions:?}"
    );
    let [(id, _)] = writes(&actions)[..] else {
        panic!("one write");
    };
    core.written(1, id, Ok(()));
    core.take_actions();
    core.acquire(100, 2, req("h1", 300));
    let actions = core.take_actions();
    assert!(
        actions.contains(&Action::Timer { at: 400 }),
        "the earlier deadline of the wait is asked for: {actions:?}"
    );
    assert_eq!(core.armed(), Some(400));

    // Early: nothing happens.
    core.tick(399);
    assert!(replies(&core.take_actions()).is_empty());
    core.tick(400);
    let actions = core.take_actions();
    assert!(matches!(
        &replies(&actions)[..],
        [(2, Reply::Acquire(Err(AcquireError::Held { holder: Some(h), .. })))] if h == "h0"
    ));
    assert_eq!(core.armed(), Some(TTL));

    core.tick(TTL);
    let actions = core.take_actions();
    assert_eq!(
        notes(&actions),
        vec![(LeaseChange::Expired, "h0".into(), 1)]
    );
    assert!(actions.contains(&Action::Lazy(LazyRecord::RemoveLease("lease-h0".into()))));
    assert_eq!(
        core.keepalive(TTL, "lease-h0", None),
        Err(LeaseError::Expired)
    );
}

#[test]
fn a_restart_honours_recorded_leases_and_reservations() {
    // What the disk kept: lock A with a live lease at epoch 3 under a reservation up to
    // 4, lock B with an active reservation up to 8 and no lease record (it was lost), and
    // lock C idle at epoch 9.
    let lease = LeaseRecord {
        lease_id: "lease-a".into(),
        lock: "A".into(),
        holder: "ha".into(),
        epoch: 3,
        ttl_ms: 500,
        lock_delay_ms: Some(0),
        ..LeaseRecord::default()
    };
    let reservation = |ceiling, active| Reservation {
        ceiling,
        max_ttl_ms: 700,
        active,
    };
    let state = IssuerState {
        epochs: vec![("A".into(), 3), ("C".into(), 9)],
        leases: vec![lease],
        reservations: vec![
            ("A".into(), reservation(4, true)),
            ("B".into(), reservation(8, true)),
            ("C".into(), reservation(9, false)),
        ],
        epoch_floor: 0,
    };
    let (mut core, recovered) = IssuerCore::recover(config(), 1_000, state);
    assert_eq!(recovered.leases, 1);
    assert_eq!(recovered.blocked_locks, 2);
    assert_eq!(recovered.blocked_for_ms, 700);
    assert_eq!(recovered.max_ceiling, 9);
    let actions = core.take_actions();
    assert!(actions.iter().any(|a| matches!(a, Action::Timer { .. })));

    // The recorded lease is honoured: renewable, and its lock is held.
    assert!(core.keepalive(1_100, "lease-a", None).is_ok());
    let acquire = |core: &mut IssuerCore, now, to, lock: &str| {
        core.acquire(
            now,
            to,
            AcquireRequest {
                lock: lock.into(),
                ..req(&format!("x{to}"), 0)
            },
        );
        core.take_actions()
    };
    let actions = acquire(&mut core, 1_100, 1, "A");
    assert!(matches!(
        replies(&actions)[..],
        [(1, Reply::Acquire(Err(AcquireError::Held { .. })))]
    ));
    // B waits out its reservation's TTL from the restart, then continues above 8.
    let actions = acquire(&mut core, 1_699, 2, "B");
    assert!(matches!(
        replies(&actions)[..],
        [(2, Reply::Acquire(Err(AcquireError::Held { .. })))]
    ));
    let actions = acquire(&mut core, 1_700, 3, "B");
    let [(id, Write::Reserve { ref lease, .. })] = writes(&actions)[..] else {
        panic!("a fresh reservation: {actions:?}");
    };
    assert_eq!(lease.epoch, 9);
    core.written(1_700, id, Ok(()));
    // C was idle: granted at once above its ceiling.
    let actions = acquire(&mut core, 1_700, 4, "C");
    let [(_, Write::Reserve { ref lease, .. })] = writes(&actions)[..] else {
        panic!("a fresh reservation: {actions:?}");
    };
    assert_eq!(lease.epoch, 10);
}

#[test]
fn closing_answers_waiters_and_refuses_new_ones() {
    let mut core = IssuerCore::new(config());
    grant_now(&mut core, 0, 1, "h0");
    core.acquire(1, 2, req("h1", 5_000));
    core.take_actions();
    core.close(2);
    let closed = Reply::Acquire(Err(AcquireError::Storage(StorageError::Closed)));
    assert_eq!(replies(&core.take_actions()), vec![(2, closed.clone())]);
    core.acquire(3, 3, req("h2", 5_000));
    assert_eq!(replies(&core.take_actions()), vec![(3, closed)]);
    assert_eq!(core.census(), (1, 0), "the lock stays held");
}

#[test]
fn a_lease_the_caller_may_not_act_on_is_refused_and_left_as_it_was() {
    let mut core = observed();
    let first = grant_now(&mut core, 0, 1, "h0");
    let others = |_: &str, holder: &str| holder != "h0";
    let owner = |lock: &str, holder: &str| lock == "L" && holder == "h0";
    let not_yours =
        |e: &LeaseError| matches!(e, LeaseError::NotYours(l) if l.holder == "h0" && l.lock == "L");

    // A keepalive, a release and a proclaim by someone the check says no to: refused with
    // the lease in hand, and nothing queued, written or noted.
    let refused = core
        .keepalive(600, &first.lease_id, Some(&others))
        .unwrap_err();
    assert!(not_yours(&refused), "{refused:?}");
    core.release(600, 2, &first.lease_id, Some(&others));
    core.proclaim(600, 3, &first.lease_id, Some(b"v".to_vec()), Some(&others));
    let actions = core.take_actions();
    assert!(writes(&actions).is_empty(), "{actions:?}");
    assert!(notes(&actions).is_empty(), "{actions:?}");
    let answered = replies(&actions);
    assert_eq!(answered.len(), 2, "{actions:?}");
    for (_, reply) in &answered {
        assert!(
            matches!(reply, Reply::Lease(Err(e)) if not_yours(e)),
            "{reply:?}"
        );
    }
    let status = core.status(600, "L");
    let lease = status.lease.expect("still held");
    assert_eq!((lease.holder.as_str(), lease.value), ("h0", None));
    // The refused keepalive did not renew it: it still ends at its first deadline.
    assert_eq!(lease.remaining_ms, TTL - 600);

    // An unknown lease is expired, whoever asks.
    assert_eq!(
        core.keepalive(600, "no-such-lease", Some(&owner)),
        Err(LeaseError::Expired)
    );
    // The owner may: the same calls go through.
    let kept = core.keepalive(700, &first.lease_id, Some(&owner)).unwrap();
    assert_eq!(kept.remaining_ms, TTL);
    core.release(800, 4, &first.lease_id, Some(&owner));
    let actions = core.take_actions();
    assert_eq!(
        writes(&actions).last().map(|(_, w)| w.clone()),
        Some(Write::RemoveLease(first.lease_id.clone()))
    );
    assert_eq!(
        notes(&actions),
        vec![(LeaseChange::Released, "h0".into(), 1)]
    );
}

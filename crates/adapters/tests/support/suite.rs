//! The behavioural cases every adapter must pass, written once against [`GateUnderTest`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use palisade_adapters::{AdmitError, ErrorCode};
use palisade_token::{Signer, TokenError};
use tokio::sync::Barrier;

use super::{
    retry_conflicts, GateUnderTest, Issuer, RaisableGate, Shape, TransactionalGate, Write, LOCK,
    OTHER_LOCK,
};

async fn assert_state<G: GateUnderTest>(gate: &G, key: &str, value: &str, mark: u64) {
    assert_eq!(
        gate.read(key).await.as_deref(),
        Some(value),
        "value at {key}"
    );
    assert_eq!(
        gate.high_water(LOCK, key).await,
        mark,
        "mark guarding {key}"
    );
}

fn assert_stale(result: Result<(), AdmitError>, high_water: u64, epoch: u64) {
    match result {
        Err(AdmitError::Stale {
            high_water: h,
            epoch: e,
        }) if (h, e) == (high_water, epoch) => {}
        other => panic!("expected Stale {{ {high_water}, {epoch} }}, got {other:?}"),
    }
}

/// The source article's `fencing.py`, step by step, against the real resource.
pub async fn fencing_scenario<G: GateUnderTest>(gate: &G, issuer: &Issuer) {
    let key = "fencing-py";
    let (old, new) = (issuer.token(LOCK, 1), issuer.token(LOCK, 2));

    // 2. The old leader writes first and is admitted: the resource has not seen epoch 2 (S10).
    gate.write(&old, LOCK, key, "old-leader-1").await.unwrap();
    assert_state(gate, key, "old-leader-1", 1).await;
    // 3. The new leader writes with epoch 2.
    gate.write(&new, LOCK, key, "new-leader").await.unwrap();
    assert_state(gate, key, "new-leader", 2).await;
    // 4. The old leader again: refused, value and mark unchanged.
    assert_stale(gate.write(&old, LOCK, key, "old-leader-late").await, 2, 1);
    assert_state(gate, key, "new-leader", 2).await;
    // 5. The new leader again with the same epoch: admitted (S8).
    gate.write(&new, LOCK, key, "new-leader-again")
        .await
        .unwrap();
    assert_state(gate, key, "new-leader-again", 2).await;
    // 6. Missing, "2" and true are refused (S12), nothing changes.
    let missing = gate.write("", LOCK, key, "missing").await;
    assert!(
        matches!(missing, Err(AdmitError::MissingToken)),
        "{missing:?}"
    );
    for bad in ["2", "true"] {
        let result = gate.write(bad, LOCK, key, bad).await;
        assert!(
            matches!(result, Err(AdmitError::InvalidToken(_))),
            "{bad}: {result:?}"
        );
    }
    assert_state(gate, key, "new-leader-again", 2).await;
    // 7. A third acquisition: epoch 3 admitted, epoch 2 now refused.
    gate.write(&issuer.token(LOCK, 3), LOCK, key, "newest")
        .await
        .unwrap();
    assert_stale(gate.write(&new, LOCK, key, "too-late").await, 3, 2);
    // 8. Final state.
    assert_state(gate, key, "newest", 3).await;
}

/// Every admit made through the gate is counted in its tally, by the gate's kind of
/// resource: the admitted ones, the refusals by code, the stale one with both epochs, and
/// the resource's mark for the lock.
pub async fn the_tally_counts_what_the_gate_decided<G: GateUnderTest>(gate: &G, issuer: &Issuer) {
    let key = "tallied";
    let (old, new) = (issuer.token(LOCK, 1), issuer.token(LOCK, 2));
    gate.write(&old, LOCK, key, "one").await.unwrap();
    gate.write(&new, LOCK, key, "two").await.unwrap();
    assert_stale(gate.write(&old, LOCK, key, "late").await, 2, 1);
    assert!(gate.write("", LOCK, key, "none").await.is_err());
    let reports = gate.tally().take();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = &reports[0];
    assert_eq!((report.resource, report.admitted), (G::KIND, 2));
    let refused: Vec<(&str, u64)> = report
        .refused
        .iter()
        .map(|(c, n)| (c.as_str(), *n))
        .collect();
    assert_eq!(refused, [("missing_token", 1), ("stale_token", 1)]);
    let stale = &report.recent[0];
    assert_eq!(
        (
            stale.lock.as_str(),
            stale.code.as_str(),
            stale.epoch,
            stale.high_water
        ),
        (LOCK, "stale_token", Some(1), Some(2))
    );
    let marks: Vec<(&str, u64)> = report
        .marks
        .iter()
        .map(|m| (m.lock.as_str(), m.high_water))
        .collect();
    assert_eq!(marks, [(LOCK, 2)]);
}

/// Malformed, forged, foreign and other-lock tokens change nothing.
pub async fn bad_tokens<G: GateUnderTest>(gate: &G, issuer: &Issuer) {
    let key = "bad-tokens";
    gate.write(&issuer.token(LOCK, 1), LOCK, key, "genuine")
        .await
        .unwrap();

    let genuine = issuer.token(LOCK, 99);
    let mut forged = genuine.clone().into_bytes();
    // A character well inside the signature, so the bytes change, not just padding bits.
    let at = forged.len() - 10;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let stranger = Signer::generate().issue(LOCK, 1_000, "stranger");
    for (name, token) in [
        ("garbage", "pal1.garbage.signature".to_owned()),
        ("forged signature", forged),
        ("unknown key", stranger),
    ] {
        let result = gate.write(&token, LOCK, key, name).await;
        assert!(
            matches!(result, Err(AdmitError::InvalidToken(_))),
            "{name}: {result:?}"
        );
        if let Err(e) = &result {
            assert_eq!(e.code(), ErrorCode::InvalidToken);
        }
    }
    let stranger_kind = gate
        .write(&Signer::generate().issue(LOCK, 5, "s"), LOCK, key, "x")
        .await;
    assert!(matches!(
        stranger_kind,
        Err(AdmitError::InvalidToken(TokenError::UnknownKey(_)))
    ));

    // A genuine token with a huge epoch, but for another lock.
    let other = gate
        .write(
            &issuer.token(OTHER_LOCK, 1_000_000),
            LOCK,
            key,
            "other-lock",
        )
        .await;
    match other {
        Err(
            ref e @ AdmitError::WrongLock {
                ref expected,
                ref token_lock,
            },
        ) => {
            assert_eq!((expected.as_str(), token_lock.as_str()), (LOCK, OTHER_LOCK));
            assert_eq!(e.code(), ErrorCode::WrongLock);
        }
        other => panic!("expected WrongLock, got {other:?}"),
    }
    assert_state(gate, key, "genuine", 1).await;
    assert_eq!(gate.high_water(OTHER_LOCK, key).await, 0);
}

/// Two holders race, many rounds. Each round uses a fresh lock (so the first admit, which
/// creates the mark, races too). Afterwards the mark is the larger epoch, its holder's
/// last write is the value, and no write of the smaller epoch was admitted after one of
/// the larger epoch had committed.
pub async fn racing_epochs<G: GateUnderTest>(gate: Arc<G>, issuer: &Issuer, rounds: usize) {
    const WRITES: usize = 8;
    let admitted_old = Arc::new(AtomicUsize::new(0));
    for round in 0..rounds {
        let lock = format!("race-{round}");
        let key = format!("race-key-{round}");
        let new_committed = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(2));
        let (old, new) = (issuer.token(&lock, 1), issuer.token(&lock, 2));

        let newer = {
            let (gate, lock, key, start) = (gate.clone(), lock.clone(), key.clone(), start.clone());
            let committed = new_committed.clone();
            tokio::spawn(async move {
                start.wait().await;
                for i in 0..WRITES {
                    let value = format!("2:{i}");
                    retry_conflicts(|| gate.write(&new, &lock, &key, &value))
                        .await
                        .unwrap_or_else(|e| panic!("the newest epoch was refused: {e:?}"));
                    committed.store(true, Ordering::SeqCst);
                }
            })
        };
        let older = {
            let (gate, lock, key) = (gate.clone(), lock.clone(), key.clone());
            let (committed, admitted_old) = (new_committed.clone(), admitted_old.clone());
            tokio::spawn(async move {
                start.wait().await;
                for i in 0..WRITES {
                    let after_new = committed.load(Ordering::SeqCst);
                    let value = format!("1:{i}");
                    match retry_conflicts(|| gate.write(&old, &lock, &key, &value)).await {
                        Ok(()) => {
                            assert!(!after_new, "epoch 1 admitted after epoch 2 committed");
                            admitted_old.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(AdmitError::Stale {
                            high_water: 2,
                            epoch: 1,
                        }) => {}
                        Err(e) => panic!("unexpected refusal {e:?}"),
                    }
                }
            })
        };
        newer.await.unwrap();
        older.await.unwrap();
        assert_eq!(gate.high_water(&lock, &key).await, 2, "round {round}");
        let value = gate.read(&key).await.unwrap_or_default();
        assert_eq!(value, format!("2:{}", WRITES - 1), "round {round}");
    }
    // Not asserted (timing decides), but printed: 0 would mean the race never happened.
    println!(
        "racing_epochs: {} of {} epoch-1 writes were admitted before epoch 2 landed",
        admitted_old.load(Ordering::Relaxed),
        rounds * WRITES
    );
}

/// A refused admit must take the caller's own earlier writes in the transaction with it.
pub async fn rejected_admit_rolls_back_own_writes<G: TransactionalGate>(gate: &G, issuer: &Issuer) {
    let key = "own-writes";
    let (t1, t2) = (issuer.token(LOCK, 1), issuer.token(LOCK, 2));
    let admitted = Write::new(&t2, LOCK, key, "v2");
    gate.put_shaped(admitted, Shape::AfterOwnWrite("audit-admitted"))
        .await
        .unwrap();
    assert_eq!(gate.read("audit-admitted").await.as_deref(), Some("own"));

    let stale = Write::new(&t1, LOCK, key, "v1");
    let stale = gate
        .put_shaped(stale, Shape::AfterOwnWrite("audit-stale"))
        .await;
    assert_stale(stale, 2, 1);
    for (token, own_key) in [
        (String::new(), "audit-missing"),
        ("true".to_owned(), "audit-malformed"),
        (issuer.token(OTHER_LOCK, 9), "audit-other-lock"),
    ] {
        assert!(gate
            .put_shaped(
                Write::new(&token, LOCK, key, "bad"),
                Shape::AfterOwnWrite(own_key)
            )
            .await
            .is_err());
        assert_eq!(gate.read(own_key).await, None, "{own_key} committed");
    }
    assert_eq!(gate.read("audit-stale").await, None, "own write committed");
    assert_state(gate, key, "v2", 2).await;
}

/// The advance of the mark rolls back with the transaction: an admitted epoch whose
/// transaction failed later leaves no trace, and the older holder is still admitted.
pub async fn failure_after_admit_rolls_back_the_mark<G: TransactionalGate>(
    gate: &G,
    issuer: &Issuer,
) {
    let key = "fail-after";
    gate.write(&issuer.token(LOCK, 2), LOCK, key, "v2")
        .await
        .unwrap();
    let t5 = issuer.token(LOCK, 5);
    let doomed = Write::new(&t5, LOCK, key, "v5");
    gate.put_shaped(doomed, Shape::FailAfter).await.unwrap();
    assert_state(gate, key, "v2", 2).await;
    gate.write(&issuer.token(LOCK, 2), LOCK, key, "v2-again")
        .await
        .unwrap();
    assert_state(gate, key, "v2-again", 2).await;
}

/// The sequence policy orders operations inside one epoch.
pub async fn sequence_policy<G: TransactionalGate>(gate: &G, issuer: &Issuer) {
    let (key, lock) = ("seq-key", "sequenced");
    let t1 = issuer.token(lock, 1);
    gate.put_shaped(Write::new(&t1, lock, key, "a"), Shape::Sequenced(1))
        .await
        .unwrap();
    gate.put_shaped(Write::new(&t1, lock, key, "b"), Shape::Sequenced(5))
        .await
        .unwrap();
    for seq in [5, 4] {
        match gate
            .put_shaped(Write::new(&t1, lock, key, "replay"), Shape::Sequenced(seq))
            .await
        {
            Err(e @ AdmitError::StaleSequence { .. }) => {
                assert_eq!(e.code(), ErrorCode::StaleSequence)
            }
            other => panic!("expected StaleSequence, got {other:?}"),
        }
    }
    // A new epoch may restart its sequence; the old epoch is then stale whatever its seq.
    let t2 = issuer.token(lock, 2);
    gate.put_shaped(Write::new(&t2, lock, key, "c"), Shape::Sequenced(1))
        .await
        .unwrap();
    let old = gate
        .put_shaped(Write::new(&t1, lock, key, "d"), Shape::Sequenced(99))
        .await;
    assert_stale(old, 2, 1);
    assert_eq!(gate.read(key).await.as_deref(), Some("c"));
    assert_eq!(gate.high_water(lock, key).await, 2);
}

/// After a restore, `raise_marks` brings the marks back above what the resource forgot:
/// a mark is raised (or made, for a lock the copy never saw), never lowered, and tokens
/// below the raised mark are refused while the one at it still writes.
pub async fn raise_marks<G: RaisableGate>(gate: &G, issuer: &Issuer) {
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "one")
        .await
        .expect("epoch 1 admitted");
    let raised = gate
        .raise(&[(LOCK.to_owned(), 3), (OTHER_LOCK.to_owned(), 2)])
        .await;
    assert_eq!(raised, 2, "both marks went up (one made anew)");
    assert_eq!(gate.high_water(LOCK, "k").await, 3);
    assert_eq!(gate.high_water(OTHER_LOCK, "k").await, 2);
    // Never lowered; raising to where it is changes nothing.
    assert_eq!(
        gate.raise(&[(LOCK.to_owned(), 2), (OTHER_LOCK.to_owned(), 2)])
            .await,
        0
    );
    assert_eq!(gate.high_water(LOCK, "k").await, 3);
    for epoch in [1, 2] {
        let refused = gate
            .write(&issuer.token(LOCK, epoch), LOCK, "k", "late")
            .await;
        assert!(
            matches!(refused, Err(AdmitError::Stale { .. })),
            "{epoch}: {refused:?}"
        );
    }
    assert_eq!(gate.read("k").await.as_deref(), Some("one"));
    gate.write(&issuer.token(LOCK, 3), LOCK, "k", "three")
        .await
        .expect("the epoch at the mark still writes");
    assert_eq!(gate.read("k").await.as_deref(), Some("three"));
    let refused = gate
        .write(&issuer.token(OTHER_LOCK, 1), OTHER_LOCK, "o", "late")
        .await;
    assert!(
        matches!(refused, Err(AdmitError::Stale { .. })),
        "{refused:?}"
    );
}

/// The end of every restore drill: the resource came back with epoch 1's mark after epoch 2
/// had fenced epoch 1 out. The hole (epoch 1 writes again), then `raise` to the issuer's
/// bound (2) shuts it out while epoch 2 still writes.
pub async fn restored_until_raised<G: RaisableGate>(gate: &G, issuer: &Issuer) {
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "late")
        .await
        .expect("the restored mark admits epoch 1");
    assert_eq!(gate.raise(&[(LOCK.to_owned(), 2)]).await, 1);
    let stale = gate.write(&issuer.token(LOCK, 1), LOCK, "k", "later").await;
    assert!(matches!(stale, Err(AdmitError::Stale { .. })), "{stale:?}");
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "two again")
        .await
        .expect("the newest epoch still writes");
}

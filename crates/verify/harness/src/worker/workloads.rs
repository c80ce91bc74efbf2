//! One iteration of each workload. Each records every call it makes, and ends its
//! iteration (releasing the lease) as soon as the store says it is fenced off.
//!
//! Store calls go through [`super::Nodes`] (failover between nodes); every fenced write
//! and delete carries a fresh `Idempotency-Key`, kept across its failover attempts.

use std::collections::BTreeSet;

use palisade_checker::lockset::decode_set;
use palisade_checker::OpKind;
use palisade_client::WriteOptions;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{Held, Worker};
use crate::args::Workload;
use crate::VerifyError;

/// The lock-set key (one set per lock).
pub const SET_KEY: &str = "elements";
/// Keys of the register workload.
const REGISTER_KEYS: [&str; 3] = ["k0", "k1", "k2"];

/// Acquire, fence, read the set, sleep inside the critical section, write the set back
/// with one new unique element, release.
///
/// The fence (barrier) is what makes this safe under delays: acquiring notifies no
/// resource (S10), so without it an older holder's delayed write could land after this
/// holder's read and be overwritten by this holder's write. After the fence, the store
/// refuses every older epoch, so the set read is the set that will be overwritten.
pub async fn lock_set(w: &mut Worker) -> Result<(), VerifyError> {
    let lock = Workload::LockSet.locks()[0];
    let Some(guard) = w.acquire(lock).await? else {
        return Ok(());
    };
    let epoch = guard.epoch();
    if !fence(w, &guard).await? {
        return w.release(guard).await;
    }

    let mut flight = w
        .rec
        .invoke(OpKind::ReadSet, |op| op.lock(lock).key(SET_KEY))?;
    let read = w
        .store
        .call(|c| async move { c.kv(lock).get(SET_KEY).await })
        .await;
    let stored = match read {
        Ok(entry) => entry.map(|e| String::from_utf8_lossy(&e.value).into_owned()),
        Err(e) => {
            w.rec.error(flight, &e)?;
            return w.release(guard).await;
        }
    };
    flight.op.value = stored.clone();
    w.rec.ok(flight)?;
    let mut set: BTreeSet<String> = match stored.as_deref().map(decode_set) {
        None => BTreeSet::new(),
        Some(Ok(set)) => set,
        // Not ours to repair: leave the garbage for the checkers to report.
        Some(Err(_)) => return w.release(guard).await,
    };

    // The critical section: most of the cycle, so a pause or delay usually lands here.
    let work = w.ttl_fraction(0.5, 1.0);
    tokio::time::sleep(work).await;

    let element = w.unique_value();
    set.insert(element.clone());
    let body = serde_json::to_string(&set)
        .map_err(|e| VerifyError::Internal(format!("cannot encode a set: {e}")))?;
    let opts = w.write_options();
    let mut flight = w.rec.invoke(OpKind::Add, |op| {
        op.lock(lock).key(SET_KEY).value(&element).epoch(epoch)
    })?;
    let token = guard.token();
    let put = w
        .store
        .call(|c| {
            let (body, opts) = (body.clone(), opts.clone());
            async move {
                c.fenced_kv(lock, token)
                    .put_with(SET_KEY, body, &opts)
                    .await
            }
        })
        .await;
    match put {
        Ok(written) => {
            flight.op.revision = store_revision(written.revision);
            flight.op.returned_epoch = Some(written.epoch);
            w.rec.ok(flight)?;
        }
        Err(e) => w.rec.error(flight, &e)?,
    }
    w.release(guard).await
}

/// A few fenced writes, deletes and plain reads of a few keys, within one lease.
pub async fn register(w: &mut Worker) -> Result<(), VerifyError> {
    let lock = *Workload::Register
        .locks()
        .choose(&mut w.rng)
        .ok_or_else(|| VerifyError::Internal("no register locks".into()))?;
    let Some(guard) = w.acquire(lock).await? else {
        return Ok(());
    };
    if w.rng.gen_bool(0.5) && !fence(w, &guard).await? {
        return w.release(guard).await;
    }
    let ops = w.rng.gen_range(2..=5);
    for _ in 0..ops {
        let key = REGISTER_KEYS[w.rng.gen_range(0..REGISTER_KEYS.len())];
        let roll: f64 = w.rng.gen();
        let fenced_off = if roll < 0.4 {
            read(w, lock, key).await?;
            false
        } else {
            mutate(w, &guard, key, roll < 0.9).await?
        };
        if fenced_off {
            break;
        }
        let gap = w.ttl_fraction(0.1, 0.35);
        tokio::time::sleep(gap).await;
    }
    w.release(guard).await
}

/// Acquire, hold briefly, release: only the issued epochs matter.
pub async fn tokens(w: &mut Worker) -> Result<(), VerifyError> {
    let lock = *Workload::Tokens
        .locks()
        .choose(&mut w.rng)
        .ok_or_else(|| VerifyError::Internal("no token locks".into()))?;
    let Some(guard) = w.acquire(lock).await? else {
        return Ok(());
    };
    let hold = w.ttl_fraction(0.0, 0.5);
    tokio::time::sleep(hold).await;
    w.release(guard).await
}

/// Barrier; false if it did not succeed.
async fn fence(w: &mut Worker, guard: &Held) -> Result<bool, VerifyError> {
    let (lock, epoch, token) = (guard.lock(), guard.epoch(), guard.token());
    let flight = w
        .rec
        .invoke(OpKind::Fence, |op| op.lock(lock).epoch(epoch))?;
    let fenced = w
        .store
        .call(|c| async move { c.fenced_kv(lock, token).fence().await })
        .await;
    match fenced {
        Ok(_) => w.rec.ok(flight).map(|()| true),
        Err(e) => w.rec.error(flight, &e).map(|()| false),
    }
}

async fn read(w: &mut Worker, lock: &str, key: &str) -> Result<(), VerifyError> {
    let mut flight = w.rec.invoke(OpKind::Read, |op| op.lock(lock).key(key))?;
    let read = w
        .store
        .call(|c| async move { c.kv(lock).get(key).await })
        .await;
    match read {
        Ok(entry) => {
            flight.op.value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
            w.rec.ok(flight)
        }
        Err(e) => w.rec.error(flight, &e),
    }
}

/// A put of a unique value (`put`) or a delete; true if the store said we are fenced off.
async fn mutate(w: &mut Worker, guard: &Held, key: &str, put: bool) -> Result<bool, VerifyError> {
    let (lock, epoch, token) = (guard.lock(), guard.epoch(), guard.token());
    let opts = w.write_options();
    let (result, mut flight) = if put {
        let value = w.unique_value();
        let flight = w.rec.invoke(OpKind::Write, |op| {
            op.lock(lock).key(key).value(&value).epoch(epoch)
        })?;
        let result = w
            .store
            .call(|c| {
                let (value, opts) = (value.clone(), opts.clone());
                async move { c.fenced_kv(lock, token).put_with(key, value, &opts).await }
            })
            .await;
        (result, flight)
    } else {
        let flight = w
            .rec
            .invoke(OpKind::Delete, |op| op.lock(lock).key(key).epoch(epoch))?;
        let result = w
            .store
            .call(|c| {
                let opts = opts.clone();
                async move { c.fenced_kv(lock, token).delete_with(key, &opts).await }
            })
            .await;
        (result, flight)
    };
    match result {
        Ok(written) => {
            flight.op.revision = store_revision(written.revision);
            flight.op.returned_epoch = Some(written.epoch);
            w.rec.ok(flight)?;
            Ok(false)
        }
        Err(e) => {
            let fenced = e.is_fenced() && !e.earlier_unanswered;
            w.rec.error(flight, &e)?;
            Ok(fenced)
        }
    }
}

impl Worker {
    /// Options of one fenced write: a fresh idempotency key, so its failover attempts
    /// cannot apply it twice.
    fn write_options(&mut self) -> WriteOptions {
        WriteOptions {
            idempotency_key: Some(self.idempotency_key()),
            ..WriteOptions::default()
        }
    }
}

/// The store revision an accepted mutation returned, if the store keeps one: a gate's
/// store that has no revision to hand out in the same atomic step as the write (Redis)
/// answers 0, and the op is recorded without one (the fencing checker then leaves it out
/// of its revision-order check). Palisade's store numbers its revisions from 1.
fn store_revision(revision: u64) -> Option<u64> {
    (revision > 0).then_some(revision)
}

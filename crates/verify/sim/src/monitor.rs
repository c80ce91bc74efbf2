//! Invariants only a simulation can check: it sees every message the node sends and the
//! disk across crashes, which no client-side recorder can.
//!
//! - **Tokens leave once.** No (lock, epoch) ever leaves the node twice, across any
//!   number of restarts. (They may leave out of order: a grant waiting for its
//!   reservation's fsync can be overtaken by a later grant inside a durable one.)
//! - **No overlapping leases.** A lease is live in node time from the table's grant
//!   until the node ends it (release or expiry), and no lock is granted while another of
//!   its leases is live. A crash ends only leases whose token never left the node (nobody
//!   holds them); one whose token left must be honoured for a full TTL after the restart
//!   (`docs/guarantees.md`), whether through its lease record or the lock's reservation.
//! - **Every token leaves protected.** When the token of a still-live lease leaves, the
//!   disk already holds what a restart needs to honour it: an active reservation whose ceiling covers
//!   its epoch and whose TTL covers its lease, or its lease record and its epoch.
//! - **What left survives.** After every restart, each lock's durable epoch is at least
//!   every epoch that ever left, and each namespace's durable mark is at least every mark
//!   an acknowledgement reported.
//! - **The durable mark never goes down**, observed at every fsync and restart.
//! - **Only issued tokens pass.** Every mutation the store admits carries an epoch that
//!   was issued for its lock, and every request with a missing, malformed, foreign or
//!   other-lock token is refused (S12, S14).

use std::collections::{BTreeMap, BTreeSet};

use palisade_token::Epoch;

use crate::store::Records;

#[derive(Debug)]
struct Live {
    lease_id: String,
    epoch: Epoch,
    ttl_ms: u64,
    /// Its token left the node.
    delivered: bool,
    /// It went through a crash; the next restart must honour it a full TTL.
    crashed: bool,
    /// After a restart: when that full TTL is over.
    honour_until: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Monitor {
    sent: BTreeSet<(String, Epoch)>,
    last_sent: BTreeMap<String, Epoch>,
    /// Per lock, the lease the node granted and has not ended.
    live: BTreeMap<String, Live>,
    acked_mark: BTreeMap<String, Epoch>,
    durable_mark: BTreeMap<String, Epoch>,
    pub violations: Vec<String>,
    /// Mutations admitted with an epoch below the newest token of their lock: an old
    /// holder's write that reached the store before the new epoch did (S10).
    pub late_admitted: u64,
}

impl Monitor {
    fn flag(&mut self, now: u64, what: String) {
        self.violations.push(format!("t={now}: {what}"));
    }

    /// A grant's token is on the wire.
    pub(crate) fn token_sent(
        &mut self,
        now: u64,
        lock: &str,
        epoch: Epoch,
        lease_id: &str,
        durable: &Records,
    ) {
        // A lease the node already ended (its fsync outlasted it) needs no protection.
        let live_ttl = self
            .live
            .get(lock)
            .filter(|l| l.lease_id == lease_id)
            .map(|l| l.ttl_ms);
        let reserved = durable.reservations.get(lock).is_some_and(|r| {
            r.active && epoch <= r.ceiling && live_ttl.is_some_and(|ttl| ttl <= r.max_ttl_ms)
        });
        let recorded = durable.leases.contains_key(lease_id)
            && durable.epochs.get(lock).is_some_and(|&e| e >= epoch);
        if live_ttl.is_some() && !reserved && !recorded {
            self.flag(
                now,
                format!("lock {lock}: epoch {epoch} (lease {lease_id}) answered before the disk could honour it"),
            );
        }
        if !self.sent.insert((lock.to_owned(), epoch)) {
            self.flag(now, format!("lock {lock}: epoch {epoch} handed out twice"));
        }
        let last = self.last_sent.entry(lock.to_owned()).or_default();
        *last = (*last).max(epoch);
        if let Some(live) = self.live.get_mut(lock).filter(|l| l.lease_id == lease_id) {
            live.delivered = true;
        }
    }

    /// The lock table granted a lease (not yet durable, not yet told to anyone).
    pub(crate) fn granted(
        &mut self,
        now: u64,
        lock: &str,
        epoch: Epoch,
        lease_id: &str,
        ttl_ms: u64,
    ) {
        let honoured = |l: &Live| l.honour_until.is_some_and(|until| now >= until);
        if let Some(other) = self.live.get(lock).filter(|l| !honoured(l)) {
            let msg = format!(
                "lock {lock}: lease {lease_id} (epoch {epoch}) granted while lease {} (epoch {}) is live",
                other.lease_id, other.epoch
            );
            self.flag(now, msg);
        }
        let live = Live {
            lease_id: lease_id.to_owned(),
            epoch,
            ttl_ms,
            delivered: false,
            crashed: false,
            honour_until: None,
        };
        self.live.insert(lock.to_owned(), live);
    }

    /// The node crashed: grants whose token never left are held by nobody; the others
    /// must be honoured after the restart.
    pub(crate) fn crashed(&mut self, now: u64) {
        // A lease already honoured a full TTL after an earlier restart is over too.
        self.live
            .retain(|_, live| live.delivered && live.honour_until.is_none_or(|until| now < until));
        for live in self.live.values_mut() {
            live.crashed = true;
        }
    }

    /// The node restarted: each lease that went through the crash must last until now
    /// plus its TTL.
    pub(crate) fn restarted(&mut self, now: u64) {
        for live in self.live.values_mut().filter(|l| l.crashed) {
            live.crashed = false;
            live.honour_until = Some(now + live.ttl_ms);
        }
    }

    /// The node released or expired a lease.
    pub(crate) fn lease_ended(&mut self, lock: &str, lease_id: &str) {
        if self.live.get(lock).is_some_and(|l| l.lease_id == lease_id) {
            self.live.remove(lock);
        }
    }

    /// The store admitted a mutation with this epoch (before it is durable).
    pub(crate) fn admitted(&mut self, now: u64, lock: &str, epoch: Epoch) {
        if self.last_sent.get(lock).is_some_and(|&last| epoch < last) {
            self.late_admitted += 1;
        }
        if !self.sent.contains(&(lock.to_owned(), epoch)) {
            self.flag(
                now,
                format!("namespace {lock}: admitted epoch {epoch}, never issued for this lock"),
            );
        }
    }

    /// An acknowledgement reporting `mark` for namespace `lock` is on the wire.
    pub(crate) fn mark_acked(&mut self, lock: &str, mark: Epoch) {
        let m = self.acked_mark.entry(lock.to_owned()).or_default();
        *m = (*m).max(mark);
    }

    /// A client saw a request with a bad token answered with something other than a
    /// refusal.
    pub(crate) fn bad_token_passed(&mut self, now: u64, what: String) {
        self.flag(now, what);
    }

    /// The durable records changed (fsync) or were read back (restart).
    pub(crate) fn durable(&mut self, now: u64, records: &Records, restart: bool) {
        let mark_of = |lock: &str| {
            records
                .namespaces
                .get(lock)
                .map_or(0, |ns| ns.high_water.epoch)
        };
        let mut down = Vec::new();
        for (lock, seen) in &self.durable_mark {
            if mark_of(lock) < *seen {
                down.push(format!(
                    "namespace {lock}: durable mark went down from {seen} to {}",
                    mark_of(lock)
                ));
            }
        }
        for (lock, ns) in &records.namespaces {
            let seen = self.durable_mark.entry(lock.clone()).or_default();
            *seen = (*seen).max(ns.high_water.epoch);
        }
        for what in down {
            self.flag(now, what);
        }
        if !restart {
            return;
        }
        let mut lost = Vec::new();
        for (lock, &epoch) in &self.last_sent {
            let durable = records.epochs.get(lock).copied().unwrap_or(0);
            if durable < epoch {
                lost.push(format!(
                    "lock {lock}: restarted with last epoch {durable}, but epoch {epoch} was handed out"
                ));
            }
        }
        for (lock, &mark) in &self.acked_mark {
            let durable = mark_of(lock);
            if durable < mark {
                lost.push(format!(
                    "namespace {lock}: restarted with mark {durable}, but mark {mark} was acknowledged"
                ));
            }
        }
        for what in lost {
            self.flag(now, what);
        }
    }
}

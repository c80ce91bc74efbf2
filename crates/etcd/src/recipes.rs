//! The recipes over etcd: lock values, per-lock lock-delay and sessions.
//!
//! - **Lock values** ride in the [`HolderRecord`] (under the holder key, the lease key and,
//!   in a session, the session's lease key). [`proclaim`] rewrites all of them in one
//!   transaction that checks the lease key is unchanged since it was read; the keys stay
//!   attached to the same etcd lease. A value is as durable as everything in etcd: it is
//!   in the Raft log before the answer.
//! - **Lock-delay.** etcd deletes an expired lease's keys without saying whether it
//!   expired or was revoked, so the delay cannot be decided at expiry. Instead a lease
//!   with a lock-delay gets a second etcd lease, its *delay lease*, whose TTL is the
//!   holder's TTL plus the delay (in whole seconds, rounded up) plus one second, and the
//!   lock's marker `delay/<lock>` is attached to it in the acquisition transaction. Every
//!   grant requires the marker to be absent. Both leases are renewed together, the delay
//!   lease first, so it always ends at least the delay after the holder's: when the
//!   holder's lease expires, the marker stays until the delay lease runs out (at least the
//!   delay, at most one second more, each as etcd counts lease time). A release deletes the
//!   marker in the same transaction as the holder's keys: a release has no lock-delay.
//! - **Sessions.** A session is one etcd lease (`session/<id>` is attached to it). A lease
//!   acquired in it attaches its keys to the session's etcd lease instead of a new one,
//!   plus `slease/<session>/<lease id>` so the session can list its leases. A keepalive of
//!   the session renews that one etcd lease (and the delay leases of its leases, first);
//!   when it expires etcd deletes every key of every lease in it in one step, and closing
//!   it is revoking it. Releasing one lease of a session deletes that lease's keys in one
//!   transaction; the session lives on.
//!
//! ## Not offered here
//! - Per-principal quotas: the etcd backend does not count leases or sessions per
//!   principal (nor did it for plain leases).
//! - Millisecond precision: TTLs and delays count whole seconds, as etcd leases do.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, TxnOp};
use palisade_core::lock_table::{LeaseView, SessionView};
use palisade_issuer::{LeaseError, MayAct, SessionError, SessionRequest};
use palisade_storage::StorageError;

use crate::error::{is_lease_not_found, storage};
use crate::issuer::{may_act, ttl_seconds, view_of, EtcdIssuer};
use crate::keys::{from_json, json, HolderRecord, SessionRecord};
use crate::txn::{backoff, contended, MAX_ATTEMPTS};
use crate::waiting::EtcdLease;
use crate::{Etcd, Resend};

/// How one acquisition is granted: on its own etcd lease or its session's, with or
/// without a delay lease.
pub(crate) struct Plan {
    pub session: Option<SessionRecord>,
    pub lock_delay_ms: u64,
    /// The TTL to ask etcd for (its own lease), in seconds.
    pub ttl_s: i64,
}

impl Plan {
    /// The etcd lease the grant attaches to (granted now, or the session's) and, with a
    /// lock-delay, its delay lease. Both are revoked when dropped unless kept (a
    /// session's lease never is).
    pub(crate) async fn leases(
        &self,
        etcd: &Etcd,
    ) -> Result<(EtcdLease, Option<EtcdLease>), StorageError> {
        let lease = match &self.session {
            Some(s) => EtcdLease::borrowed(etcd, s.etcd_lease, ttl_seconds(s.ttl_ms)),
            None => EtcdLease::grant(etcd, self.ttl_s).await?,
        };
        let shadow = match self.lock_delay_ms {
            0 => None,
            delay => {
                let ttl = lease.ttl_s().saturating_add(delay_seconds(delay));
                Some(EtcdLease::grant(etcd, ttl).await?)
            }
        };
        Ok((lease, shadow))
    }
}

/// A lock-delay in whole seconds, rounded up, plus one: renewals of the two leases are
/// not simultaneous, and the delay must never come out short.
fn delay_seconds(delay_ms: u64) -> i64 {
    i64::try_from(delay_ms.div_ceil(1000).saturating_add(1)).unwrap_or(i64::MAX)
}

/// Whether a session id can be part of a key (ids are the server's hex strings).
fn valid_id(session_id: &str) -> bool {
    !session_id.is_empty() && !session_id.contains('/')
}

/// The record of a live session, if it exists.
pub(crate) async fn session_record(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<Option<SessionRecord>, StorageError> {
    if !valid_id(session_id) {
        return Ok(None);
    }
    let key = issuer.etcd.keys.session(session_id);
    let snap = issuer
        .etcd
        .read("read session", vec![TxnOp::get(key, None)])
        .await?;
    match snap.first(0) {
        Some(kv) => Ok(Some(from_json(kv.key(), kv.value())?)),
        None => Ok(None),
    }
}

/// A session and the records of its leases, read in one snapshot.
async fn session_snapshot(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<Option<(SessionRecord, Vec<HolderRecord>)>, StorageError> {
    if !valid_id(session_id) {
        return Ok(None);
    }
    let keys = &issuer.etcd.keys;
    let snap = issuer
        .etcd
        .read(
            "read session",
            vec![
                TxnOp::get(keys.session(session_id), None),
                TxnOp::get(
                    keys.session_leases(session_id),
                    Some(GetOptions::new().with_prefix()),
                ),
            ],
        )
        .await?;
    let Some(kv) = snap.first(0) else {
        return Ok(None);
    };
    let session: SessionRecord = from_json(kv.key(), kv.value())?;
    let leases = snap
        .all(1)
        .iter()
        .map(|kv| from_json(kv.key(), kv.value()))
        .collect::<Result<Vec<HolderRecord>, _>>()?;
    Ok(Some((session, leases)))
}

fn view(session: &SessionRecord, leases: &[HolderRecord], remaining_ms: u64) -> SessionView {
    SessionView {
        session_id: session.session_id.clone(),
        holder: session.holder.clone(),
        ttl_ms: session.ttl_ms,
        remaining_ms,
        leases: leases.iter().map(|r| view_of(r, remaining_ms)).collect(),
    }
}

/// Renews one etcd lease; `Ok(false)` if it is gone.
pub(crate) async fn renew(etcd: &Etcd, id: i64) -> Result<bool, StorageError> {
    let answer = etcd.call_raw("keepalive", Resend::IfUnavailable, || {
        let mut lease = etcd.client.lease_client();
        async move { lease.keep_alive(id).await }
    });
    lease_call("keepalive", answer.await?)
}

/// Revokes one etcd lease; `Ok(false)` if it was gone already.
async fn revoke(etcd: &Etcd, id: i64, resend: Resend) -> Result<bool, StorageError> {
    let answer = etcd.call_raw("revoke", resend, || {
        let mut lease = etcd.client.lease_client();
        async move { lease.revoke(id).await }
    });
    lease_call("revoke", answer.await?)
}

/// What a call on one etcd lease answered: `Ok(false)` if the lease is gone.
fn lease_call<T>(what: &str, answer: Result<T, etcd_client::Error>) -> Result<bool, StorageError> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if is_lease_not_found(&e) => Ok(false),
        Err(e) => Err(storage(what, e)),
    }
}

/// Creates a session: grants its etcd lease and writes its record on it.
pub(crate) async fn create_session(
    issuer: &EtcdIssuer,
    req: SessionRequest,
) -> Result<SessionView, SessionError> {
    let etcd = &issuer.etcd;
    if !valid_id(&req.session_id) {
        return Err(StorageError::Failed("session id cannot be a key".to_owned()).into());
    }
    let lease = EtcdLease::grant(etcd, ttl_seconds(req.ttl_ms)).await?;
    let record = SessionRecord {
        session_id: req.session_id.clone(),
        holder: req.holder,
        ttl_ms: lease.ttl_ms(),
        etcd_lease: lease.id(),
    };
    let key = etcd.keys.session(&req.session_id);
    let committed = etcd
        .commit(
            "create session",
            vec![Compare::version(key.clone(), CompareOp::Equal, 0)],
            vec![TxnOp::put(
                key,
                json(&record),
                Some(PutOptions::new().with_lease(lease.id())),
            )],
        )
        .await?;
    if committed.is_none() {
        return Err(StorageError::Failed("session id already in use".to_owned()).into());
    }
    lease.keep();
    Ok(view(&record, &[], record.ttl_ms))
}

/// A live session and the records of its leases, or `Expired`.
async fn live_session(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<(SessionRecord, Vec<HolderRecord>), SessionError> {
    let live = session_snapshot(issuer, session_id).await?;
    live.ok_or(SessionError::Expired)
}

/// Renews a session: the delay leases of its leases first, then its own etcd lease.
pub(crate) async fn keepalive_session(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<SessionView, SessionError> {
    let (session, leases) = live_session(issuer, session_id).await?;
    for record in &leases {
        issuer.watch.releasing(&record.lease_id);
    }
    for shadow in leases.iter().filter_map(|r| r.delay_lease) {
        renew(&issuer.etcd, shadow).await?;
    }
    if !renew(&issuer.etcd, session.etcd_lease).await? {
        return Err(SessionError::Expired);
    }
    Ok(view(&session, &leases, session.ttl_ms))
}

/// A live session with its leases.
pub(crate) async fn session_view(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<Option<SessionView>, StorageError> {
    let Some((session, leases)) = session_snapshot(issuer, session_id).await? else {
        return Ok(None);
    };
    let remaining = issuer.lease_remaining_ms(session.etcd_lease).await;
    Ok(Some(view(&session, &leases, remaining)))
}

/// Ends a session: revokes its leases' delay leases (a close is a release: no
/// lock-delay), then its own etcd lease, which deletes every key of its leases at once.
pub(crate) async fn close_session(
    issuer: &EtcdIssuer,
    session_id: &str,
) -> Result<SessionView, SessionError> {
    let (session, leases) = live_session(issuer, session_id).await?;
    let etcd = &issuer.etcd;
    for shadow in leases.iter().filter_map(|r| r.delay_lease) {
        // Revoking twice is harmless: resend freely.
        revoke(etcd, shadow, Resend::IfUnavailable).await?;
    }
    if !revoke(etcd, session.etcd_lease, Resend::IfUnavailable).await? {
        return Err(SessionError::Expired);
    }
    Ok(view(&session, &leases, 0))
}

/// Releases a lease whose keys are not simply its own etcd lease's (in a session, or
/// with a delay lease): deletes its keys and its lock-delay marker in one transaction,
/// then revokes the etcd leases that are its own.
pub(crate) async fn release_keys(
    issuer: &EtcdIssuer,
    record: &HolderRecord,
) -> Result<LeaseView, LeaseError> {
    let etcd = &issuer.etcd;
    let keys = &etcd.keys;
    let lease_key = keys.lease(&record.lease_id);
    let mut deletes = vec![
        TxnOp::delete(keys.holder(&record.lock), None),
        TxnOp::delete(lease_key.clone(), None),
    ];
    if let Some(session) = &record.session {
        deletes.push(TxnOp::delete(
            keys.session_lease(session, &record.lease_id),
            None,
        ));
    }
    if record.delay_lease.is_some() {
        // The marker is this lease's while its lease key exists: a grant needs it absent.
        deletes.push(TxnOp::delete(keys.delay(&record.lock), None));
    }
    let committed = etcd
        .commit(
            "release",
            vec![Compare::version(lease_key, CompareOp::Greater, 0)],
            deletes,
        )
        .await?;
    if committed.is_none() {
        return Err(LeaseError::Expired);
    }
    // Its keys are gone; what is left are leases with nothing attached (or nothing the
    // lock depends on): best effort, they run out by themselves anyway.
    if let Some(shadow) = record.delay_lease {
        let _ = revoke(etcd, shadow, Resend::IfUnavailable).await;
    }
    if record.session.is_none() {
        let _ = revoke(etcd, record.etcd_lease, Resend::IfUnavailable).await;
    }
    Ok(view_of(record, 0))
}

/// Replaces a live lease's value: rewrites its records in one transaction that checks its
/// lease key is unchanged since read, keeping them on the same etcd lease.
pub(crate) async fn proclaim(
    issuer: &EtcdIssuer,
    lease_id: &str,
    value: Option<Vec<u8>>,
    may: MayAct<'_>,
) -> Result<LeaseView, LeaseError> {
    let etcd = &issuer.etcd;
    let keys = &etcd.keys;
    let lease_key = keys.lease(lease_id);
    for attempt in 0..MAX_ATTEMPTS {
        let snap = etcd
            .read("read lease", vec![TxnOp::get(lease_key.clone(), None)])
            .await?;
        let Some(kv) = snap.first(0) else {
            return Err(LeaseError::Expired);
        };
        let mut record: HolderRecord = from_json(kv.key(), kv.value())?;
        may_act(&record, may)?;
        record.value = value.as_deref().map(palisade_issuer::value::encode);
        let attached = Some(PutOptions::new().with_lease(record.etcd_lease));
        let mut writes = vec![
            TxnOp::put(keys.holder(&record.lock), json(&record), attached.clone()),
            TxnOp::put(lease_key.clone(), json(&record), attached.clone()),
        ];
        if let Some(session) = &record.session {
            writes.push(TxnOp::put(
                keys.session_lease(session, lease_id),
                json(&record),
                attached,
            ));
        }
        let compares = vec![Compare::mod_revision(
            lease_key.clone(),
            CompareOp::Equal,
            kv.mod_revision(),
        )];
        let txn = etcd_client::Txn::new().when(compares).and_then(writes);
        let answer = etcd
            .call_raw("proclaim", Resend::IfNeverReceived, || {
                let (mut kv, txn) = (etcd.client.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        match answer {
            Ok(response) if response.succeeded() => {
                return Ok(view_of(&record, record.ttl_ms));
            }
            // Changed since read (another proclaim, or a renewal of its session's keys):
            // read again.
            Ok(_) => backoff(attempt).await,
            // The lease ran out between the read and the write.
            Err(e) if is_lease_not_found(&e) => return Err(LeaseError::Expired),
            Err(e) => return Err(storage("proclaim", e).into()),
        }
    }
    Err(contended("proclaim").into())
}

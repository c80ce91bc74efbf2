//! The gate inside Redis (feature `redis`): one Lua script compares, advances and writes.
//!
//! ```no_run
//! # async fn example(verifier: &palisade_token::Verifier, token: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_adapters::redis::RedisFence;
//!
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let mut con = client.get_multiplexed_async_connection().await?;
//! // Refuses a Redis that cannot keep a mark durable (appendonly, appendfsync).
//! let fence = RedisFence::connect(&mut con).await?;
//! // Writes both keys, or neither if the token is stale.
//! fence
//!     .fenced_set(&mut con, verifier, token, "orders",
//!         &[("{orders}:42", b"shipped".as_slice()), ("{orders}:count", b"7".as_slice())])
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! ## How it works, and why trusting the script's epoch is acceptable
//! The token is verified here, in Rust (cached Ed25519 verification, lock name checked);
//! only then is the script called, with the *verified* epoch as an argument. The script
//! (`fenced_write.lua`) reads the lock's mark from the hash `palisade:fence:{<lock>}`,
//! refuses a smaller epoch, and otherwise raises the mark and writes the data keys. Redis
//! runs a script to completion without interleaving other commands, so compare, advance
//! and write are one atomic step (S6).
//!
//! The script itself believes any epoch it is handed. That is acceptable because nothing
//! else about a Redis client is checked either: a client allowed to call `EVALSHA` may
//! equally `SET` the data key directly. Fencing here protects against *stale holders
//! using this adapter*, not against clients that bypass it; keep the data keys and the
//! fence hash writable only by code that goes through [`RedisFence`] (Redis ACLs), since
//! fencing is not access control (S14).
//!
//! ## Durability and replication
//! The mark is only as durable as Redis makes it. Without `appendonly yes` and
//! `appendfsync always`, a Redis restart can lose the last marks together with the data,
//! and a rolled-back mark admits old holders again (S11). With replicas, a failover to a
//! replica that missed the last script can do the same (S7): fence against the primary
//! and treat a failover as a restore: raise the promoted node's marks
//! ([`RedisFence::raise_marks`], `palisade admin raise-marks`), or have every call wait for
//! its replicas first ([`RedisFence::wait_for_replicas`]).
//!
//! ## Redis Cluster
//! All keys of one call must hash to one slot. The fence hash's key carries the hash tag
//! `{<lock>}`, so give the data keys the same tag (`{orders}:42`).

use palisade_core::gate::{HighWater, Policy};
use redis::aio::ConnectionLike;
use redis::Script;

use crate::admission::{decide, Admitted, Trust};
use crate::error::{AdmitError, CorruptFence};
use crate::report::ResourceKind;

/// The Lua source run by [`RedisFence`].
pub const SCRIPT: &str = include_str!("fenced_write.lua");

/// The fenced write operations for Redis. Cheap to clone; build one and reuse it so the
/// script's SHA is computed once (calls use `EVALSHA`, falling back to `EVAL`).
#[derive(Debug, Clone)]
pub struct RedisFence {
    script: Script,
    /// With [`RedisFence::wait_for_replicas`]: (replicas, timeout in ms) of a `WAIT`
    /// after every call that changed something.
    replicas: Option<(u32, u64)>,
}

/// An admitted call that fewer replicas acknowledged than
/// [`RedisFence::wait_for_replicas`] asked for. Reported as [`AdmitError::Backend`].
#[derive(Debug, thiserror::Error)]
#[error(
    "the call was admitted and applied on the primary, but only {acked} of {wanted} \
     replicas acknowledged it in time: a failover now could lose its mark. Retry it (the \
     same epoch is admitted again) or treat it as not done"
)]
pub struct NotReplicated {
    pub acked: u32,
    pub wanted: u32,
}

enum Op<'a> {
    Set(&'a [(&'a str, &'a [u8])]),
    Del(&'a [&'a str]),
    Fence,
}

impl RedisFence {
    /// A fence, once `con`'s Redis passed [`RedisFence::preflight`]: build it once at
    /// start and share it (the script's SHA is computed once).
    pub async fn connect(con: &mut impl ConnectionLike) -> Result<Self, AdmitError> {
        Self::preflight(con).await?;
        Ok(Self::unchecked())
    }

    /// A fence without the settings check: for a Redis whose durability is ensured some
    /// other way, and for tests.
    pub fn unchecked() -> Self {
        RedisFence {
            script: Script::new(SCRIPT),
            replicas: None,
        }
    }

    /// Checks that Redis can keep a mark durable ([`crate::preflight::redis`]: `appendonly
    /// yes`, `appendfsync always`), by `CONFIG GET`: [`AdmitError::UnsafeDatabase`] names
    /// every setting that breaks it. A Redis that refuses `CONFIG` (a managed service that
    /// renamed it) is a backend error: check its settings by hand and use
    /// [`RedisFence::unchecked`].
    pub async fn preflight(con: &mut impl ConnectionLike) -> Result<(), AdmitError> {
        let mut setting = async |name: &str| -> Result<String, AdmitError> {
            let pair: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(con)
                .await
                .map_err(AdmitError::backend)?;
            match pair.as_slice() {
                [_, value] => Ok(value.clone()),
                _ => Err(AdmitError::backend(format!(
                    "CONFIG GET {name} answered {pair:?}"
                ))),
            }
        };
        let appendonly = setting("appendonly").await?;
        let appendfsync = setting("appendfsync").await?;
        Ok(crate::preflight::redis(&appendonly, &appendfsync)?)
    }

    /// After every admitted call, waits until `replicas` replicas have acknowledged the
    /// connection's writes (Redis `WAIT`), at most `timeout`; fewer in time is an error
    /// ([`NotReplicated`]), although the primary applied the call. So that a replica
    /// promoted after a failover already holds every mark a caller was told about, and a
    /// fenced-out holder stays out without `raise-marks`. The cost: one more round trip
    /// per call, and the time the replicas take to acknowledge. `WAIT` counts the
    /// replicas that received the writes, not ones that made them durable.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.replicas = (replicas > 0).then_some((replicas, ms));
        self
    }

    /// The `WAIT` of [`RedisFence::wait_for_replicas`], if asked for.
    async fn replicated(&self, con: &mut impl ConnectionLike) -> Result<(), AdmitError> {
        let Some((wanted, timeout_ms)) = self.replicas else {
            return Ok(());
        };
        let acked: i64 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(timeout_ms)
            .query_async(con)
            .await
            .map_err(AdmitError::backend)?;
        let acked = u32::try_from(acked).unwrap_or(0);
        if acked < wanted {
            return Err(AdmitError::backend(NotReplicated { acked, wanted }));
        }
        Ok(())
    }

    /// The key of the hash that holds `lock`'s high-water mark.
    pub fn fence_key(lock: &str) -> String {
        format!("palisade:fence:{{{lock}}}")
    }

    /// Sets every `(key, value)` pair if `token` is admitted for `lock`, atomically with
    /// the mark. A refused call writes nothing.
    pub async fn fenced_set<'t>(
        &self,
        con: &mut impl ConnectionLike,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
        pairs: &[(&str, &[u8])],
    ) -> Result<Admitted, AdmitError> {
        self.run(con, trust.into(), token, lock, Op::Set(pairs))
            .await
    }

    /// Deletes `keys` if `token` is admitted for `lock`. The mark itself is never deleted.
    pub async fn fenced_del<'t>(
        &self,
        con: &mut impl ConnectionLike,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
        keys: &[&str],
    ) -> Result<Admitted, AdmitError> {
        self.run(con, trust.into(), token, lock, Op::Del(keys))
            .await
    }

    /// A barrier: raises the mark to the token's epoch without writing data. A new holder
    /// calls it before working so that older holders are refused from then on (S10).
    pub async fn fence<'t>(
        &self,
        con: &mut impl ConnectionLike,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
    ) -> Result<Admitted, AdmitError> {
        self.run(con, trust.into(), token, lock, Op::Fence).await
    }

    /// After Redis was restored from an older RDB or AOF file, or a replica that missed
    /// the last scripts was promoted: raises each `(lock, epoch)` mark to at least `epoch`
    /// with the same script a barrier runs (so by the same rule), all in one `MULTI`/`EXEC`
    /// (all or none; on Redis Cluster the marks of one call must share a slot: call it per
    /// lock). Never lowers a mark. Returns how many marks went up. `palisade admin
    /// raise-marks` calls it with the issuer's bound of every lock.
    pub async fn raise_marks(
        &self,
        con: &mut impl ConnectionLike,
        marks: &[(String, u64)],
    ) -> Result<usize, AdmitError> {
        if marks.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (lock, epoch) in marks {
            pipe.cmd("EVAL")
                .arg(SCRIPT)
                .arg(1)
                .arg(Self::fence_key(lock))
                .arg(epoch.to_string())
                .arg("fence");
        }
        let answers: Vec<(i64, String)> =
            pipe.query_async(con).await.map_err(AdmitError::backend)?;
        let mut raised = 0;
        for ((lock, epoch), (admitted, mark)) in marks.iter().zip(&answers) {
            let before = parse_mark(mark)?;
            match (*admitted, before < *epoch) {
                (1, raised_it) => raised += usize::from(raised_it),
                (0, false) => {} // already at or above it
                _ => {
                    return Err(AdmitError::backend(CorruptFence(format!(
                        "fence script refused to raise {lock} from {mark} to {epoch}"
                    ))))
                }
            }
        }
        self.replicated(con).await?;
        Ok(raised)
    }

    /// The lock's current mark (`0` if never fenced). For inspection only.
    pub async fn high_water(
        &self,
        con: &mut impl ConnectionLike,
        lock: &str,
    ) -> Result<HighWater, AdmitError> {
        let mark: Option<String> = redis::cmd("HGET")
            .arg(Self::fence_key(lock))
            .arg("epoch")
            .query_async(con)
            .await
            .map_err(AdmitError::backend)?;
        let epoch = match mark {
            Some(text) => parse_mark(&text)?,
            None => 0,
        };
        Ok(HighWater { epoch, seq: 0 })
    }

    async fn run(
        &self,
        con: &mut impl ConnectionLike,
        trust: Trust<'_>,
        token: &str,
        lock: &str,
        op: Op<'_>,
    ) -> Result<Admitted, AdmitError> {
        let outcome = async {
            let claims = trust.verify_for_lock(token, lock)?;
            let mut call = self.script.key(Self::fence_key(lock));
            call.arg(claims.epoch.to_string());
            match op {
                Op::Set(pairs) => {
                    call.arg("set");
                    for (key, value) in pairs {
                        call.key(*key).arg(*value);
                    }
                }
                Op::Del(keys) => {
                    call.arg("del");
                    for key in keys {
                        call.key(*key);
                    }
                }
                Op::Fence => {
                    call.arg("fence");
                }
            }
            let (admitted, mark): (i64, String) =
                call.invoke_async(con).await.map_err(AdmitError::backend)?;
            let current = HighWater {
                epoch: parse_mark(&mark)?,
                seq: 0,
            };
            // The script decided; running the same rule here both maps its refusal to the
            // typed error and catches a script that disagrees with the core rule.
            let decision = decide(current, Policy::Epoch, &claims, None);
            match (admitted, decision) {
                (1, Ok(admitted)) => {
                    self.replicated(con).await?;
                    Ok(admitted)
                }
                (0, Err(refused)) => Err(refused),
                _ => Err(AdmitError::backend(CorruptFence(format!(
                    "fence script and gate rule disagree on epoch {} against mark {mark}",
                    claims.epoch
                )))),
            }
        }
        .await;
        trust.record(ResourceKind::Redis, lock, &outcome);
        outcome
    }
}

fn parse_mark(text: &str) -> Result<u64, AdmitError> {
    text.parse()
        .map_err(|_| AdmitError::backend(CorruptFence(format!("mark {text:?} in Redis"))))
}

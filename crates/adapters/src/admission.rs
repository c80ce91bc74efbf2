//! The steps every adapter shares: verify the token for the resource's lock, then apply
//! the gate rule of `palisade-core` to the mark read inside the backend's transaction.

use std::sync::Arc;

use palisade_core::gate::{self, GateError, HighWater, Policy};
use palisade_token::{Claims, Epoch, Verifier};

use crate::error::AdmitError;
use crate::report::{GateTally, ResourceKind};

/// What an admitted operation may rely on. Returned only after the mark was advanced inside
/// the caller's transaction (SQL) or together with the write (Redis, object store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The verified claims of the token (lock, epoch, holder, key id).
    pub claims: Arc<Claims>,
    /// The mark before this operation: `epoch 0` when the resource had never seen the lock.
    pub previous: HighWater,
    /// The mark this operation commits together with its write.
    pub high_water: HighWater,
}

impl Admitted {
    /// The admitted epoch.
    pub fn epoch(&self) -> Epoch {
        self.claims.epoch
    }
}

/// Which tokens a resource admits: genuine ones (verified by a [`Verifier`] holding the
/// issuer's public keys), and, if asked, only those held by one principal.
///
/// With the server's authentication on, a token's holder is the principal that acquired
/// it (`<principal>` or `<principal>/<label>`). A resource written by one service can
/// require that principal: a token leaked from it is then refused here even though it is
/// genuine, so it cannot be replayed by another service. Every adapter function takes
/// `impl Into<Trust>`, so passing a `&Verifier` trusts every genuine token, as before.
#[derive(Clone, Copy)]
pub struct Trust<'a> {
    verifier: &'a Verifier,
    principal: Option<&'a str>,
    tally: Option<&'a GateTally>,
}

impl<'a> Trust<'a> {
    /// Every genuine token.
    pub fn new(verifier: &'a Verifier) -> Self {
        Trust {
            verifier,
            principal: None,
            tally: None,
        }
    }

    /// Only tokens whose holder is `principal` or `principal/<label>`.
    pub fn held_by(self, principal: &'a str) -> Self {
        Trust {
            principal: Some(principal),
            ..self
        }
    }

    /// Counts every admit made with this trust in `tally`: admitted, or refused by code
    /// (see [`crate::report`]). Nothing is sent on the write's path.
    pub fn reporting_to(self, tally: &'a GateTally) -> Self {
        Trust {
            tally: Some(tally),
            ..self
        }
    }

    /// Counts `outcome`, an admit of `lock`'s data in a `resource`, if this trust reports.
    pub(crate) fn record(
        &self,
        resource: ResourceKind,
        lock: &str,
        outcome: &Result<Admitted, AdmitError>,
    ) {
        if let Some(tally) = self.tally {
            let seen = outcome.as_ref().map(|a| a.high_water.epoch);
            tally.record(resource, lock, seen);
        }
    }

    /// Checks that `token` is present, genuine, names `lock` and, if asked, is held by
    /// the principal. Touches no resource, so a refusal here has written nothing.
    pub(crate) fn verify_for_lock(
        &self,
        token: &str,
        lock: &str,
    ) -> Result<Arc<Claims>, AdmitError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AdmitError::MissingToken);
        }
        let claims = self.verifier.verify(token)?;
        if claims.lock != lock {
            return Err(AdmitError::WrongLock {
                expected: lock.to_owned(),
                token_lock: claims.lock.clone(),
            });
        }
        if let Some(principal) = self.principal {
            if !palisade_token::holder_belongs_to(&claims.holder, principal) {
                return Err(AdmitError::NotHolder {
                    principal: principal.to_owned(),
                    token_holder: claims.holder.clone(),
                });
            }
        }
        Ok(claims)
    }
}

impl std::fmt::Debug for Trust<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("principal", &self.principal)
            .field("reporting", &self.tally.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> From<&'a Verifier> for Trust<'a> {
    fn from(verifier: &'a Verifier) -> Self {
        Trust::new(verifier)
    }
}

impl<'a> From<&'a Arc<Verifier>> for Trust<'a> {
    fn from(verifier: &'a Arc<Verifier>) -> Self {
        Trust::new(verifier)
    }
}

/// The pure gate rule with its error mapped to [`AdmitError`].
pub(crate) fn decide(
    current: HighWater,
    policy: Policy,
    claims: &Arc<Claims>,
    seq: Option<u64>,
) -> Result<Admitted, AdmitError> {
    match gate::admit(current, policy, claims.epoch, seq) {
        Ok(high_water) => Ok(Admitted {
            claims: claims.clone(),
            previous: current,
            high_water,
        }),
        Err(GateError::Stale { high_water, epoch }) => Err(AdmitError::Stale { high_water, epoch }),
        Err(GateError::StaleSequence {
            high_water,
            high_water_seq,
            epoch,
            seq,
        }) => Err(AdmitError::StaleSequence {
            high_water,
            high_water_seq,
            epoch,
            seq,
        }),
        // Only reachable if an adapter passed the sequence policy without a number, which
        // none does; report it rather than admit.
        Err(e @ GateError::MissingSequence) => Err(AdmitError::backend(e)),
    }
}

/// One admission as the SQL gates carry it out: the token, the lock it must be for, and
/// the policy with its sequence number.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[derive(Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub token: &'a str,
    pub lock: &'a str,
    policy: Policy,
    seq: Option<u64>,
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl<'a> Ask<'a> {
    /// Under the epoch policy.
    pub(crate) fn epoch(token: &'a str, lock: &'a str) -> Self {
        Ask {
            token,
            lock,
            policy: Policy::Epoch,
            seq: None,
        }
    }

    /// Under the sequence policy, with `seq`.
    pub(crate) fn sequenced(token: &'a str, lock: &'a str, seq: u64) -> Self {
        Ask {
            token,
            lock,
            policy: Policy::Sequence,
            seq: Some(seq),
        }
    }

    /// The rule against the lock's `current` mark for the verified `claims`; on
    /// admission, also the new mark's epoch and sequence number as SQL integers.
    pub(crate) fn decide(
        &self,
        claims: &Arc<Claims>,
        current: HighWater,
    ) -> Result<(Admitted, i64, i64), AdmitError> {
        let admitted = decide(current, self.policy, claims, self.seq)?;
        let epoch = to_sql_int(admitted.high_water.epoch, "epoch")?;
        let seq = to_sql_int(admitted.high_water.seq, "sequence number")?;
        Ok((admitted, epoch, seq))
    }
}

/// SQL integers are signed 64-bit; epochs and sequence numbers are unsigned. Values past
/// `i64::MAX` are refused rather than wrapped, since a wrapped mark would compare wrongly.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn to_sql_int(value: u64, what: &'static str) -> Result<i64, AdmitError> {
    i64::try_from(value)
        .map_err(|_| AdmitError::backend(format!("{what} {value} exceeds the SQL integer range")))
}

/// Reads a stored mark back; a negative value means the fence table was edited by hand.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn from_sql_mark(epoch: i64, seq: i64) -> Result<HighWater, AdmitError> {
    match (u64::try_from(epoch), u64::try_from(seq)) {
        (Ok(epoch), Ok(seq)) => Ok(HighWater { epoch, seq }),
        _ => Err(AdmitError::backend(crate::error::CorruptFence(format!(
            "negative mark ({epoch}, {seq}) in the fence table"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_token::{KeyRing, Signer};

    fn verifier(signer: &Signer) -> Verifier {
        let mut ring = KeyRing::new();
        ring.insert(signer.public_key());
        Verifier::new(ring, 16)
    }

    #[test]
    fn token_checks_come_first_and_are_typed() {
        let signer = Signer::generate();
        let v = verifier(&signer);
        assert!(matches!(
            Trust::new(&v).verify_for_lock("  ", "a"),
            Err(AdmitError::MissingToken)
        ));
        for bad in ["2", "true", "pal1.x.y"] {
            assert!(matches!(
                Trust::new(&v).verify_for_lock(bad, "a"),
                Err(AdmitError::InvalidToken(_))
            ));
        }
        let other = signer.issue("b", 1, "h");
        assert!(matches!(
            Trust::new(&v).verify_for_lock(&other, "a"),
            Err(AdmitError::WrongLock { expected, token_lock }) if expected == "a" && token_lock == "b"
        ));
        let good = signer.issue("a", 3, "h");
        assert_eq!(
            Trust::new(&v)
                .verify_for_lock(&good, "a")
                .map(|c| c.epoch)
                .ok(),
            Some(3)
        );
    }

    #[test]
    fn a_resource_may_require_the_holders_principal() {
        let signer = Signer::generate();
        let v = verifier(&signer);
        let billing = Trust::new(&v).held_by("billing");
        for holder in ["billing", "billing/worker-1"] {
            let token = signer.issue("a", 1, holder);
            assert!(billing.verify_for_lock(&token, "a").is_ok(), "{holder}");
        }
        for holder in ["billing2", "other/billing", "other", "bill"] {
            let token = signer.issue("a", 1, holder);
            let refused = billing.verify_for_lock(&token, "a");
            assert!(
                matches!(&refused, Err(AdmitError::NotHolder { principal, token_holder })
                    if principal == "billing" && token_holder == holder),
                "{holder}: {refused:?}"
            );
            assert_eq!(
                refused.unwrap_err().code(),
                palisade_api::ErrorCode::PermissionDenied
            );
        }
        // Without the requirement every genuine token passes.
        let other = signer.issue("a", 1, "other");
        assert!(Trust::new(&v).verify_for_lock(&other, "a").is_ok());
    }

    #[test]
    fn decide_maps_the_core_rule() {
        let signer = Signer::generate();
        let claims = verifier(&signer).verify(&signer.issue("a", 1, "h")).ok();
        let Some(claims) = claims else {
            panic!("genuine token must verify")
        };
        let mark = HighWater { epoch: 2, seq: 0 };
        assert!(matches!(
            decide(mark, Policy::Epoch, &claims, None),
            Err(AdmitError::Stale {
                high_water: 2,
                epoch: 1
            })
        ));
        let ok = decide(HighWater::default(), Policy::Epoch, &claims, None);
        assert_eq!(ok.map(|a| a.high_water.epoch).ok(), Some(1));
    }
}

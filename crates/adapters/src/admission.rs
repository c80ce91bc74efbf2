//! The steps every adapter shares: verify the token for the resource's lock, then apply
//! the gate rule of `palisade-core` to the mark read inside the backend's transaction.

use std::sync::Arc;

use palisade_core::gate::{self, GateError, HighWater, Policy};
use palisade_token::{Claims, Epoch, Verifier};

use crate::error::AdmitError;

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

/// Checks that `token` is present, genuine and names `lock`. Touches no resource, so a
/// refusal here has written nothing.
pub(crate) fn verify_for_lock(
    verifier: &Verifier,
    token: &str,
    lock: &str,
) -> Result<Arc<Claims>, AdmitError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(AdmitError::MissingToken);
    }
    let claims = verifier.verify(token)?;
    if claims.lock != lock {
        return Err(AdmitError::WrongLock {
            expected: lock.to_owned(),
            token_lock: claims.lock.clone(),
        });
    }
    Ok(claims)
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

/// SQL integers are signed 64-bit; epochs and sequence numbers are unsigned. Values past
/// `i64::MAX` are refused rather than wrapped, since a wrapped mark would compare wrongly.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn to_sql_int(value: u64, what: &'static str) -> Result<i64, AdmitError> {
    i64::try_from(value)
        .map_err(|_| AdmitError::backend(format!("{what} {value} exceeds the SQL integer range")))
}

/// Reads a stored mark back; a negative value means the fence table was edited by hand.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
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
            verify_for_lock(&v, "  ", "a"),
            Err(AdmitError::MissingToken)
        ));
        for bad in ["2", "true", "pal1.x.y"] {
            assert!(matches!(
                verify_for_lock(&v, bad, "a"),
                Err(AdmitError::InvalidToken(_))
            ));
        }
        let other = signer.issue("b", 1, "h");
        assert!(matches!(
            verify_for_lock(&v, &other, "a"),
            Err(AdmitError::WrongLock { expected, token_lock }) if expected == "a" && token_lock == "b"
        ));
        let good = signer.issue("a", 3, "h");
        assert_eq!(
            verify_for_lock(&v, &good, "a").map(|c| c.epoch).ok(),
            Some(3)
        );
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

//! The gate rule: the high-water comparison every fenced mutation passes.
//!
//! A namespace's [`HighWater`] is the largest (epoch, seq) it has admitted. The rule
//! depends on the namespace's [`Policy`], set by the server operator, never by clients:
//!
//! - [`Policy::Epoch`] (default): reject `epoch < high_water.epoch`; admit an equal or
//!   larger epoch and raise the mark to it. A holder writes many times in its epoch (S8).
//! - [`Policy::Sequence`]: every operation carries a sequence number and (epoch, seq) must
//!   strictly exceed the mark. This is a different, stricter protocol: it orders the
//!   operations inside one epoch too, so a delayed or replayed write of the current holder
//!   is refused once a later one landed.
//!
//! [`admit`] is a pure function. It is correct only when the caller reads the mark and
//! writes the result in one atomic, durable transaction together with the guarded
//! mutation (S6); storage backends are built that way.

use serde::{Deserialize, Serialize};

use palisade_token::Epoch;

/// Largest (epoch, seq) a namespace has admitted. `seq` stays 0 under [`Policy::Epoch`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct HighWater {
    pub epoch: Epoch,
    pub seq: u64,
}

impl HighWater {
    /// The mark with the restore floor applied: after a restore, every namespace's mark
    /// is at least `floor` (as `(floor, 0)`), whether or not the restored store knew the
    /// namespace, so every token from before the restore is stale. The one rule every
    /// backend reads its marks through; a mark already at or above the floor is unchanged.
    pub fn at_least(self, floor: Epoch) -> HighWater {
        if floor > self.epoch {
            HighWater {
                epoch: floor,
                seq: 0,
            }
        } else {
            self
        }
    }
}

/// How a namespace orders the operations it admits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Equal epochs are admitted; smaller ones are rejected.
    #[default]
    Epoch,
    /// (epoch, seq) must strictly increase with every operation.
    Sequence,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epoch" => Ok(Policy::Epoch),
            "sequence" => Ok(Policy::Sequence),
            other => Err(format!(
                "unknown policy {other:?} (expected epoch or sequence)"
            )),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Epoch => "epoch",
            Policy::Sequence => "sequence",
        })
    }
}

/// Why the gate refused an operation. A refused operation must change nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The token's epoch is older than the newest this namespace has admitted.
    #[error("stale token: epoch {epoch} is below the high-water mark {high_water}")]
    Stale { high_water: Epoch, epoch: Epoch },
    /// Same epoch, but the sequence number does not exceed the last admitted one.
    #[error("stale sequence: ({epoch}, {seq}) does not exceed ({high_water}, {high_water_seq})")]
    StaleSequence {
        high_water: Epoch,
        high_water_seq: u64,
        epoch: Epoch,
        seq: u64,
    },
    /// A `sequence` namespace was sent an operation without a sequence number.
    #[error(
        "this namespace uses the sequence policy: every write needs a sequence number \
         (HTTP: the Fencing-Seq header; CLI: --seq; RESP: SEQ)"
    )]
    MissingSequence,
}

/// Applies the gate rule. Returns the new high-water mark to store with the mutation.
pub fn admit(
    current: HighWater,
    policy: Policy,
    epoch: Epoch,
    seq: Option<u64>,
) -> Result<HighWater, GateError> {
    if epoch < current.epoch {
        return Err(GateError::Stale {
            high_water: current.epoch,
            epoch,
        });
    }
    match policy {
        Policy::Epoch => Ok(HighWater { epoch, seq: 0 }),
        Policy::Sequence => {
            let seq = seq.ok_or(GateError::MissingSequence)?;
            if epoch == current.epoch && seq <= current.seq {
                return Err(GateError::StaleSequence {
                    high_water: current.epoch,
                    high_water_seq: current.seq,
                    epoch,
                    seq,
                });
            }
            Ok(HighWater { epoch, seq })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_restore_floor_raises_a_mark_below_it_only() {
        let mark = HighWater { epoch: 5, seq: 9 };
        assert_eq!(mark.at_least(0), mark);
        assert_eq!(mark.at_least(5), mark, "a mark at the floor keeps its seq");
        assert_eq!(mark.at_least(7), HighWater { epoch: 7, seq: 0 });
        assert_eq!(
            HighWater::default().at_least(3),
            HighWater { epoch: 3, seq: 0 }
        );
        // Every token from before the restore is then refused.
        assert!(admit(mark.at_least(7), Policy::Epoch, 6, None).is_err());
    }

    #[test]
    fn fencing_py_sequence() {
        // The sample scenario of the source article, on the pure rule.
        let mut hw = HighWater::default();
        hw = admit(hw, Policy::Epoch, 1, None).unwrap(); // old leader first: admitted (S10)
        hw = admit(hw, Policy::Epoch, 2, None).unwrap();
        assert_eq!(
            admit(hw, Policy::Epoch, 1, None),
            Err(GateError::Stale {
                high_water: 2,
                epoch: 1
            })
        );
        hw = admit(hw, Policy::Epoch, 2, None).unwrap(); // equal epoch: admitted (S8)
        hw = admit(hw, Policy::Epoch, 3, None).unwrap();
        assert!(admit(hw, Policy::Epoch, 2, None).is_err());
        assert_eq!(hw, HighWater { epoch: 3, seq: 0 });
    }

    #[test]
    fn sequence_policy() {
        let hw = admit(HighWater::default(), Policy::Sequence, 1, Some(1)).unwrap();
        assert_eq!(
            admit(hw, Policy::Sequence, 1, None),
            Err(GateError::MissingSequence)
        );
        assert!(matches!(
            admit(hw, Policy::Sequence, 1, Some(1)),
            Err(GateError::StaleSequence { .. })
        ));
        let hw = admit(hw, Policy::Sequence, 1, Some(5)).unwrap();
        // A new epoch may restart its sequence.
        let hw = admit(hw, Policy::Sequence, 2, Some(1)).unwrap();
        assert_eq!(hw, HighWater { epoch: 2, seq: 1 });
        assert!(matches!(
            admit(hw, Policy::Sequence, 1, Some(99)),
            Err(GateError::Stale { .. })
        ));
    }

    proptest! {
        /// Random interleavings: after a larger epoch is admitted, no smaller one ever is,
        /// and the mark never goes down.
        #[test]
        fn never_admits_smaller_after_larger(
            ops in proptest::collection::vec((1u64..20, 0u64..5, any::<bool>()), 1..200)
        ) {
            for policy in [Policy::Epoch, Policy::Sequence] {
                let mut hw = HighWater::default();
                let mut max_admitted = 0u64;
                for &(epoch, seq, with_seq) in &ops {
                    let seq = (with_seq || policy == Policy::Sequence).then_some(seq);
                    match admit(hw, policy, epoch, seq) {
                        Ok(next) => {
                            prop_assert!(epoch >= max_admitted, "admitted {} after {}", epoch, max_admitted);
                            prop_assert!(next >= hw);
                            max_admitted = epoch;
                            hw = next;
                        }
                        Err(GateError::Stale { .. }) => prop_assert!(epoch < hw.epoch),
                        Err(GateError::StaleSequence { .. }) => {
                            prop_assert_eq!(policy, Policy::Sequence);
                            prop_assert!((epoch, seq.unwrap_or(0)) <= (hw.epoch, hw.seq));
                        }
                        Err(GateError::MissingSequence) => prop_assert!(false, "seq always given"),
                    }
                }
            }
        }
    }
}

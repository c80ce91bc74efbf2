//! The toy store of the controls: Palisade's store, in memory, in two modes.
//!
//! - [`Check::Nothing`]: **deliberately unsafe; never use it for anything but a negative
//!   control.** It answers `PUT`, `DELETE` and `POST /v1/fences/{lock}` with 200 whatever
//!   token they carry (or none), exactly the "number in a header that nobody checks" that
//!   S2 warns about. It reads the epoch out of the token's payload only to echo it back
//!   the way the real store does, without verifying the signature or comparing it.
//! - [`Check::Epoch`]: the same store with the gate rule ([`palisade_core::gate::admit`],
//!   epoch policy) applied to that claimed epoch, under the same mutex as the mutation
//!   (S5, S6): a smaller epoch than the namespace's mark is refused with `stale_token`.
//!   The etcd-lock-fenced control uses it with etcd's lock revision as the epoch. The
//!   epoch is *not* authenticated (no signature): this mode shows what checking at the
//!   resource buys, not what signed tokens buy (S14).
//!
//! State lives in memory, behind one mutex that is never held across an `.await`; it has
//! nothing durable, so the controls never kill it. Its routes are the [`GateStore`]'s,
//! the HTTP side the gate targets' applications use too: only what happens behind them
//! differs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;

use palisade_adapters::AdmitError;
use palisade_api::wire::{FenceAnswer, WriteAnswer};
use palisade_core::gate::{self, HighWater, Policy};

use super::gate_store::{Entry, GateStore, GatedDb, Mutation, StoreError};
use crate::VerifyError;

/// What the toy store checks before a mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing: every mutation is applied.
    Nothing,
    /// The gate rule on the token's claimed epoch.
    Epoch,
}

/// Starts the toy store on a loopback port.
pub async fn start(check: Check) -> Result<GateStore, VerifyError> {
    let toy = Toy {
        check,
        state: Mutex::new(State::default()),
    };
    GateStore::start(Arc::new(toy)).await
}

struct Toy {
    check: Check,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    revision: u64,
    /// (namespace, key) -> (value, revision, epoch that wrote it)
    values: BTreeMap<(String, String), (Bytes, u64, u64)>,
    /// Per namespace: the largest epoch admitted ([`Check::Epoch`] only).
    marks: HashMap<String, HighWater>,
}

impl Toy {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the map half-updated (every update is one insert).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Runs the gate for a mutation of `ns` with `epoch`.
    fn gate(&mut self, check: Check, ns: &str, epoch: u64) -> Result<(), StoreError> {
        if check == Check::Nothing {
            return Ok(());
        }
        let mark = self.marks.get(ns).copied().unwrap_or_default();
        match gate::admit(mark, Policy::Epoch, epoch, None) {
            Ok(next) => {
                self.marks.insert(ns.to_owned(), next);
                Ok(())
            }
            Err(_) => Err(StoreError::Refused(AdmitError::Stale {
                high_water: mark.epoch,
                epoch,
            })),
        }
    }

    fn mark(&self, ns: &str) -> u64 {
        self.marks.get(ns).map_or(0, |m| m.epoch)
    }
}

/// The epoch written in a token's payload, unverified; 0 if there is none.
fn claimed_epoch(token: &str) -> u64 {
    let payload = token.split('.').nth(1).unwrap_or("");
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|claims| claims.get("e").and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

#[async_trait]
impl GatedDb for Toy {
    async fn mutate(&self, m: Mutation<'_>) -> Result<WriteAnswer, StoreError> {
        let Mutation {
            lock: ns,
            key,
            value,
            token,
        } = m;
        let epoch = claimed_epoch(token);
        let mut state = self.state();
        let entry = (ns.to_owned(), key.to_owned());
        if value.is_none() && !state.values.contains_key(&entry) {
            return Err(StoreError::NotFound);
        }
        state.gate(self.check, ns, epoch)?;
        state.revision += 1;
        let revision = state.revision;
        match value {
            Some(value) => state.values.insert(entry, (value, revision, epoch)),
            None => state.values.remove(&entry),
        };
        Ok(WriteAnswer { revision, epoch })
    }

    /// The barrier: with [`Check::Nothing`] a no-op that "succeeds" and establishes
    /// nothing; with [`Check::Epoch`] it raises the mark like a write.
    async fn fence(&self, ns: &str, token: &str) -> Result<FenceAnswer, StoreError> {
        let epoch = claimed_epoch(token);
        let mut state = self.state();
        state.gate(self.check, ns, epoch)?;
        let high_water = match self.check {
            Check::Nothing => epoch,
            Check::Epoch => state.mark(ns),
        };
        Ok(FenceAnswer {
            lock: ns.to_owned(),
            high_water,
            epoch,
        })
    }

    async fn read(&self, ns: &str, key: &str) -> Result<Option<Entry>, StoreError> {
        let state = self.state();
        let found = state.values.get(&(ns.to_owned(), key.to_owned()));
        Ok(found.map(|(value, revision, epoch)| Entry {
            value: value.clone(),
            revision: *revision,
            epoch: *epoch,
        }))
    }

    async fn list(&self, ns: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .state()
            .values
            .keys()
            .filter(|(n, k)| n == ns && k.starts_with(prefix))
            .map(|(_, k)| k.clone())
            .collect())
    }

    async fn high_water(&self, ns: &str) -> Result<u64, StoreError> {
        Ok(self.state().mark(ns))
    }

    fn policy(&self) -> &'static str {
        match self.check {
            Check::Nothing => "none",
            Check::Epoch => "epoch",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_client::Client;

    fn token(epoch: u64) -> String {
        let claims = format!(r#"{{"l":"set","e":{epoch},"h":"x","k":"k"}}"#);
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        format!("pal1.{payload}.forged")
    }

    #[tokio::test]
    async fn accepts_any_token_and_echoes_its_epoch() {
        let store = start(Check::Nothing).await.unwrap();
        let client = Client::new(&format!("http://{}", store.addr())).unwrap();
        let newer = client.fenced_kv("set", &token(7));
        let older = client.fenced_kv("set", "not-a-token");
        assert_eq!(newer.put("a", "new").await.unwrap().epoch, 7);
        // The late write of an older holder lands: nothing compares epochs here.
        assert_eq!(older.put("a", "old").await.unwrap().epoch, 0);
        let entry = client.kv("set").get("a").await.unwrap().unwrap();
        assert_eq!(&entry.value[..], b"old");
        assert_eq!(client.kv("set").list("").await.unwrap(), vec!["a"]);
        assert_eq!(older.fence().await.unwrap(), 0);
        assert!(client.kv("set").get("missing").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn the_epoch_check_refuses_older_epochs() {
        let store = start(Check::Epoch).await.unwrap();
        let client = Client::new(&format!("http://{}", store.addr())).unwrap();
        let (old, new) = (
            client.fenced_kv("set", &token(3)),
            client.fenced_kv("set", &token(5)),
        );
        // The old holder writes first: nothing newer has been seen yet (S10).
        assert_eq!(old.put("a", "old").await.unwrap().epoch, 3);
        assert_eq!(new.fence().await.unwrap(), 5);
        let refused = old.put("a", "late").await.unwrap_err();
        assert!(matches!(
            refused,
            palisade_client::Error::Stale {
                high_water: 5,
                epoch: 3
            }
        ));
        assert!(old.delete("a").await.unwrap_err().is_fenced());
        assert!(old.fence().await.unwrap_err().is_fenced());
        assert_eq!(new.put("a", "new").await.unwrap().epoch, 5);
        let entry = client.kv("set").get("a").await.unwrap().unwrap();
        assert_eq!(&entry.value[..], b"new");
        assert_eq!(client.high_water("set").await.unwrap().high_water, 5);
    }
}

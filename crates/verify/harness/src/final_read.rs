//! The final read: what the store holds once every worker has stopped.
//!
//! Read straight from the deployment (not through the proxies, which are gone by then),
//! after the proxies have discarded any bytes they still held, so no late write can land
//! after the snapshot. Each namespace of the workload is recorded, empty or not, so the
//! checkers can tell "empty" from "not recorded".

use std::time::Duration;

use palisade_checker::{FinalState, NamespaceState};
use palisade_client::Client;

use crate::VerifyError;

/// How long to keep trying while the server may still be coming back from a kill.
const ATTEMPTS: u32 = 20;
const RETRY_GAP: Duration = Duration::from_millis(250);

/// Reads every key and the high-water mark of each of `namespaces`, from the first of
/// `stores` (the nodes of the deployment) that answers every read.
pub async fn read(stores: &[Client], namespaces: &[&str]) -> Result<FinalState, VerifyError> {
    let mut last_error = String::from("no store to read");
    for attempt in 0..ATTEMPTS {
        let Some(store) = stores.get(attempt as usize % stores.len().max(1)) else {
            break;
        };
        match read_once(store, namespaces).await {
            Ok(state) => return Ok(state),
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(RETRY_GAP).await;
    }
    Err(VerifyError::Deploy(format!(
        "cannot read the final state: {last_error}"
    )))
}

async fn read_once(
    store: &Client,
    namespaces: &[&str],
) -> Result<FinalState, palisade_client::Error> {
    let mut state = FinalState::default();
    for &ns in namespaces {
        let kv = store.kv(ns);
        let mut values = std::collections::BTreeMap::new();
        for key in kv.list("").await? {
            // A key listed but gone by the time it is read cannot happen once writers are
            // stopped; if it does, recording it as absent is what the store says.
            if let Some(entry) = kv.get(&key).await? {
                values.insert(key, String::from_utf8_lossy(&entry.value).into_owned());
            }
        }
        let high_water = store.high_water(ns).await?.high_water;
        state
            .namespaces
            .insert(ns.to_owned(), NamespaceState { high_water, values });
    }
    Ok(state)
}

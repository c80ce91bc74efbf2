//! Keeping a resource's verifier in step with the issuer's keys (key rotation).
//!
//! A resource that verifies tokens itself (a `palisade-adapters` gate) trusts the keys
//! `GET /v1/keys` lists. When the issuer rotates, new tokens carry a key the resource
//! has not seen; when it retires a key, that key leaves the list. [`IssuerKeys`] holds one
//! [`Verifier`] and replaces its ring with the listed keys:
//!
//! - on [`IssuerKeys::refresh`], which [`IssuerKeys::refresh_every`] calls periodically;
//! - on [`IssuerKeys::learn`], when a token names a key the ring does not hold, at most
//!   every [`MIN_REFRESH_GAP`] (tokens naming made-up keys cannot make it hammer the
//!   issuer).
//!
//! Each refresh keeps exactly the listed `active` and `verifying` keys: a key that left
//! the list, or is listed with another status, is dropped, and its tokens are refused from
//! then on, cached or not ([`Verifier::set_keys`]).
//!
//! ## What it does not do
//! - A retired key's tokens pass until the next refresh: pick the period for how long
//!   that may be.
//! - If the issuer cannot be reached, the keys in use stay (the refresh returns the
//!   error).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use palisade_token::{KeyListing, KeyRing, ListedKey, TokenError, Verifier};
use tokio::task::JoinHandle;

use crate::{Client, Error};

/// Shortest time between two refreshes caused by tokens of unknown keys.
pub const MIN_REFRESH_GAP: Duration = Duration::from_millis(500);

/// A verifier whose keys follow the issuer's. See the module docs.
pub struct IssuerKeys {
    client: Client,
    verifier: Arc<Verifier>,
    /// When the last refresh caused by an unknown key started.
    learned: tokio::sync::Mutex<Option<Instant>>,
}

impl IssuerKeys {
    /// Fetches the issuer's keys into a new verifier caching up to `cache` tokens.
    pub async fn fetch(client: Client, cache: usize) -> Result<Arc<IssuerKeys>, Error> {
        let keys = IssuerKeys {
            verifier: Arc::new(Verifier::new(KeyRing::new(), cache)),
            client,
            learned: tokio::sync::Mutex::new(None),
        };
        keys.refresh().await?;
        Ok(Arc::new(keys))
    }

    /// The verifier to hand to the adapters; its keys change under it on every refresh.
    pub fn verifier(&self) -> Arc<Verifier> {
        self.verifier.clone()
    }

    /// Replaces the verifier's keys with the ones the issuer lists now; returns how many
    /// are trusted.
    pub async fn refresh(&self) -> Result<usize, Error> {
        let listing = KeyListing {
            keys: self
                .client
                .keys()
                .await?
                .into_iter()
                .map(|k| ListedKey {
                    key_id: k.key_id,
                    alg: k.alg,
                    public_key: k.public_key,
                    status: k.status,
                })
                .collect(),
        };
        let ring = KeyRing::from_listing(&listing).map_err(|e| Error::Decode(e.to_string()))?;
        let trusted = ring.len();
        self.verifier.set_keys(ring);
        Ok(trusted)
    }

    /// Refreshes when `token` names a key the verifier does not hold (a key rotated in
    /// since the last refresh), at most every [`MIN_REFRESH_GAP`]; does nothing for any
    /// other token. Call it before admitting a token; the adapter's own verification then
    /// decides.
    pub async fn learn(&self, token: &str) -> Result<(), Error> {
        let seen = Instant::now();
        if !matches!(self.verifier.verify(token), Err(TokenError::UnknownKey(_))) {
            return Ok(());
        }
        let mut last = self.learned.lock().await;
        if last.is_some_and(|started| started >= seen) {
            // A refresh that started after this token was seen has finished.
            return Ok(());
        }
        if let Some(started) = *last {
            tokio::time::sleep_until((started + MIN_REFRESH_GAP).into()).await;
        }
        *last = Some(Instant::now());
        self.refresh().await.map(drop)
    }

    /// Refreshes every `period` in a background task, as long as this `IssuerKeys` lives
    /// (a failed refresh keeps the keys in use and tries again next period).
    pub fn refresh_every(self: &Arc<Self>, period: Duration) -> JoinHandle<()> {
        let keys: Weak<IssuerKeys> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(keys) = keys.upgrade() else { return };
                let _ = keys.refresh().await;
            }
        })
    }
}

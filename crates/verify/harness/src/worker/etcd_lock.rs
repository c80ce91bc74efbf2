//! etcd's own lock, for the etcd-lock controls: the recipe of etcd's `concurrency.Mutex`,
//! spoken over etcd's JSON gateway (`/v3/...`), so the worker needs no gRPC client.
//!
//! Acquire `lock`:
//! 1. grant a lease of the worker's TTL (whole seconds, at least 1);
//! 2. in one transaction, create the key `PREFIX<lock>/<lease id in hex>` attached to the
//!    lease if it does not exist yet, else read it: its create revision is this
//!    acquisition's place in line (and its epoch);
//! 3. the owner is the key under `PREFIX<lock>/` with the smallest create revision; poll
//!    until it is ours (etcd's Mutex watches the key just ahead instead; polling gives the
//!    same order) or until the wait runs out, then revoke the lease.
//!
//! While held, a background task renews the lease every TTL / 3. Release revokes the
//! lease, which deletes the key. The key's value is the holder's name, so the nemesis can
//! find the current holder.
//!
//! The epoch handed to the store is the lock key's create revision: etcd's revisions only
//! grow, so a later owner always has a larger one. It travels in a token-shaped string
//! (`pal1.<claims>.etcd-revision`) that the toy store reads; it is **not signed**, which
//! is fine for a control about *checking* at the resource and not fine for anything else
//! (S14).
//!
//! Every gateway call goes to the home member first and to the next member on a
//! transport error or a 5xx (etcd without a leader answers so); each call is idempotent
//! (granting twice orphans a lease that expires on its own; the create transaction reads
//! the key it may already have made).

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use palisade_client::Error;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::nodes::{try_next_node, unanswered, CallError};

/// Where the lock keys live in etcd.
pub(crate) const PREFIX: &str = "/palisade-verify/locks/";
/// Bound on one gateway call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiter asks whether it is first in line.
const POLL: Duration = Duration::from_millis(40);

/// etcd's JSON gateway on every member, tried from the home member on.
#[derive(Debug, Clone)]
pub(crate) struct EtcdGateway {
    http: reqwest::Client,
    bases: Vec<String>,
    home: usize,
}

/// A lock held through etcd.
pub(crate) struct EtcdHeld {
    pub lease: i64,
    pub revision: u64,
    pub keeper: JoinHandle<()>,
}

fn b64(text: &str) -> String {
    STANDARD.encode(text)
}

/// The first key after every key starting with `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return STANDARD.encode(bytes);
        }
    }
    STANDARD.encode([0u8])
}

/// etcd's gateway writes 64-bit integers as strings.
fn int(value: &Value) -> Option<i64> {
    match value {
        Value::String(s) => s.parse().ok(),
        other => other.as_i64(),
    }
}

/// The token-shaped string carrying an etcd revision as the epoch (unsigned).
pub(crate) fn revision_token(lock: &str, holder: &str, revision: u64) -> String {
    let claims = json!({"l": lock, "e": revision, "h": holder}).to_string();
    format!("pal1.{}.etcd-revision", URL_SAFE_NO_PAD.encode(claims))
}

impl EtcdGateway {
    pub fn new(bases: Vec<String>, home: usize) -> Result<EtcdGateway, Error> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true)
            .build()?;
        let home = home % bases.len().max(1);
        Ok(EtcdGateway { http, bases, home })
    }

    /// POSTs `body` to `path`, failing over between members.
    async fn post(&self, path: &str, body: &Value) -> Result<Value, CallError> {
        let mut earlier_unanswered = false;
        let n = self.bases.len();
        let mut last = Error::BadRequest("no etcd endpoints".into());
        for step in 0..n {
            let url = format!("{}{path}", self.bases[(self.home + step) % n]);
            let error = match self.http.post(url).json(body).send().await {
                Ok(resp) if resp.status().is_success() => match resp.json::<Value>().await {
                    Ok(value) => return Ok(value),
                    Err(e) => Error::Transport(e),
                },
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    Error::Api {
                        status,
                        code: "etcd_error".into(),
                        message: text,
                    }
                }
                Err(e) => Error::Transport(e),
            };
            if !try_next_node(&error) {
                return Err(CallError {
                    error,
                    earlier_unanswered,
                });
            }
            earlier_unanswered |= unanswered(&error);
            last = error;
        }
        Err(CallError {
            error: last,
            earlier_unanswered,
        })
    }

    async fn grant(&self, ttl_secs: i64) -> Result<i64, CallError> {
        let body = self
            .post("/v3/lease/grant", &json!({"TTL": ttl_secs}))
            .await?;
        int(&body["ID"]).ok_or_else(|| decode("lease grant", &body))
    }

    /// Renews `lease`; false once etcd says it is gone.
    pub async fn keepalive(&self, lease: i64) -> Result<bool, CallError> {
        let body = self
            .post("/v3/lease/keepalive", &json!({"ID": lease.to_string()}))
            .await?;
        Ok(int(&body["result"]["TTL"]).unwrap_or(0) > 0)
    }

    /// Revokes `lease` (deleting its lock key); `lease_expired` if etcd no longer has it.
    pub async fn revoke(&self, lease: i64) -> Result<(), CallError> {
        match self
            .post("/v3/lease/revoke", &json!({"ID": lease.to_string()}))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.error, Error::Api { status: 404, .. }) => Err(CallError {
                error: Error::LeaseExpired,
                earlier_unanswered: e.earlier_unanswered,
            }),
            Err(e) => Err(e),
        }
    }

    /// Creates the lock key of `lease` if absent; its create revision either way.
    async fn enqueue(&self, lock: &str, holder: &str, lease: i64) -> Result<u64, CallError> {
        let key = b64(&format!("{PREFIX}{lock}/{lease:x}"));
        let txn = json!({
            "compare": [{"target": "CREATE", "key": key, "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": b64(holder), "lease": lease.to_string()}}],
            "failure": [{"request_range": {"key": key}}],
        });
        let body = self.post("/v3/kv/txn", &txn).await?;
        let revision = if body["succeeded"].as_bool() == Some(true) {
            int(&body["header"]["revision"])
        } else {
            int(&body["responses"][0]["response_range"]["kvs"][0]["create_revision"])
        };
        revision
            .and_then(|r| u64::try_from(r).ok())
            .ok_or_else(|| decode("lock key transaction", &body))
    }

    /// The first key in line for `lock`: (create revision, holder name).
    pub async fn owner(&self, lock: &str) -> Result<Option<(u64, String)>, CallError> {
        let prefix = format!("{PREFIX}{lock}/");
        let query = json!({
            "key": b64(&prefix),
            "range_end": prefix_end(&prefix),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": 1,
        });
        let body = self.post("/v3/kv/range", &query).await?;
        let Some(kv) = body["kvs"].get(0) else {
            return Ok(None);
        };
        let revision = int(&kv["create_revision"])
            .and_then(|r| u64::try_from(r).ok())
            .ok_or_else(|| decode("lock range", &body))?;
        let holder = kv["value"]
            .as_str()
            .and_then(|v| STANDARD.decode(v).ok())
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        Ok(Some((revision, holder)))
    }

    /// Acquires `lock` for `holder`, waiting in line up to `wait`.
    pub async fn acquire(
        &self,
        lock: &str,
        holder: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<EtcdHeld, CallError> {
        let ttl_secs = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let lease = self.grant(ttl_secs).await?;
        let keeper = tokio::spawn(keep_alive(self.clone(), lease, ttl / 3));
        match self.wait_first(lock, holder, lease, wait).await {
            Ok(revision) => Ok(EtcdHeld {
                lease,
                revision,
                keeper,
            }),
            Err(e) => {
                keeper.abort();
                // Best effort: an unrevoked lease expires after its TTL anyway.
                let _ = self.revoke(lease).await;
                Err(e)
            }
        }
    }

    async fn wait_first(
        &self,
        lock: &str,
        holder: &str,
        lease: i64,
        wait: Duration,
    ) -> Result<u64, CallError> {
        let deadline = Instant::now() + wait;
        let mine = self.enqueue(lock, holder, lease).await?;
        loop {
            match self.owner(lock).await? {
                Some((first, _)) if first == mine => return Ok(mine),
                // Our key is gone: the lease expired while we waited.
                Some((first, _)) if first > mine => {
                    return Err(CallError::from(Error::LeaseExpired))
                }
                None => return Err(CallError::from(Error::LeaseExpired)),
                Some((_, owner)) if Instant::now() >= deadline => {
                    return Err(CallError::from(Error::LockHeld {
                        holder: Some(owner),
                        retry_after_ms: 0,
                    }))
                }
                Some(_) => tokio::time::sleep(POLL).await,
            }
        }
    }
}

fn decode(what: &str, body: &Value) -> CallError {
    CallError::from(Error::Decode(format!(
        "etcd {what}: unexpected answer {body}"
    )))
}

/// Renews `lease` every `every` until etcd says it is gone (or the task is aborted).
async fn keep_alive(etcd: EtcdGateway, lease: i64, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Ok(false) = etcd.keepalive(lease).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_and_tokens() {
        assert_eq!(STANDARD.decode(prefix_end("/a/")).unwrap(), b"/a0");
        let token = revision_token("set", "w1", 42);
        let payload = token.split('.').nth(1).unwrap();
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        assert_eq!(claims["e"], 42);
        assert_eq!(int(&json!("7")), Some(7));
        assert_eq!(int(&json!(8)), Some(8));
    }
}

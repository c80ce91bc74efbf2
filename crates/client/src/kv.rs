//! The store's read side: [`Kv`], a token-free handle on one namespace.
//!
//! Reads are not fenced: a stale holder may read, it just cannot write. Writes live in
//! [`crate::FencedKv`], which cannot be built without a token.

use std::sync::Arc;

use reqwest::header::{HeaderMap, ETAG};
use reqwest::Method;

use crate::failover::Retry;

use crate::paths::{key_path, segment};
use crate::{Client, Entry, Error};

/// The largest page the server returns for a listing; [`Kv::list`] asks for all of it.
pub const LIST_LIMIT: u32 = 10_000;

use palisade_api::headers::FENCING_EPOCH;
use palisade_api::wire::KeyList;

/// Read access to one namespace. Reads are not fenced: they need no token.
#[derive(Debug, Clone)]
pub struct Kv {
    pub(crate) client: Client,
    lock: Arc<str>,
}

impl Kv {
    pub(crate) fn new(client: Client, lock: &str) -> Kv {
        Kv {
            client,
            lock: lock.into(),
        }
    }

    /// The namespace (lock name) this handle reads.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The path of `key` (after the base URL).
    pub(crate) fn key_path(&self, key: &str) -> Result<String, Error> {
        let lock = segment("lock name", &self.lock)?;
        Ok(format!("/v1/kv/{lock}/{}", key_path(key)?))
    }

    /// The value of `key` with its revision and the epoch that wrote it; `None` if absent.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, Error> {
        let path = self.key_path(key)?;
        let call = self.client.call(Retry::Safe, Method::GET, &path, |r| r);
        let resp = match call.await {
            Ok(resp) => resp,
            Err(Error::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let revision = header_u64(resp.headers(), ETAG.as_str())?;
        let epoch = header_u64(resp.headers(), FENCING_EPOCH)?;
        let value = resp.bytes().await?;
        Ok(Some(Entry {
            value,
            revision,
            epoch,
        }))
    }

    /// Keys starting with `prefix`, in key order, at most [`LIST_LIMIT`] of them.
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let path = format!("/v1/kv/{}", segment("lock name", &self.lock)?);
        let call = self.client.call(Retry::Safe, Method::GET, &path, |r| {
            let r = r.query(&[("limit", LIST_LIMIT)]);
            if prefix.is_empty() {
                r
            } else {
                r.query(&[("prefix", prefix)])
            }
        });
        let body: KeyList = Client::json(call.await?).await?;
        Ok(body.keys)
    }
}

/// Reads `name` as a u64, accepting the quoted (and weak) `ETag` forms: `"7"`, `W/"7"`.
fn header_u64(headers: &HeaderMap, name: &str) -> Result<u64, Error> {
    let raw = headers
        .get(name)
        .ok_or_else(|| Error::Decode(format!("response lacks the {name} header")))?;
    let text = raw
        .to_str()
        .map_err(|_| Error::Decode(format!("{name} header is not ASCII")))?;
    let unquoted = text.trim().trim_start_matches("W/").trim_matches('"');
    unquoted
        .parse()
        .map_err(|_| Error::Decode(format!("{name} header {text:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn etag_forms_parse() {
        assert_eq!(header_u64(&headers("etag", "\"7\""), "etag").unwrap(), 7);
        assert_eq!(header_u64(&headers("etag", "W/\"8\""), "etag").unwrap(), 8);
        assert_eq!(
            header_u64(&headers("fencing-epoch", "3"), "fencing-epoch").unwrap(),
            3
        );
    }

    #[test]
    fn bad_or_missing_headers_are_decode_errors() {
        assert!(matches!(
            header_u64(&HeaderMap::new(), "etag"),
            Err(Error::Decode(_))
        ));
        assert!(matches!(
            header_u64(&headers("etag", "\"x\""), "etag"),
            Err(Error::Decode(_))
        ));
    }
}

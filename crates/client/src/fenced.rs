//! The store's write side: [`FencedKv`], a namespace handle that carries one token.
//!
//! There is deliberately no unfenced write handle: the only way to build a writer is to
//! give it a token, and every mutation it sends carries that token in `Fencing-Token`.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, IF_MATCH, IF_NONE_MATCH};
use reqwest::{Method, Response};

use crate::failover::Retry;
use crate::paths::segment;
use crate::{Client, Entry, Error, Kv, WriteOptions, WriteResult};

use palisade_api::headers::{FENCING_SEQ, FENCING_TOKEN, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use palisade_api::wire::{FenceAnswer, WriteAnswer};

/// Read and fenced-write access to one namespace with one token.
///
/// Cloning is cheap. The token is sent as-is: this handle does not know whether its
/// epoch is still current, only the server's answer ([`Error::Stale`]) says so.
#[derive(Debug, Clone)]
pub struct FencedKv {
    reader: Kv,
    token: Arc<str>,
}

impl FencedKv {
    pub(crate) fn new(client: Client, lock: &str, token: &str) -> FencedKv {
        FencedKv {
            reader: Kv::new(client, lock),
            token: token.into(),
        }
    }

    /// The namespace (lock name) this handle writes.
    pub fn lock(&self) -> &str {
        self.reader.lock()
    }

    /// The token attached to every mutation.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Writes `value` under `key`, fenced by this handle's token.
    pub async fn put(&self, key: &str, value: impl Into<Bytes>) -> Result<WriteResult, Error> {
        self.put_with(key, value, &WriteOptions::default()).await
    }

    /// [`FencedKv::put`] with preconditions, an idempotency key or a sequence number.
    pub async fn put_with(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        opts: &WriteOptions,
    ) -> Result<WriteResult, Error> {
        let mut headers = self.mutation(opts)?;
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let value = value.into();
        let path = self.reader.key_path(key)?;
        let call = self
            .client()
            .call(retry_of(&headers), Method::PUT, &path, |r| {
                r.headers(headers.clone()).body(value.clone())
            });
        write_result(call.await?).await
    }

    /// Deletes `key`, fenced like a put. [`Error::NotFound`] if it is absent.
    pub async fn delete(&self, key: &str) -> Result<WriteResult, Error> {
        self.delete_with(key, &WriteOptions::default()).await
    }

    /// [`FencedKv::delete`] with preconditions, an idempotency key or a sequence number.
    pub async fn delete_with(&self, key: &str, opts: &WriteOptions) -> Result<WriteResult, Error> {
        let headers = self.mutation(opts)?;
        let path = self.reader.key_path(key)?;
        let call = self
            .client()
            .call(retry_of(&headers), Method::DELETE, &path, |r| {
                r.headers(headers.clone())
            });
        write_result(call.await?).await
    }

    /// Barrier: makes the namespace admit this token's epoch without writing data, so
    /// every older holder is fenced off from now on. Returns the new high-water mark.
    ///
    /// This is the coordination step a new holder takes when older in-flight writes must
    /// be refused *before* it starts work (S10): acquiring alone notifies no resource.
    pub async fn fence(&self) -> Result<u64, Error> {
        self.fence_with(None).await
    }

    /// [`FencedKv::fence`] carrying `Fencing-Seq`, for `sequence` namespaces.
    pub async fn fence_with(&self, seq: Option<u64>) -> Result<u64, Error> {
        let path = format!("/v1/fences/{}", segment("lock name", self.lock())?);
        let opts = WriteOptions {
            seq,
            ..WriteOptions::default()
        };
        let headers = self.mutation(&opts)?;
        let call = self
            .client()
            .call(retry_of(&headers), Method::POST, &path, |r| {
                r.headers(headers.clone())
            });
        let body: FenceAnswer = Client::json(call.await?).await?;
        Ok(body.high_water)
    }

    /// Reads `key` (unfenced, like [`Kv::get`]).
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, Error> {
        self.reader.get(key).await
    }

    /// Lists keys (unfenced, like [`Kv::list`]).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        self.reader.list(prefix).await
    }

    fn client(&self) -> &Client {
        &self.reader.client
    }

    /// The headers of a mutation: the token and every header `opts` asks for, plus a
    /// fresh idempotency key when the client fails over between endpoints and `opts` has
    /// none (so that resending it to another node cannot apply it twice). Header values
    /// are validated here so a malformed token fails locally and visibly, not as a
    /// transport error.
    fn mutation(&self, opts: &WriteOptions) -> Result<HeaderMap, Error> {
        let mut headers = HeaderMap::new();
        let token = HeaderValue::from_str(&self.token).map_err(|_| {
            Error::InvalidToken("token contains characters not allowed in an HTTP header".into())
        })?;
        headers.insert(FENCING_TOKEN, token);
        if let Some(seq) = opts.seq {
            headers.insert(FENCING_SEQ, HeaderValue::from(seq));
        }
        let fresh = (opts.idempotency_key.is_none() && self.client().fails_over())
            .then(new_idempotency_key);
        if let Some(key) = opts.idempotency_key.as_ref().or(fresh.as_ref()) {
            let value = HeaderValue::from_str(key)
                .map_err(|_| Error::BadRequest("idempotency key must be visible ASCII".into()))?;
            headers.insert(IDEMPOTENCY_KEY, value);
        }
        if let Some(rev) = opts.if_match {
            let value = HeaderValue::from_str(&format!("\"{rev}\""))
                .map_err(|_| Error::BadRequest("unrepresentable If-Match".into()))?;
            headers.insert(IF_MATCH, value);
        }
        if opts.if_absent {
            headers.insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
        }
        Ok(headers)
    }
}

/// A write with an idempotency key is safe to resend; without one, only when it surely
/// reached no node.
fn retry_of(headers: &HeaderMap) -> Retry {
    if headers.contains_key(IDEMPOTENCY_KEY) {
        Retry::Safe
    } else {
        Retry::OnlyUnreachable
    }
}

/// A fresh key for one logical write: 128 random bits.
fn new_idempotency_key() -> String {
    let bits: u128 = rand::random();
    format!("rs-{bits:032x}")
}

async fn write_result(resp: Response) -> Result<WriteResult, Error> {
    let replayed = resp
        .headers()
        .get(IDEMPOTENT_REPLAYED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let body: WriteAnswer = Client::json(resp).await?;
    Ok(WriteResult {
        revision: body.revision,
        epoch: body.epoch,
        replayed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(url: &str, token: &str) -> FencedKv {
        Client::new(url).unwrap().fenced_kv("orders", token)
    }

    #[test]
    fn mutation_carries_token_and_options() {
        let kv = handle("http://127.0.0.1:1", "pal1.abc.def");
        let opts = WriteOptions {
            if_match: Some(5),
            if_absent: true,
            idempotency_key: Some("op-1".into()),
            seq: Some(9),
        };
        assert_eq!(
            kv.reader.key_path("a/b c").unwrap(),
            "/v1/kv/orders/a/b%20c"
        );
        let h = kv.mutation(&opts).unwrap();
        assert_eq!(h["fencing-token"], "pal1.abc.def");
        assert_eq!(h["fencing-seq"], "9");
        assert_eq!(h["idempotency-key"], "op-1");
        assert_eq!(h["if-match"], "\"5\"");
        assert_eq!(h["if-none-match"], "*");
        assert_eq!(retry_of(&h), Retry::Safe);
    }

    #[test]
    fn plain_mutation_sends_only_the_token() {
        let h = handle("http://127.0.0.1:1", "t")
            .mutation(&WriteOptions::default())
            .unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(retry_of(&h), Retry::OnlyUnreachable);
    }

    #[test]
    fn with_several_endpoints_every_write_gets_its_own_idempotency_key() {
        let client = Client::builder("http://127.0.0.1:1")
            .endpoint("http://127.0.0.1:2")
            .build()
            .unwrap();
        let kv = client.fenced_kv("orders", "t");
        let a = kv.mutation(&WriteOptions::default()).unwrap();
        let b = kv.mutation(&WriteOptions::default()).unwrap();
        assert_ne!(a["idempotency-key"], b["idempotency-key"]);
        assert_eq!(retry_of(&a), Retry::Safe);
        // The caller's own key wins.
        let own = WriteOptions {
            idempotency_key: Some("mine".into()),
            ..WriteOptions::default()
        };
        assert_eq!(kv.mutation(&own).unwrap()["idempotency-key"], "mine");
    }

    #[test]
    fn unsendable_token_fails_locally() {
        let err = handle("http://127.0.0.1:1", "line\nbreak")
            .mutation(&WriteOptions::default())
            .unwrap_err();
        assert_eq!(err.code(), "invalid_token");
    }
}

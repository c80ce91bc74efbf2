//! The store's write side: [`FencedKv`], a namespace handle that carries one token.
//!
//! There is deliberately no unfenced write handle: the only way to build a writer is to
//! give it a token, and every mutation it sends carries that token in `Fencing-Token`.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, IF_MATCH, IF_NONE_MATCH};
use reqwest::{Method, RequestBuilder, Response};
use serde::Deserialize;

use crate::paths::segment;
use crate::{Client, Entry, Error, Kv, WriteOptions, WriteResult};

use palisade_api::headers::{FENCING_SEQ, FENCING_TOKEN, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

#[derive(Deserialize)]
struct MutationBody {
    revision: u64,
    epoch: u64,
}

#[derive(Deserialize)]
struct FenceBody {
    high_water: u64,
}

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
        let req = self
            .mutation(Method::PUT, self.reader.key_url(key)?, opts)?
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(value.into());
        write_result(Client::send(req).await?).await
    }

    /// Deletes `key`, fenced like a put. [`Error::NotFound`] if it is absent.
    pub async fn delete(&self, key: &str) -> Result<WriteResult, Error> {
        self.delete_with(key, &WriteOptions::default()).await
    }

    /// [`FencedKv::delete`] with preconditions, an idempotency key or a sequence number.
    pub async fn delete_with(&self, key: &str, opts: &WriteOptions) -> Result<WriteResult, Error> {
        let req = self.mutation(Method::DELETE, self.reader.key_url(key)?, opts)?;
        write_result(Client::send(req).await?).await
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
        let url = self.reader.client.url(&format!(
            "/v1/fences/{}",
            segment("lock name", self.lock())?
        ));
        let opts = WriteOptions {
            seq,
            ..WriteOptions::default()
        };
        let req = self.mutation(Method::POST, url, &opts)?;
        let body: FenceBody = Client::json(Client::send(req).await?).await?;
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

    /// A request carrying the token and every header `opts` asks for. Header values are
    /// validated here so a malformed token fails locally and visibly, not as a transport
    /// error.
    fn mutation(
        &self,
        method: Method,
        url: String,
        opts: &WriteOptions,
    ) -> Result<RequestBuilder, Error> {
        let mut headers = HeaderMap::new();
        let token = HeaderValue::from_str(&self.token).map_err(|_| {
            Error::InvalidToken("token contains characters not allowed in an HTTP header".into())
        })?;
        headers.insert(FENCING_TOKEN, token);
        if let Some(seq) = opts.seq {
            headers.insert(FENCING_SEQ, HeaderValue::from(seq));
        }
        if let Some(key) = &opts.idempotency_key {
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
        Ok(self
            .reader
            .client
            .http
            .request(method, url)
            .headers(headers))
    }
}

async fn write_result(resp: Response) -> Result<WriteResult, Error> {
    let replayed = resp
        .headers()
        .get(IDEMPOTENT_REPLAYED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let body: MutationBody = Client::json(resp).await?;
    Ok(WriteResult {
        revision: body.revision,
        epoch: body.epoch,
        replayed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(token: &str) -> FencedKv {
        Client::new("http://127.0.0.1:1")
            .unwrap()
            .fenced_kv("orders", token)
    }

    #[test]
    fn mutation_carries_token_and_options() {
        let kv = handle("pal1.abc.def");
        let opts = WriteOptions {
            if_match: Some(5),
            if_absent: true,
            idempotency_key: Some("op-1".into()),
            seq: Some(9),
        };
        let url = kv.reader.key_url("a/b c").unwrap();
        let req = kv
            .mutation(Method::PUT, url, &opts)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(
            req.url().as_str(),
            "http://127.0.0.1:1/v1/kv/orders/a/b%20c"
        );
        let h = req.headers();
        assert_eq!(h["fencing-token"], "pal1.abc.def");
        assert_eq!(h["fencing-seq"], "9");
        assert_eq!(h["idempotency-key"], "op-1");
        assert_eq!(h["if-match"], "\"5\"");
        assert_eq!(h["if-none-match"], "*");
    }

    #[test]
    fn plain_mutation_sends_only_the_token() {
        let kv = handle("t");
        let url = kv.reader.key_url("k").unwrap();
        let req = kv
            .mutation(Method::DELETE, url, &WriteOptions::default())
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(req.headers().len(), 1);
    }

    #[test]
    fn unsendable_token_fails_locally() {
        let kv = handle("line\nbreak");
        let url = kv.reader.key_url("k").unwrap();
        let err = kv
            .mutation(Method::PUT, url, &WriteOptions::default())
            .unwrap_err();
        assert_eq!(err.code(), "invalid_token");
    }
}

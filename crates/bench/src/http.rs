//! A lean HTTP/1.1 client connection: one TCP connection, one request at a time.
//!
//! Why not a pooled client (reqwest): each bench client must own exactly one persistent
//! connection, and on a 2-core machine shared with the server every microsecond the load
//! generator spends is taken from the server. A bare hyper connection does no pooling,
//! no redirects, no header maps beyond what we send. A connection that fails is dropped
//! and the next request opens a new one.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use palisade_api::wire::ErrorEnvelope;

use crate::OpError;

/// One connection to a server at `http://host:port`.
pub struct Conn {
    authority: String,
    host: HeaderValue,
    /// `Bearer <key>`, sent with every request, for a server with an auth file.
    authorization: Option<HeaderValue>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// A response: status and whole body.
pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

impl Response {
    /// The API's error code (`{"error":{"code":...}}`), or `http_<status>`.
    pub fn error(&self) -> OpError {
        match serde_json::from_slice::<ErrorEnvelope>(&self.body) {
            Ok(e) => OpError::new(e.error.code),
            Err(_) => OpError::new(format!("http_{}", self.status)),
        }
    }

    /// Decodes a 200 answer as JSON; any other status is an error by its code.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, OpError> {
        if self.status != 200 {
            return Err(self.error());
        }
        serde_json::from_slice(&self.body).map_err(|_| OpError::new("bad_answer"))
    }
}

impl Conn {
    /// A connection to `base` (`http://host:port`, no path), opened and checked now,
    /// sending `key` as a bearer key with every request when given.
    pub async fn open(base: &str, key: Option<&str>) -> Result<Conn, OpError> {
        let authority = base
            .strip_prefix("http://")
            .ok_or_else(|| OpError::new("url must start with http://"))?
            .trim_end_matches('/')
            .to_owned();
        let host = HeaderValue::from_str(&authority).map_err(|_| OpError::new("bad url"))?;
        let authorization = key
            .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
            .transpose()
            .map_err(|_| OpError::new("bad key"))?;
        let mut conn = Conn {
            authority,
            host,
            authorization,
            sender: None,
        };
        conn.connect().await?;
        Ok(conn)
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, OpError> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|_| OpError::new("connect"))?;
        // Requests are small and answered one at a time: never wait to coalesce them.
        stream
            .set_nodelay(true)
            .map_err(|_| OpError::new("connect"))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|_| OpError::new("connect"))?;
        // The connection task ends when the sender is dropped or the peer closes.
        tokio::spawn(connection);
        Ok(self.sender.insert(sender))
    }

    /// Sends one request and reads the whole answer. `headers` are extra (name, value)s.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&'static str, &HeaderValue)],
        body: Bytes,
    ) -> Result<Response, OpError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        if let Some(authorization) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization.clone());
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|_| OpError::new("bad_request_built"))?;
        let sender = match self.sender.as_mut() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let result = async {
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>(Response { status, body })
        }
        .await;
        result.map_err(|e| {
            self.sender = None;
            OpError::new(if e.is_timeout() { "timeout" } else { "io" })
        })
    }

    /// POST with a JSON body.
    pub async fn post_json(&mut self, path: &str, body: Bytes) -> Result<Response, OpError> {
        static JSON: HeaderValue = HeaderValue::from_static("application/json");
        self.send(Method::POST, path, &[("content-type", &JSON)], body)
            .await
    }
}

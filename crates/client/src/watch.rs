//! [`Client::watch`]: a lock's events (`GET /v1/locks/{lock}/events`) as a typed stream.
//!
//! The stream reconnects by itself when the connection drops or goes quiet (the server
//! sends a keep-alive comment every 15 s; nothing for [`IDLE_LIMIT`] counts as a dead
//! connection), sending the id of the last event it delivered as `Last-Event-ID`, so
//! nothing is skipped while the server still holds it. When the server no longer holds
//! it (or the server restarted) the stream yields [`LockEvent::Reset`] first: whatever
//! the caller derived from earlier events should be read again.
//!
//! Errors are yielded, not fatal: a transport failure, a 429 (too many streams) or a 503
//! is yielded as `Err` and the stream tries again after a pause. A refusal that will not
//! change by retrying (401, 403, 400, 404) is yielded and ends the stream.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::Stream;
use serde::Deserialize;

use reqwest::Method;

use palisade_api::wire::{Event, EventBody};
use palisade_api::ErrorCode;

use crate::client::Client;
use crate::failover::Retry;
use crate::paths::segment;
use crate::Error;

/// A stream that receives nothing, not even a keep-alive comment, for this long is
/// treated as dead and reconnected.
pub const IDLE_LIMIT: Duration = Duration::from_secs(45);

/// Longest pause between reconnection attempts.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// One event of a lock, as docs/api.md ("Events") describes it. Event types this version
/// does not know are skipped.
///
/// It is read as the contract's [`Event`] and laid out here with the id and time in each
/// variant.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "Event")]
pub enum LockEvent {
    /// A lease was granted.
    Granted {
        id: u64,
        at_ms: u64,
        lock: String,
        epoch: u64,
        holder: String,
        ttl_ms: u64,
    },
    /// A lease ended by release (`cause` `"release"`), or, over etcd, through another
    /// node by a release or an expiry the server cannot tell apart (`"unknown"`).
    Released {
        id: u64,
        at_ms: u64,
        lock: String,
        epoch: u64,
        holder: String,
        cause: String,
    },
    /// A lease ran out without renewal.
    Expired {
        id: u64,
        at_ms: u64,
        lock: String,
        epoch: u64,
        holder: String,
    },
    /// The namespace's high-water mark advanced.
    Fenced {
        id: u64,
        at_ms: u64,
        lock: String,
        high_water: u64,
        seq: u64,
    },
    /// A mutation of the namespace was refused with `code`.
    Rejected {
        id: u64,
        at_ms: u64,
        lock: String,
        code: String,
        epoch: Option<u64>,
        high_water: Option<u64>,
    },
    /// A gate in another resource (`resource`: `postgres`, `redis`, ...) refused a write
    /// to the lock's data with `code`, as the gate reported to the server.
    GateRefused {
        id: u64,
        at_ms: u64,
        lock: String,
        resource: String,
        code: String,
        epoch: Option<u64>,
        high_water: Option<u64>,
    },
    /// Events may have been missed: read the lock's state again.
    Reset { id: u64, at_ms: u64, reason: String },
}

impl LockEvent {
    /// The event's id (increasing).
    pub fn id(&self) -> u64 {
        match self {
            LockEvent::Granted { id, .. }
            | LockEvent::Released { id, .. }
            | LockEvent::Expired { id, .. }
            | LockEvent::Fenced { id, .. }
            | LockEvent::Rejected { id, .. }
            | LockEvent::GateRefused { id, .. }
            | LockEvent::Reset { id, .. } => *id,
        }
    }
}

impl From<Event> for LockEvent {
    fn from(Event { id, at_ms, body }: Event) -> LockEvent {
        match body {
            EventBody::Granted {
                lock,
                epoch,
                holder,
                ttl_ms,
            } => LockEvent::Granted {
                id,
                at_ms,
                lock,
                epoch,
                holder,
                ttl_ms,
            },
            EventBody::Released {
                lock,
                epoch,
                holder,
                cause,
            } => LockEvent::Released {
                id,
                at_ms,
                lock,
                epoch,
                holder,
                cause: cause.into_owned(),
            },
            EventBody::Expired {
                lock,
                epoch,
                holder,
            } => LockEvent::Expired {
                id,
                at_ms,
                lock,
                epoch,
                holder,
            },
            EventBody::Fenced {
                lock,
                high_water,
                seq,
            } => LockEvent::Fenced {
                id,
                at_ms,
                lock,
                high_water,
                seq,
            },
            EventBody::Rejected {
                lock,
                code,
                epoch,
                high_water,
            } => LockEvent::Rejected {
                id,
                at_ms,
                lock,
                code: code.into_owned(),
                epoch,
                high_water,
            },
            EventBody::GateRefused {
                lock,
                resource,
                code,
                epoch,
                high_water,
            } => LockEvent::GateRefused {
                id,
                at_ms,
                lock,
                resource: resource.into_owned(),
                code: code.into_owned(),
                epoch,
                high_water,
            },
            EventBody::Reset { reason } => LockEvent::Reset {
                id,
                at_ms,
                reason: reason.into_owned(),
            },
        }
    }
}

/// Longest line (and longest event's data) kept: far above anything the server sends. A
/// longer line is dropped whole, not accumulated.
const MAX_LINE: usize = 1 << 20;

/// Splits an SSE byte stream into events' `data` (and `id`), ignoring comments.
#[derive(Default)]
struct Parser {
    buf: BytesMut,
    data: String,
    id: Option<String>,
    /// Inside a line longer than [`MAX_LINE`]: drop bytes up to its end.
    skipping: bool,
}

impl Parser {
    /// Feeds bytes; returns the complete events' (id, data) in order.
    fn feed(&mut self, bytes: &[u8]) -> Vec<(Option<String>, String)> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
            let line = self.buf.split_to(end + 1);
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    out.push((self.id.take(), std::mem::take(&mut self.data)));
                }
                self.id = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" if self.data.len() + value.len() >= MAX_LINE => {
                    // An event this large is not the server's: drop it.
                    self.data.clear();
                }
                "data" => {
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                }
                "id" => self.id = Some(value.to_owned()),
                _ => {}
            }
        }
        // A line longer than any event the server sends: drop it rather than grow.
        if self.buf.len() > MAX_LINE {
            self.buf.advance(self.buf.len());
            self.skipping = true;
        }
        out
    }
}

pub(crate) struct Watch {
    client: Client,
    path: String,
    last_id: Option<u64>,
    response: Option<reqwest::Response>,
    parser: Parser,
    ready: VecDeque<LockEvent>,
    pause: Duration,
    ended: bool,
}

/// Whether a failure to open a stream is worth another try later: the network, too many
/// streams, a node shutting down or without its storage. Anything else (401, 403, 400,
/// 404 from a server without events) will not change by retrying.
pub(crate) fn worth_retrying(e: &Error) -> bool {
    matches!(
        e,
        Error::Transport(_) | Error::QuotaExceeded { .. } | Error::StorageFailed
    ) || e.code() == ErrorCode::Unavailable.as_str()
}

impl Watch {
    /// A watch of `lock`'s events after `last_id` (none: from the connection on); not
    /// connected yet.
    pub(crate) fn new(client: &Client, lock: &str, last_id: Option<u64>) -> Result<Watch, Error> {
        let path = format!("/v1/locks/{}/events", segment("lock name", lock)?);
        Ok(Watch {
            client: client.clone(),
            path,
            last_id,
            response: None,
            parser: Parser::default(),
            ready: VecDeque::new(),
            pause: Duration::from_millis(100),
            ended: false,
        })
    }

    /// Opens a connection (resuming after the last event delivered, if any). Once this
    /// returns `Ok`, every later event reaches this watch, or a `reset` says some did not.
    pub(crate) async fn connect(&mut self) -> Result<(), Error> {
        let last_id = self.last_id;
        let response = self
            .client
            .call(Retry::Safe, Method::GET, &self.path, |req| {
                // The stream has no end; `IDLE_LIMIT` is what bounds a dead one.
                let req = req.timeout(Duration::from_secs(365 * 24 * 3600));
                match last_id {
                    Some(id) => req.header(palisade_api::headers::LAST_EVENT_ID, id.to_string()),
                    None => req,
                }
            })
            .await?;
        self.parser = Parser::default();
        self.ready.clear();
        self.response = Some(response);
        Ok(())
    }

    /// Whether a connection is open (it may still turn out to be dead).
    pub(crate) fn is_connected(&self) -> bool {
        self.response.is_some() || !self.ready.is_empty()
    }

    /// The next event on the open connection, without reconnecting: `None` once the
    /// connection has ended (closed, broken, or silent for [`IDLE_LIMIT`]) or if none is
    /// open. Cancel-safe: an event is either returned or kept for the next call.
    pub(crate) async fn next_on_connection(&mut self) -> Option<Result<LockEvent, Error>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                self.last_id = Some(event.id());
                return Some(Ok(event));
            }
            let response = self.response.as_mut()?;
            match tokio::time::timeout(IDLE_LIMIT, response.chunk()).await {
                Ok(Ok(Some(bytes))) => {
                    self.pause = Duration::from_millis(100);
                    for (_, data) in self.parser.feed(&bytes) {
                        // Types this version does not know are skipped.
                        if let Ok(event) = serde_json::from_str::<LockEvent>(&data) {
                            self.ready.push_back(event);
                        }
                    }
                }
                // The server closed the stream (shutting down) or it went quiet.
                Ok(Ok(None)) | Err(_) => {
                    self.response = None;
                    return None;
                }
                Ok(Err(e)) => {
                    self.response = None;
                    return Some(Err(e.into()));
                }
            }
        }
    }

    async fn next(&mut self) -> Option<Result<LockEvent, Error>> {
        loop {
            if self.ended {
                return None;
            }
            if !self.is_connected() {
                match self.connect().await {
                    Ok(()) => continue,
                    Err(e) => {
                        if !worth_retrying(&e) {
                            self.ended = true;
                            return Some(Err(e));
                        }
                        tokio::time::sleep(self.pause).await;
                        self.pause = (self.pause * 2).min(MAX_PAUSE);
                        return Some(Err(e));
                    }
                }
            }
            match self.next_on_connection().await {
                Some(item) => return Some(item),
                // Reconnect, resuming after the last event delivered.
                None => continue,
            }
        }
    }
}

impl Client {
    /// The events of `lock`, from now on, reconnecting and resuming by itself. See the
    /// [module docs](crate::watch).
    pub fn watch(&self, lock: &str) -> Result<impl Stream<Item = Result<LockEvent, Error>>, Error> {
        self.watch_from(lock, None)
    }

    /// Like [`Client::watch`], resuming after event `last_id` (as a reconnecting client
    /// would): the events the server still holds after it come first, or a
    /// [`LockEvent::Reset`] when it no longer holds them.
    pub fn watch_from(
        &self,
        lock: &str,
        last_id: Option<u64>,
    ) -> Result<impl Stream<Item = Result<LockEvent, Error>>, Error> {
        let watch = Watch::new(self, lock, last_id)?;
        Ok(futures::stream::unfold(watch, |mut watch| async move {
            let item = watch.next().await?;
            Some((item, watch))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_anywhere_and_skips_comments() {
        let text = ": keep-alive\n\nevent: granted\nid: 7\ndata: {\"id\":7,\"at_ms\":1,\"type\":\"granted\",\"lock\":\"a\",\"epoch\":1,\"holder\":\"h\",\"ttl_ms\":50}\n\nevent: reset\r\nid: 9\r\ndata: {\"id\":9,\"at_ms\":2,\"type\":\"reset\",\"reason\":\"lagged\"}\r\n\r\n";
        let mut parser = Parser::default();
        let mut got = Vec::new();
        for chunk in text.as_bytes().chunks(5) {
            got.extend(parser.feed(chunk));
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.as_deref(), Some("7"));
        let first: LockEvent = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(
            first,
            LockEvent::Granted {
                id: 7,
                at_ms: 1,
                lock: "a".into(),
                epoch: 1,
                holder: "h".into(),
                ttl_ms: 50
            }
        );
        let second: LockEvent = serde_json::from_str(&got[1].1).unwrap();
        assert_eq!(second.id(), 9);
        assert!(matches!(second, LockEvent::Reset { .. }));
    }

    #[test]
    fn a_line_longer_than_the_bound_is_dropped_whole() {
        let mut parser = Parser::default();
        assert!(parser.feed(b"data: {\"x\":\"").is_empty());
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..40 {
            assert!(parser.feed(&chunk).is_empty());
            assert!(parser.buf.len() <= MAX_LINE + chunk.len());
        }
        // The long line's tail and its end are dropped with it; the next event is whole.
        let got = parser.feed(b"aaaa\"}\n\nid: 3\ndata: {\"ok\":1}\n\n");
        assert_eq!(got, vec![(Some("3".to_owned()), "{\"ok\":1}".to_owned())]);
    }
}

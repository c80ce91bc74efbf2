//! The connection's byte stream as hyper sees it: marks the phases of
//! [`ConnSlot`](super::registry::ConnSlot), and gives hyper's own error answers the JSON
//! body every other error has.
//!
//! ## Why answers are rewritten here
//! When a request head cannot be parsed (bad request line, invalid header, head larger
//! than the limit), hyper 1 answers by itself, before and without the router: it writes a
//! bare `400`, `414` or `431` with an empty body (`Server::on_error` in its `role.rs`)
//! and closes the connection. hyper has no hook to shape that answer, so this wrapper
//! recognises it on the way out and writes the JSON error in its place.
//!
//! Recognising it needs no parsing of the outgoing stream. hyper writes unprompted only
//! in that one case: everything else it writes is a response (or `100 Continue`) to a
//! request the router was given. The wrapper knows how many requests the router was
//! given (`started`) and how many responses were completely written (`flushed`, from
//! `finished` as it stood when hyper last flushed: hyper writes out its whole buffer
//! before flushing the transport, and a response's body is dropped only after the body
//! is in that buffer). A write that begins `HTTP/1.` while `started == flushed` is
//! therefore hyper's own answer. Were hyper ever to write a router's response and its
//! own answer in one write, its answer would pass through bare (never altered or lost);
//! it flushes a response before it parses the next head, which the test sending a good
//! and a malformed request in one packet checks (crates/cli/tests/malformed_requests.rs).

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use palisade_api::wire::ErrorEnvelope;
use palisade_api::ErrorCode;

use super::registry::{Clock, ConnSlot};
use super::Limits;

/// A stream with phase marks and the answer rewrite.
pub(crate) struct TrackedIo<S> {
    inner: S,
    slot: Arc<ConnSlot>,
    clock: Clock,
    limits: Arc<Limits>,
    /// Set once hyper's own error answer was seen: our answer, and how much of it is out.
    replacement: Option<(Vec<u8>, usize)>,
}

impl<S> TrackedIo<S> {
    pub(crate) fn new(inner: S, slot: Arc<ConnSlot>, clock: Clock, limits: Arc<Limits>) -> Self {
        TrackedIo {
            inner,
            slot,
            clock,
            limits,
            replacement: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> TrackedIo<S> {
    /// Writes what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some((bytes, written)) = &mut self.replacement else {
            return Poll::Ready(Ok(()));
        };
        while *written < bytes.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// If `first` is the start of hyper's own error answer, prepares ours instead.
    fn intercept(&mut self, first: &[u8]) -> bool {
        if self.replacement.is_some() {
            return true;
        }
        let unprompted = self.slot.started.load(Relaxed) == self.slot.flushed.load(Relaxed);
        if !unprompted || !first.starts_with(b"HTTP/1.") {
            return false;
        }
        let status = first
            .get(9..12)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(400);
        tracing::debug!(status, "answering an unparseable request");
        self.replacement = Some((parse_error_answer(status, &self.limits), 0));
        true
    }
}

/// The complete HTTP answer to a request hyper could not parse (hyper's `status`).
fn parse_error_answer(status: u16, limits: &Limits) -> Vec<u8> {
    let (code, reason, message) = match status {
        414 => (
            ErrorCode::UriTooLong,
            "URI Too Long",
            "the request target is too long".to_owned(),
        ),
        431 => (
            ErrorCode::HeadersTooLarge,
            "Request Header Fields Too Large",
            format!(
                "the request line and headers exceed {} bytes or {} fields",
                limits.max_header_bytes,
                super::MAX_HEADERS
            ),
        ),
        _ => (
            ErrorCode::BadRequest,
            "Bad Request",
            "the request is not valid HTTP/1.1 (request line or headers)".to_owned(),
        ),
    };
    let body = serde_json::to_string(&ErrorEnvelope::new(code, message))
        .unwrap_or_else(|_| String::from("{}"));
    format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        code.status(),
        body.len()
    )
    .into_bytes()
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before && !this.slot.reading.load(Relaxed) && !this.slot.is_busy() {
            // The first bytes of a new request head: its header timeout starts now.
            this.slot.since.store(this.clock.now_ms(), Relaxed);
            this.slot.reading.store(true, Relaxed);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.intercept(buf) {
            // hyper closes the connection after its answer; nothing of it goes out.
            let _ = this.poll_replacement(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if this.intercept(first) {
            let _ = this.poll_replacement(cx)?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper has handed over its whole buffer before it flushes: every response
        // finished by now is in what was written.
        let finished = this.slot.finished.load(Relaxed);
        ready!(this.poll_replacement(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        if finished > this.slot.flushed.load(Relaxed) {
            this.slot.flushed.store(finished, Relaxed);
            if finished == this.slot.started.load(Relaxed) {
                // Every request answered: idle from now until the next head begins.
                this.slot.reading.store(false, Relaxed);
                this.slot.since.store(this.clock.now_ms(), Relaxed);
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

//! One RESP connection's task after the TLS handshake: reads commands, runs them in order
//! on this task, writes the replies of the commands that arrived together in one write,
//! and keeps the phases of its [`ConnSlot`] (busy while commands run or replies wait to be
//! written; reading while a command is incomplete; idle otherwise) so that the cap, the
//! timeouts and shutdown treat it as they treat an HTTP connection.

use palisade_api::ErrorDetail;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::connection::Shared;
use super::registry::{ConnSlot, Order};
use super::ClientCert;
use crate::error::ApiError;
use crate::resp::codec::{next_command, ProtocolError, Reply};
use crate::resp::commands::{error_reply, Session};
use crate::resp::FLUSH_AT;

/// Serves RESP on `stream` until the client closes it, a limit or an order closes it, or
/// a protocol error does (after its answer).
pub(crate) async fn serve<S>(
    shared: &Shared,
    mut stream: S,
    slot: &Arc<ConnSlot>,
    cert: Option<ClientCert>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(service) = &shared.resp else {
        return;
    };
    let clock = shared.registry.clock;
    let limits = &shared.limits;
    let mut session = Session::new(cert);
    let mut input = BytesMut::with_capacity(4096);
    let mut output = BytesMut::with_capacity(4096);
    let next_check = |now: u64| {
        slot.deadline_ms(limits.header_ms, limits.idle_ms)
            .unwrap_or(u64::MAX)
            .min(now.saturating_add(limits.header_ms))
    };
    let mut timer = std::pin::pin!(tokio::time::sleep_until(
        clock.instant(next_check(clock.now_ms()))
    ));
    loop {
        // Every complete command in the buffer, in order.
        let mut answered = false;
        loop {
            let args = match next_command(&mut input, service.bounds) {
                Ok(Some(args)) => args,
                Ok(None) => break,
                Err(e) => {
                    protocol_error(e).encode(session.resp3(), &mut output);
                    let _ = write_out(&mut stream, &mut output, slot).await;
                    return;
                }
            };
            slot.started.fetch_add(1, Relaxed);
            answered = true;
            let reply = if slot.order() == Order::Evict {
                // Closed to make room: what arrives now is not run (see connection.rs).
                session.closing = true;
                error_reply(ApiError::new(
                    ErrorDetail::Unavailable,
                    "the server closed this connection to make room for another (its \
                     connection cap is reached); nothing was done: send the command again \
                     on a new connection",
                ))
            } else {
                tokio::select! {
                    biased;
                    reply = session.execute(&service.state, args) => reply,
                    _ = closed(slot) => return,
                }
            };
            reply.encode(session.resp3(), &mut output);
            slot.finished.fetch_add(1, Relaxed);
            if session.closing {
                let _ = write_out(&mut stream, &mut output, slot).await;
                return;
            }
            if output.len() >= FLUSH_AT && write_out(&mut stream, &mut output, slot).await.is_err()
            {
                return;
            }
        }
        if answered {
            if write_out(&mut stream, &mut output, slot).await.is_err() {
                return;
            }
            let flushed = slot.finished.load(Relaxed);
            slot.flushed.store(flushed, Relaxed);
            // Idle from now, or reading the rest of a command that came with the others.
            slot.reading.store(!input.is_empty(), Relaxed);
            slot.since.store(clock.now_ms(), Relaxed);
        }
        if slot.order() != Order::None {
            // Evicted or stopping, with nothing in progress.
            return;
        }
        tokio::select! {
            biased;
            _ = slot.wake.notified() => {}
            read = stream.read_buf(&mut input) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if !slot.reading.load(Relaxed) {
                        // The first bytes of a command: its header timeout starts now.
                        slot.since.store(clock.now_ms(), Relaxed);
                        slot.reading.store(true, Relaxed);
                    }
                }
            },
            _ = &mut timer => {
                let now = clock.now_ms();
                if slot.deadline_ms(limits.header_ms, limits.idle_ms).is_some_and(|d| d <= now) {
                    tracing::debug!("closing a RESP connection: header or idle timeout");
                    return;
                }
                timer.as_mut().reset(clock.instant(next_check(now)));
            }
        }
    }
}

/// Writes the replies waiting in `output`; the connection stays busy meanwhile, and the
/// end of shutdown's grace cuts it short.
async fn write_out<S: AsyncWrite + Unpin>(
    stream: &mut S,
    output: &mut BytesMut,
    slot: &ConnSlot,
) -> std::io::Result<()> {
    let written = async {
        stream.write_all(output).await?;
        stream.flush().await
    };
    let result = tokio::select! {
        biased;
        result = written => result,
        _ = closed(slot) => Err(std::io::ErrorKind::ConnectionAborted.into()),
    };
    output.clear();
    result
}

/// Waits for the order to close at once (the end of shutdown's grace).
async fn closed(slot: &ConnSlot) {
    loop {
        let woken = slot.wake.notified();
        if slot.order() == Order::Close {
            return;
        }
        woken.await;
    }
}

/// The answer to bytes that are not a command.
fn protocol_error(e: ProtocolError) -> Reply {
    let detail = match e {
        ProtocolError::TooLarge(_) => ErrorDetail::PayloadTooLarge { limit: None },
        _ => ErrorDetail::BadRequest,
    };
    error_reply(ApiError::new(detail, format!("Protocol error: {e}")))
}

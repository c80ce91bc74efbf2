//! # RESP: the hot routes over the Redis protocol
//!
//! A second listener (`--resp-listen ADDR`, off by default) that speaks RESP2 and RESP3,
//! the protocol of Redis, for which every language has client libraries. It carries only
//! the routes whose cost is dominated by HTTP/1.1 itself: acquire, keepalive, release, and
//! the fenced store's get, put and delete. Everything else (listings, status, sessions,
//! events, admin) stays on HTTP, which remains the reference: each command here runs the
//! same function as its HTTP route (`commands.rs`), with the same checks in the same order,
//! the same error codes, limits, audit lines and metrics.
//!
//! ## Commands
//! | command | HTTP route | reply |
//! |---|---|---|
//! | `LOCK.ACQUIRE <lock> <ttl_ms> [HOLDER h] [WAIT ms] [DELAY ms]` | `POST /v1/locks/{lock}/acquire` | map: the lease |
//! | `LOCK.KEEPALIVE <lease_id>` | `POST /v1/leases/{id}/keepalive` | map |
//! | `LOCK.RELEASE <lease_id>` | `POST /v1/leases/{id}/release` | map |
//! | `KV.GET <lock> <key>` | `GET /v1/kv/{lock}/{key}` | the value, or null |
//! | `KV.PUT <lock> <key> <value> <token> [SEQ n] [IDEMPOTENCY-KEY k] [IF-REVISION r \| IF-ABSENT]` | `PUT /v1/kv/{lock}/{key}` | map: revision, epoch, replayed |
//! | `KV.DEL <lock> <key> <token> [...]` | `DELETE /v1/kv/{lock}/{key}` | map |
//!
//! and the connection commands clients send on their own: `HELLO [2|3] [AUTH principal
//! key] [SETNAME name]`, `AUTH [principal] key`, `PING`, `QUIT`, `SELECT 0`, `CLIENT
//! SETNAME`/`SETINFO`. Replies are RESP2 until `HELLO 3`; maps are flat arrays in RESP2.
//!
//! ## Errors
//! `-<CODE> <message> [name=value ...]`: the HTTP error's stable code in capitals
//! (`-STALE_TOKEN ...`, `-UNAUTHENTICATED ...`), its message, then its extra fields. A
//! command that is not an array of bulk strings, or is larger than the limits, is a
//! protocol error: `-BAD_REQUEST Protocol error: ...` (`-PAYLOAD_TOO_LARGE ...` for size),
//! and the connection closes, as Redis closes it.
//!
//! ## Authentication
//! With an auth file, a connection gives a key with `AUTH <key>` (or `HELLO 3 AUTH
//! <principal> <key>`; the principal `default` stands for any), or presents a client
//! certificate over mutual TLS. The key is looked up again for each command, so a reload
//! that removes it refuses the next command. Without an auth file every command runs as
//! the open caller, as on HTTP.
//!
//! ## Limits
//! The listener shares the HTTP listener's connection cap (one count for both), header
//! and idle timeouts (a command must arrive whole within the header timeout of its first
//! byte), shutdown grace and TLS files. A command holds at most [`MAX_ARGS`] arguments and
//! the value limit plus [`COMMAND_OVERHEAD`] bytes. Replies are written once the commands
//! that arrived together are answered, or sooner past [`FLUSH_AT`] bytes, so pipelined
//! commands share one write.
//!
//! ## What it does not do
//! - No other Redis commands, no pub/sub (`GET /v1/events` is the stream), no `MULTI`.
//! - Commands on one connection run one after another, in order; a `LOCK.ACQUIRE` that
//!   waits (`WAIT`) holds up the commands pipelined behind it.
//! - Like an HTTP response, a reply the client does not read holds its connection (it is
//!   busy, so neither evicted nor timed out) until shutdown's grace ends.

pub(crate) mod codec;
pub(crate) mod commands;

use crate::api::AppState;

/// Most arguments of one command, its name included.
pub const MAX_ARGS: usize = 16;
/// Bytes a command may hold beyond the value limit (names, keys, token, options).
pub const COMMAND_OVERHEAD: usize = 64 * 1024;
/// Replies waiting past this many bytes are written before the next command runs.
pub const FLUSH_AT: usize = 64 * 1024;

/// What the RESP connections share: the server's state and the command bounds.
pub(crate) struct Service {
    pub(crate) state: AppState,
    pub(crate) bounds: codec::Bounds,
}

impl Service {
    pub(crate) fn new(state: AppState) -> Service {
        let bounds = codec::Bounds {
            max_args: MAX_ARGS,
            max_bytes: state.max_value_bytes.saturating_add(COMMAND_OVERHEAD),
        };
        Service { state, bounds }
    }
}

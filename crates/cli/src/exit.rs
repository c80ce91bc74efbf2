//! Exit codes and the one-line error messages of every command.
//!
//! A script must be able to tell "the lock is taken" from "the server is down" without
//! parsing text, so each kind of failure has its own exit code ([`Exit`]), documented in
//! docs/cli.md (a test checks that page against [`Exit::ALL`]). A failure prints one line
//! on stderr, `error: <what happened>`, ending with what to do where there is something
//! to do.
//!
//! Commands that run something else have their own rules on top, documented with them:
//! `lock run` exits with its command's status, `verify` with 1 for violations.

use std::fmt;

use palisade_api::ErrorCode;

/// The exit codes of `palisade`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done.
    Ok = 0,
    /// A failure with no code of its own (a local file that cannot be read, a server that
    /// could not start, ...).
    Failure = 1,
    /// Bad usage: an unknown flag, a missing argument, a value the server or client
    /// refused as malformed (`bad_request`, `payload_too_large`), unusable client
    /// settings (a CA or key file that cannot be read), a bad `serve` setting.
    Usage = 2,
    /// `lock_held`: the lock is taken (after waiting, if `--wait-ms` was given).
    LockHeld = 3,
    /// The token was refused: `stale_token`, `stale_sequence`, `invalid_token`,
    /// `wrong_lock`, `missing_token`; `token check` on a token that is not current.
    TokenRefused = 4,
    /// `not_found`: no such key or lock.
    NotFound = 5,
    /// `lease_expired`: the lease is gone (expired, released, never existed); `lock run`
    /// after it lost its lease and stopped the command.
    LeaseLost = 6,
    /// A precondition failed: `revision_mismatch`, `idempotency_conflict`,
    /// `write_conflict`, `key_active`.
    Conflict = 7,
    /// `unauthenticated`: no bearer key, or one the server does not know.
    Unauthenticated = 8,
    /// `permission_denied`: the key's principal may not do this.
    PermissionDenied = 9,
    /// `quota_exceeded`: a server limit would be exceeded.
    QuotaExceeded = 10,
    /// No answer: nothing listens at the URL, the connection or TLS handshake failed, or
    /// the server did not answer in time (for a write: its outcome is unknown).
    Unreachable = 11,
    /// The server answered with a failure of its own (`storage_failed`, `unavailable`, a
    /// 5xx) or with something that is not Palisade's API.
    ServerError = 12,
}

impl Exit {
    /// Every code, in order, with the short name docs/cli.md uses.
    pub const ALL: &'static [(Exit, &'static str)] = &[
        (Exit::Ok, "ok"),
        (Exit::Failure, "failure"),
        (Exit::Usage, "usage"),
        (Exit::LockHeld, "lock held"),
        (Exit::TokenRefused, "token refused"),
        (Exit::NotFound, "not found"),
        (Exit::LeaseLost, "lease lost"),
        (Exit::Conflict, "conflict"),
        (Exit::Unauthenticated, "unauthenticated"),
        (Exit::PermissionDenied, "permission denied"),
        (Exit::QuotaExceeded, "quota exceeded"),
        (Exit::Unreachable, "server unreachable"),
        (Exit::ServerError, "server error"),
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// The exit code for an error answer with `code` (and HTTP `status`, for codes this
    /// version does not know).
    pub fn for_api(code: &str, status: u16) -> Exit {
        let Some(code) = ErrorCode::parse(code) else {
            return if status >= 500 {
                Exit::ServerError
            } else {
                Exit::Failure
            };
        };
        match code {
            ErrorCode::LockHeld => Exit::LockHeld,
            ErrorCode::StaleToken
            | ErrorCode::StaleSequence
            | ErrorCode::InvalidToken
            | ErrorCode::WrongLock
            | ErrorCode::MissingToken => Exit::TokenRefused,
            ErrorCode::NotFound => Exit::NotFound,
            ErrorCode::LeaseExpired => Exit::LeaseLost,
            ErrorCode::RevisionMismatch
            | ErrorCode::IdempotencyConflict
            | ErrorCode::WriteConflict
            | ErrorCode::KeyActive => Exit::Conflict,
            ErrorCode::Unauthenticated => Exit::Unauthenticated,
            ErrorCode::PermissionDenied => Exit::PermissionDenied,
            ErrorCode::QuotaExceeded => Exit::QuotaExceeded,
            ErrorCode::StorageFailed | ErrorCode::Unavailable => Exit::ServerError,
            ErrorCode::BadRequest
            | ErrorCode::PayloadTooLarge
            | ErrorCode::UriTooLong
            | ErrorCode::HeadersTooLarge => Exit::Usage,
            _ => Exit::Failure,
        }
    }
}

/// The exit codes in one line, for `--help`.
pub fn summary() -> String {
    let codes: Vec<String> = Exit::ALL
        .iter()
        .map(|(exit, name)| format!("{} {name}", exit.code()))
        .collect();
    format!("Exit codes: {} (docs/cli.md).", codes.join(", "))
}

/// A failure with its exit code and its one-line message.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure::with_code(exit.code(), message)
    }

    /// A failure with a code outside [`Exit`] (`lock run`'s 126 and 127).
    pub fn with_code(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A client error as a [`Failure`]: `<code>: <what>`, plus a hint for the failures a
/// newcomer meets first. `server` is the URL the command talked to.
pub fn client_failure(err: palisade_client::Error, server: &str) -> Failure {
    use palisade_client::Error as E;
    let code = err.code().to_owned();
    match err {
        E::Transport(e) => transport_failure(&e, server),
        E::Decode(what) => Failure::new(
            Exit::ServerError,
            format!("{server} did not answer like a Palisade server ({what}): is --server right?"),
        ),
        E::Config(what) => Failure::new(Exit::Usage, format!("client settings: {what}")),
        E::Api {
            status, message, ..
        } => Failure::new(Exit::for_api(&code, status), format!("{code}: {message}")),
        E::StaleSequence {
            high_water,
            high_water_seq,
            epoch,
            ..
        } if epoch >= high_water => {
            // No newer holder: this holder's own sequence is behind its last write.
            let exit = Exit::for_api(&code, 0);
            Failure::new(
                exit,
                format!(
                    "{code}: {err}: this epoch already wrote sequence {high_water_seq}; \
                     send a higher --seq"
                ),
            )
        }
        other => {
            let exit = Exit::for_api(&code, 0);
            let hint = match exit {
                Exit::LockHeld => "; to wait for it, add --wait-ms",
                Exit::Unauthenticated => {
                    "; give the bearer key with --key-file FILE or the PALISADE_KEY variable"
                }
                Exit::PermissionDenied => {
                    "; the server's auth file says what each key may do (docs/security.md)"
                }
                Exit::LeaseLost => "; acquire the lock again",
                _ if other.is_fenced() => {
                    ": a newer holder has written since; acquire the lock again"
                }
                Exit::ServerError => ": see the server's log",
                _ => "",
            };
            Failure::new(exit, format!("{code}: {other}{hint}"))
        }
    }
}

/// Why a request got no answer, in the terms a person can act on.
fn transport_failure(err: &reqwest::Error, server: &str) -> Failure {
    let refused = causes(err).any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    });
    let message = if refused {
        format!(
            "no server at {server}: start one with `palisade serve`, or point --server \
             (PALISADE_SERVER) at yours"
        )
    } else if err.is_timeout() {
        format!(
            "the server at {server} did not answer in time (a write's outcome is then \
             unknown: it may have been applied)"
        )
    } else {
        let why = chain_text(err);
        let hint = if why.contains("UnknownIssuer") || why.contains("invalid peer certificate") {
            "; if its certificate comes from a private CA, give that CA with --ca-file"
        } else if why.contains("UnknownCA") || why.contains("CertificateRequired") {
            "; the server wants a client certificate signed by its CA (--client-cert, \
             --client-key)"
        } else if server.starts_with("https://")
            && (why.contains("InvalidContentType") || why.contains("corrupt message"))
        {
            // What rustls makes of an HTTP answer to its TLS hello.
            "; the server does not speak TLS there: use http:// in --server"
        } else if why.contains("dns error") {
            "; check the host name in --server (PALISADE_SERVER)"
        } else if server.starts_with("https://")
            && (why.contains("connection was not ready")
                || why.contains("connection closed before message completed"))
        {
            // With TLS 1.3 a server that refuses the client's certificate does so after
            // the client's side of the handshake: the refusal may then arrive as a bare
            // close instead of its alert.
            "; the server closed the connection as it opened, which over https is often a              TLS refusal: a server that requires client certificates wants one signed by its              CA (--client-cert, --client-key)"
        } else {
            ""
        };
        format!("cannot reach the server at {server}: {why}{hint}")
    };
    Failure::new(Exit::Unreachable, message)
}

fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

/// An error and its causes as one line, `a: b: c`, leaving out a cause whose text is
/// already in the line (libraries often repeat their source's message in their own, and
/// an OS error printed twice helps nobody).
pub fn chain_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    for cause in causes(err) {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// The exit code and line for an error that ends a command.
pub fn report(err: &anyhow::Error) -> (u8, String) {
    if let Some(failure) = err.downcast_ref::<Failure>() {
        return (failure.code, failure.message.clone());
    }
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    let code = err
        .chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(Exit::Failure.code(), |f| f.code);
    (code, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_has_an_exit() {
        for code in ErrorCode::ALL {
            let exit = Exit::for_api(code.as_str(), code.status());
            assert_ne!(exit, Exit::Ok, "{code}");
        }
        assert_eq!(Exit::for_api("lock_held", 409), Exit::LockHeld);
        assert_eq!(Exit::for_api("stale_token", 409), Exit::TokenRefused);
        assert_eq!(Exit::for_api("a_newer_code", 503), Exit::ServerError);
        assert_eq!(Exit::for_api("a_newer_code", 409), Exit::Failure);
    }

    /// docs/cli.md's table lists exactly these codes with these names.
    #[test]
    fn the_docs_table_matches() {
        let docs = include_str!("../../../docs/cli.md");
        let rows: Vec<(u8, &str)> = docs
            .lines()
            .filter_map(|l| {
                let mut cells = l.strip_prefix("| ")?.split(" | ");
                let code = cells.next()?.parse().ok()?;
                Some((code, cells.next()?))
            })
            .collect();
        let ours: Vec<(u8, &str)> = Exit::ALL.iter().map(|(e, n)| (e.code(), *n)).collect();
        assert_eq!(rows, ours);
    }

    #[test]
    fn codes_are_distinct_and_in_order() {
        for (i, (exit, _)) in Exit::ALL.iter().enumerate() {
            assert_eq!(usize::from(exit.code()), i);
        }
    }

    #[test]
    fn a_repeated_os_error_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot create {path}: {source}")]
        struct Outer {
            path: String,
            source: std::io::Error,
        }
        let io = std::io::Error::from_raw_os_error(17);
        let os_text = io.to_string();
        let err = anyhow::Error::new(Outer {
            path: "/x".into(),
            source: io,
        })
        .context("cannot start");
        let (code, line) = report(&err);
        assert_eq!(code, Exit::Failure.code());
        assert_eq!(line.matches(&os_text).count(), 1, "{line}");
        assert!(line.starts_with("cannot start: cannot create /x"), "{line}");
    }

    #[test]
    fn a_failure_keeps_its_code_under_context() {
        let err =
            anyhow::Error::new(Failure::new(Exit::NotFound, "not_found: no key")).context("kv get");
        assert_eq!(report(&err).0, Exit::NotFound.code());
    }
}

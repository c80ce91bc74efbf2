//! Failover between the endpoints of one deployment (the stateless nodes of an etcd
//! topology): which failures may move a call to the next node, and the loop every call
//! runs over the nodes. The same rules as the Python client's (`palisade._failover`).
//!
//! A call moves to the next endpoint when the current one could not be reached, or
//! answered 503; a call whose request may already have been applied moves on only if
//! resending it cannot apply it twice ([`Retry`]):
//!
//! - reads, renewals, releases, proclaims, session renewals and closes, and token checks
//!   are safe to resend;
//! - a fenced write or barrier is safe to resend only with an `Idempotency-Key`, so a
//!   client with several endpoints puts a fresh key on every write that has none (the
//!   same key on every resend of that write: the server answers a resend with the first
//!   outcome instead of applying it again, S9);
//! - an acquire, or a session creation, whose answer was lost is **not** resent: a
//!   second acquire would be a second lease. The caller gets [`Error::Transport`] and
//!   decides (look at the lock's status: a lease it does not know will run out).
//!
//! Endpoints are tried in order starting from the last one that answered, so a dead node
//! costs one failed connect, not one per call. A call that is safe to resend gets one
//! more try on an endpoint that lost an answer, after the others: a keep-alive connection
//! the server closed between two requests fails exactly that way, and the retry goes out
//! on a new connection.

use std::sync::atomic::{AtomicUsize, Ordering};

use reqwest::{Method, RequestBuilder, Response};

use crate::decode::decode_error;
use crate::{Client, Error};

/// How freely a call may be resent to the next endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Resending cannot change the outcome.
    Safe,
    /// Resent when no node got it or a node answered 503, not when the answer was lost.
    UnlessUnknown,
    /// Resent only when it surely reached no node (a write without an idempotency key:
    /// a 503 from a replicated backend may come after the write was applied).
    OnlyUnreachable,
}

/// How one attempt on one endpoint failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Never sent: the connection could not be made.
    Unreachable,
    /// The node answered 503.
    Unavailable,
    /// Sent, and no answer came back: it may have been applied.
    Unknown,
}

/// Whether a call with this retry class may move to the next endpoint.
pub(crate) fn may_try_next(retry: Retry, failure: Failure) -> bool {
    match failure {
        Failure::Unreachable => true,
        Failure::Unavailable => retry != Retry::OnlyUnreachable,
        Failure::Unknown => retry == Retry::Safe,
    }
}

/// What a transport error says about the request, or `None` for a local mistake that no
/// other endpoint would fix (a request that could not be built).
pub(crate) fn classify(err: &reqwest::Error) -> Option<Failure> {
    if err.is_builder() {
        None
    } else if err.is_connect() {
        Failure::Unreachable.into()
    } else {
        Failure::Unknown.into()
    }
}

/// The base URLs of one deployment and the one that answered last.
#[derive(Debug)]
pub(crate) struct Endpoints {
    bases: Vec<String>,
    preferred: AtomicUsize,
}

impl Endpoints {
    pub(crate) fn new(bases: Vec<String>) -> Endpoints {
        Endpoints {
            bases,
            preferred: AtomicUsize::new(0),
        }
    }

    /// Every base, in configuration order.
    pub(crate) fn bases(&self) -> &[String] {
        &self.bases
    }

    pub(crate) fn several(&self) -> bool {
        self.bases.len() > 1
    }

    /// The base calls start from.
    pub(crate) fn preferred(&self) -> &str {
        let i = self.preferred.load(Ordering::Relaxed) % self.bases.len().max(1);
        self.bases.get(i).map_or("", String::as_str)
    }

    /// The indexes of the bases in the order to try them.
    fn order(&self) -> Vec<usize> {
        let n = self.bases.len();
        let start = self.preferred.load(Ordering::Relaxed);
        (0..n).map(|k| (start + k) % n).collect()
    }

    fn prefer(&self, i: usize) {
        self.preferred.store(i, Ordering::Relaxed);
    }
}

impl Client {
    /// Sends `method path` to the endpoints in turn, as `retry` allows (module docs);
    /// `build` adds headers and body to each attempt. Any non-2xx answer that is the
    /// call's outcome becomes the matching [`Error`].
    pub(crate) async fn call(
        &self,
        retry: Retry,
        method: Method,
        path: &str,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<Response, Error> {
        let endpoints = &self.endpoints;
        let mut queue = endpoints.order();
        let mut resent: Vec<usize> = Vec::new();
        let mut last: Option<Error> = None;
        while !queue.is_empty() {
            let i = queue.remove(0);
            let Some(base) = endpoints.bases.get(i) else {
                continue;
            };
            let req = build(self.http.request(method.clone(), format!("{base}{path}")));
            let resp = match req.send().await {
                Ok(resp) => resp,
                Err(err) => {
                    let failure = classify(&err);
                    let again = failure.is_some_and(|f| may_try_next(retry, f));
                    if failure == Some(Failure::Unknown) && again && !resent.contains(&i) {
                        // After the others: a node that lost one answer may be going down.
                        resent.push(i);
                        queue.push(i);
                    }
                    last = Some(Error::Transport(err));
                    if again {
                        continue;
                    }
                    break;
                }
            };
            let status = resp.status();
            if status == reqwest::StatusCode::SERVICE_UNAVAILABLE
                && !queue.is_empty()
                && may_try_next(retry, Failure::Unavailable)
            {
                let body = resp.bytes().await.unwrap_or_default();
                last = Some(decode_error(status, &body));
                continue;
            }
            endpoints.prefer(i);
            if status.is_success() {
                return Ok(resp);
            }
            let body = resp.bytes().await?;
            return Err(decode_error(status, &body));
        }
        Err(last.unwrap_or_else(|| Error::Config("no endpoint to send to".to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_may_move_to_the_next_endpoint() {
        use Failure::*;
        use Retry::*;
        for retry in [Safe, UnlessUnknown, OnlyUnreachable] {
            assert!(may_try_next(retry, Unreachable), "{retry:?}");
        }
        assert!(may_try_next(Safe, Unavailable));
        assert!(may_try_next(UnlessUnknown, Unavailable));
        assert!(!may_try_next(OnlyUnreachable, Unavailable));
        assert!(may_try_next(Safe, Unknown));
        // An acquire whose answer was lost, or a write without an idempotency key, stays.
        assert!(!may_try_next(UnlessUnknown, Unknown));
        assert!(!may_try_next(OnlyUnreachable, Unknown));
    }

    #[test]
    fn calls_start_from_the_endpoint_that_answered_last() {
        let e = Endpoints::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(e.order(), vec![0, 1, 2]);
        e.prefer(2);
        assert_eq!(e.order(), vec![2, 0, 1]);
        assert_eq!(e.preferred(), "c");
    }
}

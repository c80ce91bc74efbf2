//! The worker's own failover between the nodes of a deployment.
//!
//! `palisade-client` talks to one server; a worker of the etcd3 topology knows all three
//! nodes (through its proxies) and starts with its home node, `(id - 1) % n`. When a call
//! gets no usable answer from a node (a transport error: refused, reset, cut by the
//! proxy) or a 503 (`storage_failed`: the node cannot reach etcd, or etcd has no quorum),
//! the same call goes to the next node, each node at most once. That is safe because
//! every call a worker makes is harmless to repeat:
//!
//! - reads, fences (raising a mark to the same epoch twice changes nothing), keepalives
//!   and releases are idempotent;
//! - fenced writes and deletes carry an `Idempotency-Key` that is the same on every
//!   attempt, so a write the first node applied without answering is replayed, not
//!   applied again, by the next (S9);
//! - a repeated acquisition can leave an orphaned grant on the first node whose answer
//!   was lost: it costs the lock one lease TTL of liveness, never safety (its epoch is
//!   never used by anyone).
//!
//! If an earlier attempt went unanswered, the call's outcome is never reported as a
//! definite refusal (the unanswered attempt may still take effect): [`CallError`] carries
//! that, and the recorder writes such an operation as `info`.

use std::future::Future;

use palisade_client::{Client, Error};

/// A failed call: the last error, and whether an earlier attempt may have taken effect.
#[derive(Debug)]
pub(crate) struct CallError {
    pub error: Error,
    pub earlier_unanswered: bool,
}

impl CallError {
    pub fn code(&self) -> &str {
        self.error.code()
    }

    pub fn is_fenced(&self) -> bool {
        self.error.is_fenced()
    }
}

impl From<Error> for CallError {
    fn from(error: Error) -> CallError {
        CallError {
            error,
            earlier_unanswered: false,
        }
    }
}

/// True when another node may answer where this one did not.
pub(crate) fn try_next_node(err: &Error) -> bool {
    match err {
        Error::Transport(_) | Error::StorageFailed => true,
        Error::Api { status, .. } => *status >= 500,
        _ => false,
    }
}

/// True when the call may have taken effect although it failed: no answer, or an
/// answer that does not say (5xx).
pub(crate) fn unanswered(err: &Error) -> bool {
    try_next_node(err) || matches!(err, Error::Decode(_))
}

/// One client per node, tried from the home node on.
#[derive(Debug, Clone)]
pub(crate) struct Nodes {
    clients: Vec<Client>,
    home: usize,
}

impl Nodes {
    pub fn new(clients: Vec<Client>, home: usize) -> Nodes {
        let home = home % clients.len().max(1);
        Nodes { clients, home }
    }

    /// Runs `call` on the home node, then on each next node while the answer says to.
    pub async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut earlier_unanswered = false;
        let n = self.clients.len();
        for step in 0..n {
            let client = self.clients[(self.home + step) % n].clone();
            match call(client).await {
                Ok(value) => return Ok(value),
                Err(error) if step + 1 < n && try_next_node(&error) => {
                    earlier_unanswered |= unanswered(&error);
                }
                Err(error) => {
                    return Err(CallError {
                        error,
                        earlier_unanswered,
                    })
                }
            }
        }
        Err(CallError {
            error: Error::BadRequest("no nodes configured".into()),
            earlier_unanswered,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize, home: usize) -> Nodes {
        let clients = (0..n)
            .map(|i| Client::new(&format!("http://127.0.0.1:{}", 1000 + i)).unwrap())
            .collect();
        Nodes::new(clients, home)
    }

    fn port(c: &Client) -> u16 {
        c.base_url().rsplit(':').next().unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn fails_over_on_503_and_marks_earlier_unanswered_attempts() {
        let n = nodes(3, 1);
        let mut tried = Vec::new();
        let result: Result<(), CallError> = n
            .call(|c| {
                tried.push(port(&c));
                let last = tried.len() == 3;
                async move {
                    if last {
                        Err(Error::LockHeld {
                            holder: None,
                            retry_after_ms: 0,
                        })
                    } else {
                        Err(Error::StorageFailed)
                    }
                }
            })
            .await;
        assert_eq!(tried, vec![1001, 1002, 1000]);
        let err = result.unwrap_err();
        assert_eq!(err.code(), "lock_held");
        assert!(err.earlier_unanswered);
    }

    #[tokio::test]
    async fn a_definite_answer_stops_at_once() {
        let n = nodes(3, 0);
        let mut tried = 0;
        let result: Result<(), CallError> = n
            .call(|_| {
                tried += 1;
                async {
                    Err(Error::Stale {
                        high_water: 2,
                        epoch: 1,
                    })
                }
            })
            .await;
        assert_eq!(tried, 1);
        let err = result.unwrap_err();
        assert!(err.is_fenced() && !err.earlier_unanswered);
    }

    #[tokio::test]
    async fn the_first_good_answer_wins() {
        let n = nodes(3, 2);
        let mut tried = Vec::new();
        let got = n
            .call(|c| {
                tried.push(port(&c));
                let first = tried.len() == 1;
                async move {
                    if first {
                        Err(Error::Api {
                            status: 503,
                            code: "storage_failed".into(),
                            message: String::new(),
                        })
                    } else {
                        Ok(7)
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!((got, tried), (7, vec![1002, 1000]));
    }
}

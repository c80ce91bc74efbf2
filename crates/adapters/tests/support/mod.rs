//! Test support shared by every adapter's test file: token minting, the behavioural
//! contract each adapter implements ([`GateUnderTest`]), the shared cases (`suite`), and
//! real PostgreSQL and Redis servers on free loopback ports (`servers`).
//!
//! Each test file compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod servers;
pub mod suite;

use std::future::Future;
use std::sync::Arc;

use palisade_adapters::report::ResourceKind;
use palisade_adapters::{AdmitError, GateTally};
use palisade_token::{KeyRing, Signer, Verifier};

/// The lock guarding the scenario's data.
pub const LOCK: &str = "orders";
/// Another lock, whose tokens must never write [`LOCK`]'s data.
pub const OTHER_LOCK: &str = "payments";

/// Plays the issuer: mints genuine tokens; resources get its public key in a verifier.
pub struct Issuer {
    signer: Signer,
    verifier: Arc<Verifier>,
}

impl Issuer {
    pub fn new() -> Self {
        let signer = Signer::generate();
        let mut ring = KeyRing::new();
        ring.insert(signer.public_key());
        Issuer {
            signer,
            verifier: Arc::new(Verifier::new(ring, 1024)),
        }
    }

    /// A genuine token for `lock` at `epoch`.
    pub fn token(&self, lock: &str, epoch: u64) -> String {
        self.signer.issue(lock, epoch, &format!("holder-{epoch}"))
    }

    /// The verifier a resource uses: trusts this issuer's key only.
    pub fn verifier(&self) -> Arc<Verifier> {
        self.verifier.clone()
    }
}

/// One fenced write as the suite asks for it: `value` at `key`, guarded by `lock`, if
/// `token` is admitted.
#[derive(Clone, Copy)]
pub struct Write<'a> {
    pub token: &'a str,
    pub lock: &'a str,
    pub key: &'a str,
    pub value: &'a str,
}

impl<'a> Write<'a> {
    pub fn new(token: &'a str, lock: &'a str, key: &'a str, value: &'a str) -> Self {
        Write {
            token,
            lock,
            key,
            value,
        }
    }
}

/// What the shared suite needs from an adapter. Each method is one complete operation:
/// a fenced write opens, admits, writes and commits (or rolls back) its own transaction.
pub trait GateUnderTest: Send + Sync + 'static {
    /// Carries out `write`.
    fn put(&self, write: Write<'_>) -> impl Future<Output = Result<(), AdmitError>> + Send;

    /// Writes `value` at `key` guarded by `lock`, if `token` is admitted.
    fn write<'a>(
        &'a self,
        token: &'a str,
        lock: &'a str,
        key: &'a str,
        value: &'a str,
    ) -> impl Future<Output = Result<(), AdmitError>> + Send + 'a {
        self.put(Write::new(token, lock, key, value))
    }

    /// The kind of resource the gate reports as.
    const KIND: ResourceKind;

    /// The tally every write of this gate counts into.
    fn tally(&self) -> &GateTally;

    /// The committed value at `key`.
    fn read(&self, key: &str) -> impl Future<Output = Option<String>> + Send;

    /// The committed mark guarding `key` for `lock` (0 if none). Per lock for the SQL and
    /// Redis adapters, per object for the object store.
    fn high_water(&self, lock: &str, key: &str) -> impl Future<Output = u64> + Send;
}

/// Adapters whose marks are per lock and can be raised after a restore (PostgreSQL,
/// SQLite, Redis).
pub trait RaisableGate: GateUnderTest {
    /// Raises each `(lock, epoch)` mark to at least `epoch`; how many went up.
    fn raise(&self, marks: &[(String, u64)]) -> impl Future<Output = usize> + Send;
}

/// How a transactional gate runs one write: the variations the shared suite needs.
#[derive(Clone, Copy)]
pub enum Shape<'a> {
    /// Admit, write, commit.
    Plain,
    /// The caller writes `"own"` at this key first, then admits and writes; commits if
    /// admitted, rolls back otherwise.
    AfterOwnWrite(&'a str),
    /// Admits (which must pass) and writes, then the caller's own next step fails and the
    /// transaction rolls back.
    FailAfter,
    /// Like `Plain`, under the sequence policy with this sequence number.
    Sequenced(u64),
}

/// Adapters that run inside a caller's transaction (PostgreSQL, SQLite).
pub trait TransactionalGate: GateUnderTest {
    /// Carries out `write` in one transaction of the given shape.
    fn put_shaped(
        &self,
        write: Write<'_>,
        shape: Shape<'_>,
    ) -> impl Future<Output = Result<(), AdmitError>> + Send;
}

/// Retries an operation refused with [`AdmitError::Conflict`], as the docs tell users to.
pub async fn retry_conflicts<F, Fut>(mut op: F) -> Result<(), AdmitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), AdmitError>>,
{
    for _ in 0..1000 {
        match op().await {
            Err(AdmitError::Conflict) => tokio::task::yield_now().await,
            other => return other,
        }
    }
    panic!("an operation lost 1000 races in a row");
}

/// The shared suite's tests (`suite`), each on a new gate: `$gate` makes one from
/// `$issuer` (an `&Issuer`); `racers` is how many writers `racing_epochs` runs. With
/// `transactional`, also the cases of [`TransactionalGate`].
macro_rules! suite_tests {
    (|$issuer:ident| $gate:expr, racers: $racers:expr $(, $transactional:ident)?) => {
        #[tokio::test]
        async fn fencing_scenario() {
            let $issuer = &$crate::support::Issuer::new();
            $crate::support::suite::fencing_scenario(&$gate, $issuer).await;
        }

        #[tokio::test]
        async fn the_tally_counts_what_the_gate_decided() {
            let $issuer = &$crate::support::Issuer::new();
            $crate::support::suite::the_tally_counts_what_the_gate_decided(&$gate, $issuer).await;
        }

        #[tokio::test]
        async fn bad_tokens() {
            let $issuer = &$crate::support::Issuer::new();
            $crate::support::suite::bad_tokens(&$gate, $issuer).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn racing_epochs() {
            let $issuer = &$crate::support::Issuer::new();
            let gate = std::sync::Arc::new($gate);
            $crate::support::suite::racing_epochs(gate, $issuer, $racers).await;
        }

        $($crate::support::suite_tests!(@$transactional |$issuer| $gate);)?
    };
    (@transactional |$issuer:ident| $gate:expr) => {
        #[tokio::test]
        async fn rejected_admit_rolls_back_own_writes() {
            let $issuer = &$crate::support::Issuer::new();
            $crate::support::suite::rejected_admit_rolls_back_own_writes(&$gate, $issuer).await;
        }

        #[tokio::test]
        async fn failure_after_admit_rolls_back_the_mark() {
            let $issuer = &$crate::support::Issuer::new();
            let gate = $gate;
            $crate::support::suite::failure_after_admit_rolls_back_the_mark(&gate, $issuer).await;
        }

        #[tokio::test]
        async fn sequence_policy() {
            let $issuer = &$crate::support::Issuer::new();
            $crate::support::suite::sequence_policy(&$gate, $issuer).await;
        }
    };
}
pub(crate) use suite_tests;

//! # Sim: deterministic simulation of a Palisade node under faults
//!
//! A single-threaded discrete-event simulator in the spirit of FoundationDB's simulation
//! and tokio-rs/turmoil: one node, a handful of clients and the network between them run
//! on one virtual clock (milliseconds), and every random choice (delays, faults, what
//! clients do) comes from one seed. A run takes milliseconds of real time for seconds of
//! virtual time, so CI sweeps thousands of seeds, and a failing seed replays exactly.
//!
//! ## What is real and what is simulated
//! The node is assembled from Palisade's own pure parts, wired the way the real issuer
//! and server wire them (`server`):
//! - the issuer itself: [`palisade_issuer::core::IssuerCore`], the state machine the
//!   embedded issuer runs (its async shell only feeds it and carries out its actions),
//!   with the lock table inside it and time passed in. So the issuer's **reservation
//!   protocol** is the real one, not a model: which grant waits for a reservation to be
//!   fsync'd, which hand-off is answered at once with a lazy lease record, the order of
//!   removals, idle markers and lease records, timers and expiries; the epoch block per
//!   reservation varies by seed;
//! - the gate rule ([`palisade_core::gate::admit`]), run inside the store's batch;
//! - real Ed25519 tokens ([`palisade_token`]): signed at grant, verified on every write.
//!
//! Around them the simulator models (`store`, `net`, `client`, `nemesis`):
//! - a disk with **group commit and fsync**: the core's lazy records and durable writes
//!   go to a working copy, become durable only when the batch's fsync completes, and
//!   only then are reported to the core (`IssuerCore::written`) or answered; a **crash
//!   loses every unsynced write**, every write the core was still waiting for, and every
//!   unsent answer (sometimes a batch is durable but unanswered: a torn commit). A restart
//!   rebuilds the core from the durable records with `IssuerCore::recover`, as the
//!   embedded issuer does;
//! - a network with per-message delays, **held** messages (delivered up to seconds late,
//!   so old-epoch writes arrive after the lease moved on), drops, and client partitions;
//! - clients that acquire (waiting in line or not), fence, write, delete, read, run the
//!   lock-set workload, renew and release; whose clocks drift; that **pause** past their
//!   TTL, also between checking their lease and sending, and keep using old tokens; and
//!   that send missing, malformed, foreign and other-lock tokens;
//! - a nemesis that crashes and restarts the node (periodically, and sometimes in the
//!   middle of a slow fsync), stalls the disk for longer than a lease, and partitions
//!   and pauses clients.
//!
//! ## How a run is judged
//! Clients record every operation (invoke, complete, ok/fail/info) in the checker's
//! history format, and the store is read once at the end; the history goes through the
//! same checkers as real runs ([`palisade_checker::check_all`]: tokens, fencing safety,
//! linearizability of each namespace, lock-set lost updates, reads of unwritten values).
//! The simulator also checks what only global knowledge can see (`monitor`): no epoch
//! leaves the node twice across restarts, no live lease's token leaves before the disk
//! could honour it after a crash, no two live leases of one lock overlap in node time
//! (a lease live at a crash must be honoured a full TTL after the restart), what was
//! acknowledged survives every crash, the durable mark never goes down, and every bad
//! token is refused.
//!
//! ## Proving it can find bugs
//! [`Bug`] selects a deliberately broken node (a gate that admits stale epochs, grants or
//! writes acknowledged before fsync, a restart that honours no lease). The mutation tests sweep them and require a violation within a
//! bounded number of seeds. These variants exist only inside this crate.
//!
//! ## Replaying and sweeping
//! `cargo test -p palisade-sim` runs the default sweep. `PALISADE_SIM_SEEDS=N` sets its
//! size, `PALISADE_SIM_FIRST_SEED=S` where it starts, and `PALISADE_SIM_SEED=S` replays
//! one seed with its event trace and history printed (add `-- --nocapture`). A failing
//! seed is printed with that command line. The `palisade-sim` binary does the same from
//! the command line (`--seeds`, `--first`, `--seed`, `--bug`), in release mode for large
//! sweeps.
//!
//! ## What this does not model (S16)
//! - The HTTP layer: routing, JSON, connection handling, and the issuer's withdrawal of a
//!   grant whose waiter hung up (here the grant lives out its TTL instead).
//! - Real fsync semantics of a kernel or a disk, torn pages, redb's recovery, I/O errors
//!   and the storage fail-stop latch: "fsync done" simply means durable.
//! - More than one node, replicated stores (S7), or resources that cannot compare
//!   tokens (S13); idempotency keys and the `sequence` policy (S9), so clients never
//!   retry a request.
//! - Clock jumps on the node; only client clocks drift (the core takes `now` from the
//!   shell, which reads a monotonic clock).
//! - The simulator is a model of the node's contract, so passing it says that the
//!   *composition* of the real table, gate and tokens under this model survives these
//!   faults; it says nothing about faults the model does not have. The real-process
//!   tests and the verification harness cover the rest.

mod client;
mod config;
mod monitor;
mod nemesis;
mod net;
mod recorder;
mod run;
mod scenario;
mod server;
mod store;
mod sweep;
mod workload;
mod world;

pub use config::{env_u64, Bug, Config, ENV_FIRST, ENV_SEED, ENV_SEEDS};
pub use net::NetStats;
pub use run::{run, Outcome, RunStats};
pub use scenario::Scenario;
pub use sweep::{sweep, SweepReport};

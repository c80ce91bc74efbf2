//! `--job scale` (Palisade only): does the issuer hold a million locks and keep ten
//! thousand leases alive?
//!
//! 1. **Create**: acquire and release `--locks` distinct locks (default 1,000,000), each
//!    once, from every client connection at once, so each lock has a durable epoch.
//! 2. **Hold**: acquire `--leases` of them (default 10,000) with `--ttl-ms`.
//! 3. **Renew**: for `--duration`, every client renews each of its leases once a second
//!    (clients staggered over the second). A lease is *lost* if the server ever answers
//!    `lease_expired`; the longest gap between two renewals of one lease says how close
//!    that came (it must stay well under the ttl).
//! 4. Release everything.
//!
//! With `--server-pid`, the server's resident memory is read at each step.

mod renew;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::http::Conn;
use crate::palisade::{acquire, acquire_body, release};
use crate::report::{count, ms};
use crate::runner::run_prefix;
use crate::sys::rss_bytes;
use crate::{BenchArgs, BenchError, Job, OpError, Target};

/// What the scale job found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScaleReport {
    pub clients: usize,
    pub locks: usize,
    pub create_s: f64,
    /// Locks created per second (one acquire + one release each).
    pub create_per_s: f64,
    pub leases: usize,
    pub ttl_ms: u64,
    /// Time to acquire all the leases.
    pub hold_s: f64,
    pub renew_s: f64,
    pub keepalives: u64,
    pub keepalives_per_s: f64,
    pub keepalive_p99_us: u64,
    pub keepalive_max_us: u64,
    /// Longest time one client took to renew all of its leases once.
    pub max_round_ms: u64,
    /// Longest time between two successful renewals of one lease (the first gap counted
    /// from the start of the renewal period).
    pub max_gap_ms: u64,
    /// Leases the server reported expired while being renewed.
    pub lost: u64,
    pub errors: BTreeMap<String, u64>,
    pub rss_start: Option<u64>,
    pub rss_after_create: Option<u64>,
    pub rss_after_hold: Option<u64>,
    pub rss_max_renewing: Option<u64>,
}

impl ScaleReport {
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum::<u64>() + self.lost
    }
}

impl std::fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: Option<u64>| {
            b.map_or("unknown (give --server-pid)".to_string(), |b| {
                format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
            })
        };
        writeln!(f, "scale, {} clients:", self.clients)?;
        writeln!(
            f,
            "  created {} locks in {:.1} s ({} locks/s, each an acquire + a release)",
            count(self.locks as f64),
            self.create_s,
            count(self.create_per_s)
        )?;
        writeln!(
            f,
            "  acquired {} leases in {:.1} s (ttl {} ms), renewed each once a second for {:.0} s: {} keepalives/s, p99 {} ms, max {} ms",
            count(self.leases as f64),
            self.hold_s,
            self.ttl_ms,
            self.renew_s,
            count(self.keepalives_per_s),
            ms(self.keepalive_p99_us),
            ms(self.keepalive_max_us)
        )?;
        let kept = if self.lost == 0 { "yes" } else { "NO" };
        writeln!(
            f,
            "  kept up: {kept} ({} leases lost; longest renewal round {} ms; longest time one lease went unrenewed {} ms)",
            self.lost, self.max_round_ms, self.max_gap_ms
        )?;
        writeln!(
            f,
            "  server RSS: start {}, after creating {}, holding {}, max while renewing {}",
            mib(self.rss_start),
            mib(self.rss_after_create),
            mib(self.rss_after_hold),
            mib(self.rss_max_renewing)
        )?;
        writeln!(f, "  errors: {:?}", self.errors)
    }
}

fn add_error(errors: &mut BTreeMap<String, u64>, e: &OpError) {
    *errors.entry(e.code.clone()).or_default() += 1;
}

/// Runs the scale job.
pub async fn run(args: &BenchArgs) -> Result<ScaleReport, BenchError> {
    if args.target != Target::Palisade {
        return Err(BenchError::Args(
            "the scale job is for Palisade".to_string(),
        ));
    }
    let clients = args.clients.iter().copied().max().unwrap_or(64).max(1);
    let locks = args.locks.unwrap_or(1_000_000);
    let leases = args.leases.min(locks);
    let prefix = run_prefix(Job::Scale, clients);
    let rss = || args.server_pid.and_then(rss_bytes);
    let mut report = ScaleReport {
        clients,
        locks,
        leases,
        ttl_ms: args.ttl_ms,
        rss_start: rss(),
        ..ScaleReport::default()
    };
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let conn = Conn::open(args.url(), args.key.as_deref())
            .await
            .map_err(|e| BenchError::Setup {
                target: Target::Palisade,
                message: format!("{}: {}", args.url(), e.code),
            })?;
        conns.push(conn);
    }

    // 1. Create.
    eprintln!(
        "scale: creating {} locks with {clients} clients",
        count(locks as f64)
    );
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let body = acquire_body("scale-create", args.ttl_ms, 0);
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let (next, body, prefix) = (Arc::clone(&next), body.clone(), prefix.clone());
            tokio::spawn(async move {
                let mut errors = BTreeMap::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= locks {
                        break;
                    }
                    let path = format!("/v1/locks/{prefix}-{i}/acquire");
                    let result = match acquire(&mut conn, &path, body.clone()).await {
                        Ok(granted) => release(&mut conn, &granted.lease_id).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = result {
                        add_error(&mut errors, &e);
                    }
                }
                (conn, errors)
            })
        })
        .collect();
    let bar = crate::runner::bar(args.quiet, locks as u64, "scale: create".to_string());
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        while !task.is_finished() {
            bar.set_position(next.load(Ordering::Relaxed).min(locks) as u64);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        match task.await {
            Ok(pair) => done.push(pair),
            Err(_) => add_error(&mut report.errors, &OpError::new("client_panicked")),
        }
    }
    bar.finish_and_clear();
    report.create_s = start.elapsed().as_secs_f64();
    report.create_per_s = locks as f64 / report.create_s.max(1e-9);
    report.rss_after_create = rss();
    let mut conns = Vec::new();
    for (conn, errors) in done {
        for (code, n) in errors {
            *report.errors.entry(code).or_default() += n;
        }
        conns.push(conn);
    }

    // 2. Hold, 3. renew, 4. release.
    renew::hold_and_renew(args, &prefix, conns, &mut report, &rss).await;
    Ok(report)
}

/// A latency histogram for keepalives (µs).
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

//! The measured run: connect N workers, let them loop through a warm-up and a measured
//! window, and merge what each counted.
//!
//! Each client task keeps its own tally and histogram (no shared lock or atomic on the
//! hot path apart from one relaxed counter for the progress bar); tallies are merged once
//! the window has closed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};

use crate::driver::{self, Plan};
use crate::sys::CpuSample;
use crate::{scale, BenchArgs, BenchError, Job, Outcome, Results, Summary, Worker};

/// Longest latency the histograms hold (µs); longer ones are recorded as this.
const MAX_LATENCY_US: u64 = 600_000_000;
/// Pause after a failed operation, so a dead server is not hammered in a tight loop.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Every job of `args` at every client count.
pub async fn run_all(args: &BenchArgs) -> Result<Results, BenchError> {
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err(BenchError::Args("--clients must be at least 1".to_string()));
    }
    let mut results = Results {
        target: Some(args.target),
        url: args.url().to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        ..Results::default()
    };
    // The table goes to stdout once, at the end; stderr only says what is running (and,
    // on a terminal, shows a progress bar).
    for &job in &args.job {
        if job == Job::Scale {
            results.scale = Some(scale::run(args).await?);
            continue;
        }
        for &clients in &args.clients {
            let plan = Plan {
                target: args.target,
                job,
                url: args.url().to_string(),
                clients,
                locks: args.locks.unwrap_or(clients).max(clients),
                value: Bytes::from(vec![b'v'; args.value_size]),
                wait_ms: args.wait_ms,
                ttl_ms: args.ttl_ms,
                prefix: run_prefix(job, clients),
                key: args.key.clone(),
            };
            if !args.quiet {
                eprintln!(
                    "bench: {} {} with {clients} clients ...",
                    args.target.name(),
                    job.name()
                );
            }
            let summary = measure(plan, args).await?;
            if !args.quiet {
                eprintln!(
                    "bench: {} {} with {clients} clients: {} ops/s",
                    args.target.name(),
                    job.name(),
                    crate::report::count(summary.ops_per_s)
                );
            }
            results.runs.push(summary);
        }
    }
    Ok(results)
}

/// A name prefix no other run uses: job, clients, process id and the time.
pub fn run_prefix(job: Job, clients: usize) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % (1 << 48));
    format!(
        "bench-{}-c{clients}-{:x}{nanos:x}",
        job.name(),
        std::process::id()
    )
}

/// What one client counted.
struct Tally {
    ops: u64,
    refused: u64,
    errors: BTreeMap<String, u64>,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ops: 0,
            refused: 0,
            errors: BTreeMap::new(),
            // Bounds are constants that `new_with_bounds` accepts.
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("valid histogram bounds"),
        }
    }

    fn error(&mut self, code: &str) {
        *self.errors.entry(code.to_string()).or_default() += 1;
    }

    fn merge(&mut self, other: Tally) {
        self.ops += other.ops;
        self.refused += other.refused;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
    }
}

#[derive(Clone, Copy)]
struct Window {
    from: Instant,
    until: Instant,
}

async fn client_loop(
    mut worker: Box<dyn Worker>,
    window: Window,
    done: Arc<AtomicU64>,
) -> (Tally, Box<dyn Worker>) {
    let mut tally = Tally::new();
    loop {
        let start = Instant::now();
        if start >= window.until {
            break;
        }
        let result = worker.op().await;
        let end = Instant::now();
        done.fetch_add(1, Ordering::Relaxed);
        let counted = start >= window.from && end <= window.until;
        match result {
            Ok(Outcome::Done) if counted => {
                tally.ops += 1;
                let us = end.duration_since(start).as_micros() as u64;
                tally.latency_us.saturating_record(us.max(1));
            }
            Ok(Outcome::Refused) if counted => tally.refused += 1,
            Ok(_) => {}
            Err(e) => {
                tally.error(&e.code);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    (tally, worker)
}

/// A progress bar on stderr; indicatif draws nothing when stderr is not a terminal.
pub(crate) fn bar(quiet: bool, len: u64, prefix: String) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(prefix);
    bar
}

async fn measure(plan: Plan, args: &BenchArgs) -> Result<Summary, BenchError> {
    let plan = Arc::new(plan);
    driver::prepare(&plan).await?;
    // Connections and per-client setup happen before the clock starts.
    let workers = futures::future::try_join_all(
        (0..plan.clients).map(|client| driver::worker(Arc::clone(&plan), client)),
    )
    .await?;
    let start = Instant::now();
    let window = Window {
        from: start + args.warmup,
        until: start + args.warmup + args.duration,
    };
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(client_loop(w, window, Arc::clone(&done))))
        .collect();

    let bar = bar(
        args.quiet,
        (args.warmup + args.duration).as_millis() as u64,
        format!(
            "{} {} x{}",
            plan.target.name(),
            plan.job.name(),
            plan.clients
        ),
    );
    let mut cpu_from = None;
    let (mut last_ops, mut last_at) = (0, start);
    loop {
        let now = Instant::now();
        if cpu_from.is_none() && now >= window.from {
            cpu_from = Some(CpuSample::now(args.server_pid));
        }
        if now >= window.until {
            break;
        }
        let ops = done.load(Ordering::Relaxed);
        let rate = (ops - last_ops) as f64 / now.duration_since(last_at).as_secs_f64().max(1e-3);
        (last_ops, last_at) = (ops, now);
        let phase = if now < window.from {
            "warm-up"
        } else {
            "measuring"
        };
        bar.set_position(now.duration_since(start).as_millis() as u64);
        bar.set_message(format!("{phase}, {} ops/s", crate::report::count(rate)));
        let edge = if cpu_from.is_none() {
            window.from
        } else {
            window.until
        };
        let wake = (now + Duration::from_millis(250)).min(edge);
        tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
    }
    let cpu_until = CpuSample::now(args.server_pid);
    bar.finish_and_clear();

    // An operation in flight at the end may still be waiting (a queued acquire): give it
    // its wait and then some before calling it stuck.
    let deadline = Instant::now() + Duration::from_millis(plan.wait_ms) + Duration::from_secs(10);
    let mut total = Tally::new();
    let mut finished = Vec::new();
    for task in &mut tasks {
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), &mut *task).await {
            Ok(Ok((tally, worker))) => {
                total.merge(tally);
                finished.push(worker);
            }
            Ok(Err(_)) => total.error("client_panicked"),
            Err(_) => {
                task.abort();
                total.error("client_stuck");
            }
        }
    }
    let cleanup = futures::future::join_all(finished.iter_mut().map(|w| w.finish()));
    let _ = tokio::time::timeout(Duration::from_secs(30), cleanup).await;

    let cpu_from = cpu_from.unwrap_or(cpu_until);
    let (bench_cpu_pct, server_cpu_pct) = cpu_from.percent_until(&cpu_until);
    let server_switches_per_op = cpu_from
        .switches_until(&cpu_until)
        .filter(|_| total.ops > 0)
        .map(|n| n as f64 / total.ops as f64);
    let secs = args.duration.as_secs_f64().max(1e-9);
    let h = &total.latency_us;
    Ok(Summary {
        target: plan.target,
        variant: args.variant.clone(),
        job: plan.job,
        clients: plan.clients,
        duration_s: secs,
        ops: total.ops,
        ops_per_s: total.ops as f64 / secs,
        refused: total.refused,
        refused_per_s: total.refused as f64 / secs,
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
        mean_us: h.mean(),
        errors: total.errors,
        bench_cpu_pct,
        server_cpu_pct,
        server_switches_per_op,
        value_size: plan.value.len(),
    })
}

//! One run of `palisade verify`: start the deployment, the proxies and the workers; let
//! the nemesis loose for `--time` seconds; heal; collect; judge.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use palisade_client::Client;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::args::{FaultKind, Target, VerifyArgs, Workload};
use crate::clock::RunClock;
use crate::deploy::{Deployment, EmbeddedServer, UnfencedControl};
use crate::judge::{judge, Collected};
use crate::nemesis::Nemesis;
use crate::procs::{reap, WorkerProc, WorkerSpec};
use crate::proxy::{Link, Proxy};
use crate::{final_read, Outcome, VerifyError};

/// How long workers get to finish their last iteration once the run is over: a queued
/// acquire (3 TTL + margin) plus a request timeout, with room to spare.
const REAP_WINDOW: Duration = Duration::from_secs(30);
/// Lets the server finish requests it had already read when the proxies closed.
const SETTLE: Duration = Duration::from_millis(300);

/// Runs `palisade verify` as described by `args`.
pub async fn run(args: VerifyArgs) -> Result<Outcome, VerifyError> {
    let kinds = FaultKind::parse_list(&args.faults)?;
    if args.workers == 0 || args.workers > 64 {
        return Err(VerifyError::Config("--workers must be 1..=64".into()));
    }
    if !(50..=60_000).contains(&args.ttl_ms) {
        return Err(VerifyError::Config("--ttl-ms must be 50..=60000".into()));
    }
    if args.time == 0 {
        return Err(VerifyError::Config("--time must be at least 1".into()));
    }
    if args.target == Target::UnfencedControl && args.workload != Workload::LockSet {
        return Err(VerifyError::Config(
            "the unfenced control runs the lock-set workload only".into(),
        ));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    println!(
        "palisade verify: {} on {}, {} workers, {} s, faults [{}], seed {seed}",
        args.workload.as_str(),
        target_name(args.target),
        args.workers,
        args.time,
        kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    tokio::select! {
        outcome = run_seeded(&args, kinds, seed) => outcome,
        _ = tokio::signal::ctrl_c() => Err(VerifyError::Interrupted),
    }
}

pub(crate) fn target_name(target: Target) -> &'static str {
    match target {
        Target::Embedded => "embedded",
        Target::UnfencedControl => "unfenced-control",
    }
}

async fn run_seeded(
    args: &VerifyArgs,
    kinds: Vec<FaultKind>,
    seed: u64,
) -> Result<Outcome, VerifyError> {
    let out = &args.out;
    let history_dir = out.join("workers");
    if history_dir.exists() {
        std::fs::remove_dir_all(&history_dir)
            .map_err(|e| VerifyError::io(format!("cannot clear {}", history_dir.display()), e))?;
    }
    std::fs::create_dir_all(&history_dir)
        .map_err(|e| VerifyError::io(format!("cannot create {}", history_dir.display()), e))?;
    let exe = std::env::current_exe()
        .map_err(|e| VerifyError::io("cannot find the palisade executable", e))?;
    let data = tempfile::Builder::new()
        .prefix("palisade-verify-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create a temporary data directory", e))?;
    let log = out.join("server.log");
    let _ = std::fs::remove_file(&log);
    let mut deployment: Box<dyn Deployment> = match args.target {
        Target::Embedded => Box::new(EmbeddedServer::start(&exe, data.path(), &log).await?),
        Target::UnfencedControl => Box::new(UnfencedControl::start(&exe, data.path(), &log).await?),
    };
    let result = drive(args, kinds, seed, deployment.as_mut(), &exe, &history_dir).await;
    deployment.stop().await;
    let collected = result?;
    judge(args, seed, collected, out).await
}

/// Everything between "deployment up" and "deployment about to stop".
async fn drive(
    args: &VerifyArgs,
    kinds: Vec<FaultKind>,
    seed: u64,
    deployment: &mut dyn Deployment,
    exe: &Path,
    history_dir: &Path,
) -> Result<Collected, VerifyError> {
    let lock_addr = deployment.lock_addr();
    let store_addr = deployment.store_addr();
    let mut links: Vec<Arc<Link>> = Vec::new();
    let mut proxies: Vec<Proxy> = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..args.workers {
        let link = Proxy::new_link();
        let lock_proxy = Proxy::start(lock_addr, link.clone()).await?;
        let lock_url = format!("http://{}", lock_proxy.addr());
        let store_url = if store_addr == lock_addr {
            lock_url.clone()
        } else {
            let store_proxy = Proxy::start(store_addr, link.clone()).await?;
            let url = format!("http://{}", store_proxy.addr());
            proxies.push(store_proxy);
            url
        };
        proxies.push(lock_proxy);
        links.push(link);
        urls.push((lock_url, store_url));
    }

    let clock = RunClock::start();
    let end_us = args.time.saturating_mul(1_000_000);
    let spec = WorkerSpec {
        exe,
        workload: args.workload.as_str(),
        ttl_ms: args.ttl_ms,
        seed,
        clock_origin_ns: clock.origin_ns(),
        stop_at_us: end_us,
        history_dir,
    };
    let mut workers = Vec::new();
    for (i, (lock_url, store_url)) in urls.iter().enumerate() {
        workers.push(WorkerProc::spawn(&spec, i as u64 + 1, lock_url, store_url)?);
    }

    let progress = progress_bar(args.time);
    let ticker = {
        let bar = progress.clone();
        tokio::spawn(async move {
            loop {
                bar.set_position(clock.now_us() / 1_000_000);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let probe = Client::new(&format!("http://{lock_addr}"))
        .map_err(|e| VerifyError::Internal(format!("probe client: {e}")))?;
    let mut nemesis = Nemesis {
        rng: StdRng::seed_from_u64(seed),
        kinds,
        ttl: Duration::from_millis(args.ttl_ms),
        clock,
        deployment,
        workers: &mut workers,
        links: &links,
        probe,
        locks: args.workload.locks(),
        progress: &progress,
        faults: Vec::new(),
        restarts: Vec::new(),
    };
    let nemesis_result = nemesis.run(end_us).await;
    let (faults, restarts) = (
        std::mem::take(&mut nemesis.faults),
        std::mem::take(&mut nemesis.restarts),
    );
    // Heal everything, whatever happened, so the workers can finish.
    for link in &links {
        link.heal();
    }
    let restarted = deployment.restart().await;
    progress.set_message("workers finishing");
    let reaped = reap(&mut workers, REAP_WINDOW).await;
    ticker.abort();
    progress.finish_and_clear();
    nemesis_result?;
    restarted?;
    for mut proxy in proxies {
        proxy.shutdown();
    }
    tokio::time::sleep(SETTLE).await;

    let store = Client::new(&format!("http://{store_addr}"))
        .map_err(|e| VerifyError::Internal(format!("store client: {e}")))?;
    let final_state = final_read::read(&store, args.workload.locks()).await?;
    Ok(Collected {
        history_files: workers.iter().map(|w| w.history.clone()).collect(),
        faults,
        restarts,
        final_state,
        reaped,
        deployment: deployment.name(),
    })
}

fn progress_bar(secs: u64) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(secs);
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} s  {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

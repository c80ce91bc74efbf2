//! One run of `palisade verify`: start the deployment, the proxies and the workers; let
//! the nemesis loose for `--time` seconds; heal; collect; judge.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use palisade_client::Client;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::args::{FaultKind, GateLang, LockProtocol, Target, Topology, VerifyArgs, Workload};
use crate::auth::AuthSetup;
use crate::clock::RunClock;
use crate::deploy::toy::Check;
use crate::deploy::{
    gate, Deployment, Durability, EmbeddedServer, Etcd3, EtcdLockControl, GateDeployment,
    GateSetup, UnfencedControl,
};
use crate::judge::{judge, Collected};
use crate::nemesis::{Nemesis, Probe};
use crate::procs::{reap, WorkerProc, WorkerSpec};
use crate::proxy::{Link, Proxy};
use crate::worker::EtcdGateway;
use crate::{final_read, Outcome, VerifyError};

/// How long workers get to finish their last iteration once the run is over: a queued
/// acquire (3 TTL + margin) plus a request timeout, with room to spare.
const REAP_WINDOW: Duration = Duration::from_secs(30);
/// Lets the server finish requests it had already read when the proxies closed.
const SETTLE: Duration = Duration::from_millis(300);

/// The run's settings once the flags are checked.
pub(crate) struct Plan {
    pub topology: Topology,
    pub kinds: Vec<FaultKind>,
    pub seed: u64,
}

/// The deployment-level faults of each (topology, target); [`Deployment::faults`] of the
/// deployment started for it says the same (checked at start); the gate targets' are
/// [`gate::faults`].
fn supported_faults(topology: Topology, target: Target) -> &'static [FaultKind] {
    use FaultKind::*;
    match (topology, target) {
        (Topology::Embedded, Target::Palisade) => &[Kill, Disk],
        (Topology::Embedded, Target::PostgresGate | Target::RedisGate | Target::SqliteGate) => {
            gate::faults(target)
        }
        (Topology::Embedded, _) => &[Kill],
        (Topology::Etcd3, Target::Palisade) => &[Kill, EtcdKill, EtcdPause, NodePartition],
        (Topology::Etcd3, _) => &[EtcdKill, EtcdPause],
    }
}

/// Checks the flags; the topology, the fault kinds and the seed to run with.
pub(crate) fn plan(args: &VerifyArgs) -> Result<Plan, VerifyError> {
    if args.workers == 0 || args.workers > 64 {
        return Err(VerifyError::Config("--workers must be 1..=64".into()));
    }
    if !(50..=60_000).contains(&args.ttl_ms) {
        return Err(VerifyError::Config("--ttl-ms must be 50..=60000".into()));
    }
    if args.time == 0 {
        return Err(VerifyError::Config("--time must be at least 1".into()));
    }
    if args.target.is_gate() {
        if !matches!(args.workload, Workload::LockSet | Workload::Register) {
            return Err(VerifyError::Config(format!(
                "--target {} runs the lock-set and register workloads (tokens are \
                 Palisade's own: run it with --target palisade)",
                args.target.as_str()
            )));
        }
    } else if args.target != Target::Palisade && args.workload != Workload::LockSet {
        return Err(VerifyError::Config(format!(
            "the {} control runs the lock-set workload only",
            args.target.as_str()
        )));
    }
    if args.unsafe_db
        && !matches!(
            args.target,
            Target::PostgresGate | Target::RedisGate | Target::SqliteGate
        )
    {
        return Err(VerifyError::Config(
            "--unsafe-db applies to the gate targets only (postgres-gate, redis-gate, \
             sqlite-gate)"
                .into(),
        ));
    }
    if args.gate_lang == GateLang::Python
        && !matches!(args.target, Target::PostgresGate | Target::SqliteGate)
    {
        return Err(VerifyError::Config(format!(
            "--gate-lang python runs postgres-gate and sqlite-gate (the Python package has \
             gates for PostgreSQL, MySQL and SQLite), not {}",
            args.target.as_str()
        )));
    }
    let topology = args.topology.unwrap_or(args.target.default_topology());
    if topology != args.target.default_topology() && args.target != Target::Palisade {
        return Err(VerifyError::Config(format!(
            "--target {} runs on --topology {} only",
            args.target.as_str(),
            args.target.default_topology().as_str()
        )));
    }
    if topology == Topology::Etcd3 && args.ttl_ms < 1000 {
        return Err(VerifyError::Config(
            "etcd leases count whole seconds: use --ttl-ms 1000 or more with etcd3".into(),
        ));
    }
    let kinds = FaultKind::parse_list(&args.faults, supported_faults(topology, args.target))?;
    if args.unsafe_db
        && args.target == Target::SqliteGate
        && !kinds.contains(&FaultKind::DbPowerLoss)
    {
        return Err(VerifyError::Config(
            "--unsafe-db for sqlite-gate needs db-power-loss among the faults: SQLite's unsafe \
             settings (synchronous=OFF, or NORMAL in WAL mode) lose commits only when the \
             machine goes down, which a process crash cannot show"
                .into(),
        ));
    }
    if kinds.contains(&FaultKind::DbFailover) && kinds.contains(&FaultKind::DbPowerLoss) {
        return Err(VerifyError::Config(
            "db-failover and db-power-loss do not run together: the replica's files are not \
             on the lazy file system, so a power loss after a failover would lose nothing"
                .into(),
        ));
    }
    Ok(Plan {
        topology,
        kinds,
        seed: args.seed.unwrap_or_else(rand::random),
    })
}

/// Runs `palisade verify` as described by `args`.
pub async fn run(args: VerifyArgs) -> Result<Outcome, VerifyError> {
    let plan = plan(&args)?;
    println!(
        "palisade verify: {} on {} ({}{}), {} workers, {} s, faults [{}], seed {}",
        args.workload.as_str(),
        plan.topology.as_str(),
        args.target.as_str(),
        if args.auth {
            ", auth file: a principal per worker"
        } else {
            ""
        },
        args.workers,
        args.time,
        plan.kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(","),
        plan.seed
    );
    println!("palisade verify: artefacts in {}", args.out.display());
    tokio::select! {
        outcome = run_seeded(&args, plan) => outcome,
        _ = tokio::signal::ctrl_c() => Err(VerifyError::Interrupted),
    }
}

async fn start(
    args: &VerifyArgs,
    plan: &Plan,
    exe: &Path,
    data: &Path,
    out: &Path,
    auth: Option<&AuthSetup>,
) -> Result<Box<dyn Deployment>, VerifyError> {
    let log = out.join("server.log");
    let serve_flags: Vec<OsString> = match auth {
        Some(auth) => vec!["--auth-file".into(), auth.file.clone().into_os_string()],
        None => Vec::new(),
    };
    let deployment: Box<dyn Deployment> = match (plan.topology, args.target) {
        (Topology::Embedded, Target::Palisade) => {
            Box::new(EmbeddedServer::start_with(exe, data, &log, serve_flags).await?)
        }
        (Topology::Embedded, target) if target.is_gate() => {
            let setup = GateSetup {
                target,
                lang: args.gate_lang,
                python: args.python.clone(),
                durability: if args.unsafe_db {
                    Durability::Unsafe
                } else {
                    Durability::Safe
                },
                replica: plan.kinds.contains(&FaultKind::DbFailover),
                lazy_disk: plan.kinds.contains(&FaultKind::DbPowerLoss),
            };
            Box::new(GateDeployment::start(setup, exe, data, out).await?)
        }
        (Topology::Embedded, _) => Box::new(UnfencedControl::start(exe, data, &log).await?),
        (Topology::Etcd3, Target::Palisade) => {
            Box::new(Etcd3::start_with(exe, data, out, serve_flags).await?)
        }
        (Topology::Etcd3, Target::EtcdLockFenced) => {
            Box::new(EtcdLockControl::start(data, out, Check::Epoch).await?)
        }
        (Topology::Etcd3, _) => Box::new(EtcdLockControl::start(data, out, Check::Nothing).await?),
    };
    if deployment.faults() != supported_faults(plan.topology, args.target) {
        return Err(VerifyError::Internal(format!(
            "{} supports other faults than planned",
            deployment.name()
        )));
    }
    Ok(deployment)
}

async fn run_seeded(args: &VerifyArgs, plan: Plan) -> Result<Outcome, VerifyError> {
    let out = &args.out;
    let history_dir = out.join("workers");
    if history_dir.exists() {
        std::fs::remove_dir_all(&history_dir)
            .map_err(|e| VerifyError::io(format!("cannot clear {}", history_dir.display()), e))?;
    }
    std::fs::create_dir_all(&history_dir)
        .map_err(|e| VerifyError::io(format!("cannot create {}", history_dir.display()), e))?;
    for old in [
        "server.log",
        "postgres.log",
        "redis.log",
        "etcd.log",
        "node0.log",
        "node1.log",
        "node2.log",
    ] {
        let _ = std::fs::remove_file(out.join(old));
    }
    let exe = std::env::current_exe()
        .map_err(|e| VerifyError::io("cannot find the palisade executable", e))?;
    let data = tempfile::Builder::new()
        .prefix("palisade-verify-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create a temporary data directory", e))?;
    // The auth file lives beside the data directory, not in it: `serve` refuses a data
    // directory that holds anything but its own files.
    let auth_dir = tempfile::Builder::new()
        .prefix("palisade-verify-auth-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create a temporary directory", e))?;
    let auth = if args.auth {
        if args.target != Target::Palisade {
            return Err(VerifyError::Config(
                "--auth applies to --target palisade only".into(),
            ));
        }
        Some(AuthSetup::write(auth_dir.path(), args.workers)?)
    } else {
        None
    };
    let mut deployment = start(args, &plan, &exe, data.path(), out, auth.as_ref()).await?;
    let result = drive(
        args,
        &plan,
        deployment.as_mut(),
        &exe,
        &history_dir,
        auth.as_ref(),
    )
    .await;
    deployment.stop().await;
    let collected = result?;
    judge(args, &plan, collected, out).await
}

/// Everything between "deployment up" and "deployment about to stop".
async fn drive(
    args: &VerifyArgs,
    plan: &Plan,
    deployment: &mut dyn Deployment,
    exe: &Path,
    history_dir: &Path,
    auth: Option<&AuthSetup>,
) -> Result<Collected, VerifyError> {
    // The harness's own calls (probes, the final read) go as the admin.
    let harness_client = |url: &str| {
        let mut builder = Client::builder(url);
        if let Some(auth) = auth {
            builder = builder.bearer_key(auth.admin_key.clone());
        }
        builder.build()
    };
    let lock_addrs = deployment.lock_addrs();
    let store_addrs = deployment.store_addrs();
    let mut links: Vec<Arc<Link>> = Vec::new();
    let mut proxies: Vec<Proxy> = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..args.workers {
        // One link per worker: its faults hit every one of its proxies at once.
        let link = Proxy::new_link();
        let mut lock_urls = Vec::new();
        let mut store_urls = Vec::new();
        for addr in &lock_addrs {
            let proxy = Proxy::start(*addr, link.clone()).await?;
            lock_urls.push(format!("http://{}", proxy.addr()));
            if store_addrs == lock_addrs {
                store_urls.push(format!("http://{}", proxy.addr()));
            }
            proxies.push(proxy);
        }
        if store_addrs != lock_addrs {
            for addr in &store_addrs {
                let proxy = Proxy::start(*addr, link.clone()).await?;
                store_urls.push(format!("http://{}", proxy.addr()));
                proxies.push(proxy);
            }
        }
        links.push(link);
        urls.push((lock_urls, store_urls));
    }

    let clock = RunClock::start();
    let end_us = args.time.saturating_mul(1_000_000);
    let lock_protocol = deployment.lock_protocol();
    let spec = WorkerSpec {
        exe,
        workload: args.workload.as_str(),
        lock_protocol: match lock_protocol {
            LockProtocol::Palisade => "palisade",
            LockProtocol::Etcd => "etcd",
        },
        ttl_ms: args.ttl_ms,
        seed: plan.seed,
        clock_origin_ns: clock.origin_ns(),
        stop_at_us: end_us,
        history_dir,
        keys: auth.map(|a| a.worker_keys.as_slice()),
    };
    let mut workers = Vec::new();
    for (i, (lock_urls, store_urls)) in urls.iter().enumerate() {
        workers.push(WorkerProc::spawn(
            &spec,
            i as u64 + 1,
            lock_urls,
            store_urls,
        )?);
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
    let direct: Vec<String> = lock_addrs.iter().map(|a| format!("http://{a}")).collect();
    let probe = match lock_protocol {
        LockProtocol::Palisade => Probe::Palisade(
            direct
                .iter()
                .map(|url| harness_client(url))
                .collect::<Result<_, _>>()
                .map_err(|e| VerifyError::Internal(format!("probe client: {e}")))?,
        ),
        LockProtocol::Etcd => Probe::Etcd(
            EtcdGateway::new(direct, 0)
                .map_err(|e| VerifyError::Internal(format!("probe client: {e}")))?,
        ),
    };
    let mut nemesis = Nemesis {
        rng: StdRng::seed_from_u64(plan.seed),
        kinds: plan.kinds.clone(),
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
    let healed = deployment.heal().await;
    progress.set_message("workers finishing");
    let reaped = reap(&mut workers, REAP_WINDOW).await;
    ticker.abort();
    progress.finish_and_clear();
    nemesis_result?;
    healed?;
    for mut proxy in proxies {
        proxy.shutdown();
    }
    tokio::time::sleep(SETTLE).await;

    let stores = store_addrs
        .iter()
        .map(|a| harness_client(&format!("http://{a}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| VerifyError::Internal(format!("store client: {e}")))?;
    let final_state = final_read::read(&stores, args.workload.locks()).await?;
    Ok(Collected {
        history_files: workers.iter().map(|w| w.history.clone()).collect(),
        faults,
        restarts,
        final_state,
        reaped,
        description: deployment.describe(),
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

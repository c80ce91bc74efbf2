//! `palisade demo`: the stale-leader story, told with real processes.
//!
//! 1. A server starts on a free port over a temporary data directory.
//! 2. Worker A acquires the lock (epoch 1), writes, and enters its critical section.
//! 3. The demo freezes A with SIGSTOP, as a long GC pause or VM stall would. A's
//!    keepalive task freezes with it, so its lease expires on the server.
//! 4. Worker B acquires (epoch 2), writes, releases and exits.
//! 5. The demo thaws A with SIGCONT. A still believes it holds the lock and sends its
//!    late write with its epoch-1 token. The store has seen epoch 2 and refuses it:
//!    `stale_token`, high-water 2.
//! 6. The stored value is B's and the high-water mark is 2.
//!
//! The demo checks every step and fails, naming the step, if anything differs. What it
//! does not show: had A's late write reached the store *before* B's first write, it
//! would have been accepted, because acquiring notifies no resource (S10). B would
//! close that window by calling the fence barrier before working.

mod event;
mod procs;
mod worker;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use clap::Args;
use palisade_client::Client;

use event::{Event, Timeline};
use nix::sys::signal::Signal;
use procs::{signal, spawn_worker, start_server, stop_server, tail};
pub use worker::{run_worker, WorkerArgs};

/// Flags of `palisade demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Lease TTL of the workers in milliseconds. A is frozen for longer than this.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Keep the temporary data directory (database, key, server log) and print its path.
    #[arg(long)]
    pub keep: bool,
}

const LOCK: &str = "demo";
const KEY: &str = "record";
/// How long A stays in its critical section between its two writes. The demo freezes it
/// right after the first write is reported, well inside this window.
const PAUSE_POINT_MS: u64 = 400;
/// Bound on waiting for any single worker report.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the story; `Ok` only if every step happened as expected.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    ensure!(
        args.ttl_ms >= 50,
        "--ttl-ms must be at least 50 (the server's minimum)"
    );
    let exe = std::env::current_exe().context("cannot find the palisade executable")?;
    let dir = tempfile::Builder::new()
        .prefix("palisade-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let log = dir.path().join("server.log");
    let mut timeline = Timeline::new();
    let outcome = tokio::select! {
        result = story(&exe, dir.path(), &log, args.ttl_ms, &mut timeline) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    // Children were killed when `story` returned (kill_on_drop); now report.
    timeline.print();
    match &outcome {
        Ok(()) => println!("{}", EXPLANATION.trim()),
        Err(_) => {
            let server_log = tail(&log, 20);
            if !server_log.is_empty() {
                eprintln!("last lines of the server log:\n{server_log}");
            }
        }
    }
    if args.keep {
        let kept = dir.keep();
        println!("\ndata kept in {}", kept.display());
    }
    outcome
}

const EXPLANATION: &str = "
What happened: A held the lock with epoch 1 and was frozen in the middle of its critical
section. Its keepalive froze with it, so the lease expired and B was granted epoch 2. B's
write carried epoch 2, so the store raised its high-water mark to 2. When A woke up it
still believed it was the leader and sent its late write with its epoch-1 token; the store
compared 1 with its high-water mark 2, inside the same transaction as the write, and
refused it (stale_token). The record holds B's value.

What fencing does not do: it does not cancel requests already in flight. Had A's late
write reached the store before B's first write, it would have been accepted, since
acquiring a lock notifies no resource. A new leader that must shut older writes out
before it starts calls the fence barrier (POST /v1/fences/{lock}) first.";

/// Every step of the story, in order. Returning (on success or error) drops the children,
/// which kills any that are still running.
async fn story(
    exe: &Path,
    root: &Path,
    log: &Path,
    ttl_ms: u64,
    timeline: &mut Timeline,
) -> anyhow::Result<()> {
    let data_dir = root.join("data");
    std::fs::create_dir_all(&data_dir).context("cannot create the data directory")?;
    let (server, url) = start_server(exe, &data_dir, log)
        .await
        .context("step \"start server\"")?;
    timeline.note("start server", "ok", format!("listening on {url}"));
    let client = Client::new(&url)?;
    client
        .health()
        .await
        .context("step \"start server\": health check")?;

    let worker_args = |name: &str, pause: Option<u64>| {
        let mut v: Vec<String> = [
            "--server", &url, "--name", name, "--lock", LOCK, "--key", KEY,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(["--ttl-ms".into(), ttl_ms.to_string()]);
        if let Some(p) = pause {
            v.extend(["--pause-point-ms".into(), p.to_string()]);
        }
        v
    };

    // A: acquire and first write.
    let mut a = spawn_worker(exe, "A", &worker_args("A", Some(PAUSE_POINT_MS)))?;
    let ev = a
        .expect("acquire", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    expect_ok(&ev, Some(1))?;
    let ev = a
        .expect("first write", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    expect_ok(&ev, Some(1))?;
    // A reports entering its pause right after the write; freeze it there, long before
    // the pause ends.
    let ev = a
        .expect("critical", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    expect_ok(&ev, Some(1))?;

    // Freeze A inside its critical section.
    signal(&a.child, Signal::SIGSTOP).context("step \"freeze A\"")?;
    timeline.note(
        "freeze A",
        "ok",
        "SIGSTOP: A and its keepalive are frozen (a long GC pause)",
    );

    // Let A's lease run out, then confirm the server sees the lock free.
    let margin = Duration::from_millis((ttl_ms / 2).max(250));
    tokio::time::sleep(Duration::from_millis(ttl_ms) + margin).await;
    wait_until_free(&client).await?;
    timeline.note("lease check", "ok", "server: A's lease expired, lock free");

    // B: the new leader.
    let mut b = spawn_worker(exe, "B", &worker_args("B", None))?;
    let ev = b
        .expect("acquire", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    expect_ok(&ev, Some(2))?;
    let ev = b
        .expect("write", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    expect_ok(&ev, Some(2))?;
    b.finish(STEP_TIMEOUT, |e| timeline.push(e)).await?;

    // Thaw A: its late write must be fenced off.
    signal(&a.child, Signal::SIGCONT).context("step \"thaw A\"")?;
    timeline.note(
        "thaw A",
        "ok",
        "SIGCONT: A resumes, still believing it is the leader",
    );
    let ev = a
        .expect("late write", STEP_TIMEOUT, |e| timeline.push(e))
        .await?;
    if ev.outcome != "stale_token" || ev.high_water != Some(2) || ev.epoch != Some(1) {
        bail!(
            "step \"A late write\": expected stale_token with high_water 2 for epoch 1, got {}",
            ev.describe()
        );
    }
    a.finish(STEP_TIMEOUT, |e| timeline.push(e)).await?;

    // The resource's view is the only one that counts.
    let entry = client
        .kv(LOCK)
        .get(KEY)
        .await
        .context("step \"read record\"")?;
    let entry = entry.context("step \"read record\": the record is missing")?;
    let value = String::from_utf8_lossy(&entry.value).into_owned();
    timeline.note(
        "read record",
        "ok",
        format!("{value:?}, written by epoch {}", entry.epoch),
    );
    ensure!(
        value == "B: new leader write" && entry.epoch == 2,
        "step \"read record\": expected B's value from epoch 2, got {value:?} from epoch {}",
        entry.epoch
    );
    let fence = client
        .high_water(LOCK)
        .await
        .context("step \"read high-water\"")?;
    timeline.note(
        "read fence",
        "ok",
        format!("high_water {}", fence.high_water),
    );
    ensure!(
        fence.high_water == 2,
        "step \"read high-water\": expected 2, got {}",
        fence.high_water
    );

    stop_server(server).await;
    timeline.note("stop server", "ok", "SIGTERM");
    Ok(())
}

fn expect_ok(ev: &Event, epoch: Option<u64>) -> anyhow::Result<()> {
    if !ev.is_ok() || ev.epoch != epoch {
        let want = epoch.map_or("-".into(), |e| e.to_string());
        bail!(
            "step \"{} {}\": expected ok with epoch {want}, got {}",
            ev.worker,
            ev.step,
            ev.describe()
        );
    }
    Ok(())
}

/// Polls the lock until the server reports it free: A's lease has expired.
async fn wait_until_free(client: &Client) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let status = client
            .lock_status(LOCK)
            .await
            .context("step \"lease check\"")?;
        if status.holder.is_none() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "step \"lease check\": A's lease did not expire (holder {:?}, {:?} ms left)",
                status.holder,
                status.remaining_ms
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

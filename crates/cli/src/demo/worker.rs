//! One demo worker process (`palisade demo-worker`, started by `palisade demo`).
//!
//! A worker is an ordinary, well-behaved holder: it acquires with a [`LeaseGuard`]
//! (background keepalive) and writes with its token. It reports every step as a JSON
//! [`Event`] line on stdout and judges nothing; the parent decides whether the story went
//! as expected. Two roles:
//! - with `--pause-point-ms` (the old leader): write, pause inside the critical section,
//!   write again with the same token. The parent freezes the process during the pause.
//! - without it (the new leader): one write, then release.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use palisade_client::{AcquireOptions, Client, Error, LeaseGuard};

use super::event::Event;

/// Flags of `palisade demo-worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Base URL of the server.
    #[arg(long)]
    pub server: String,
    /// Worker name, used in events, in the holder name and in the values written.
    #[arg(long)]
    pub name: String,
    /// Lock (and namespace) to use.
    #[arg(long, default_value = "demo")]
    pub lock: String,
    /// Key to write.
    #[arg(long, default_value = "record")]
    pub key: String,
    /// Lease TTL in milliseconds; the keepalive renews every third of it.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Old-leader role: after the first write, stay this long inside the critical
    /// section, then write again. Omit for the new-leader role (one write, release).
    #[arg(long)]
    pub pause_point_ms: Option<u64>,
    /// How long to queue for the lock if it is still held.
    #[arg(long, default_value_t = 10_000)]
    pub wait_ms: u64,
}

fn emit(event: Event) {
    // One line per event; stdout is line-buffered, so the parent sees it at once.
    match serde_json::to_string(&event) {
        Ok(line) => println!("{line}"),
        Err(e) => eprintln!("worker: cannot encode event: {e}"),
    }
}

/// An event describing a failed call: its code, plus the high-water mark if stale.
fn failure(name: &str, epoch: u64, step: &str, err: &Error) -> Event {
    match err {
        Error::Stale { high_water, epoch } => {
            let mut event = Event::new(name, Some(*epoch), step, err.code()).detail(format!(
                "epoch {epoch} < high-water {high_water}: refused, nothing written"
            ));
            event.high_water = Some(*high_water);
            event
        }
        _ => Event::new(name, Some(epoch), step, err.code()).detail(err.to_string()),
    }
}

/// Writes `value` with the guard's token and reports the outcome as `step`.
async fn write(args: &WorkerArgs, guard: &LeaseGuard, step: &str, value: String) -> bool {
    let kv = guard.kv();
    let mut result = kv.put(&args.key, value.clone()).await;
    let mut retried = "";
    if matches!(result, Err(Error::Transport(_))) {
        // After a long freeze the pooled connection may be dead; one retry is harmless
        // here (the write is fenced, and the outcome is what the demo is about).
        result = kv.put(&args.key, value.clone()).await;
        retried = ", after one transport retry";
    }
    let event = match &result {
        Ok(w) => Event::new(&args.name, Some(guard.epoch()), step, "ok").detail(format!(
            "{value:?} stored at revision {}{retried}",
            w.revision
        )),
        Err(e) => failure(&args.name, guard.epoch(), step, e),
    };
    emit(event);
    result.is_ok()
}

/// Runs one worker and exits 0 once every step has been reported.
pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.server)?;
    let holder = format!("demo-{}-{}", args.name, std::process::id());
    let opts = AcquireOptions {
        ttl: Duration::from_millis(args.ttl_ms),
        wait: Some(Duration::from_millis(args.wait_ms)),
        ..AcquireOptions::default()
    };
    let guard = match client.acquire(&args.lock, &holder, opts).await {
        Ok(guard) => guard,
        Err(e) => {
            emit(Event::new(&args.name, None, "acquire", e.code()).detail(e.to_string()));
            bail!("worker {} could not acquire {}: {e}", args.name, args.lock);
        }
    };
    let epoch = guard.epoch();
    emit(
        Event::new(&args.name, Some(epoch), "acquire", "ok")
            .detail(format!("ttl {} ms", args.ttl_ms)),
    );

    match args.pause_point_ms {
        Some(pause_ms) => {
            let value = format!("{}: first write", args.name);
            if !write(&args, &guard, "first write", value).await {
                bail!("worker {}: first write failed", args.name);
            }
            emit(
                Event::new(&args.name, Some(epoch), "critical", "ok").detail(format!(
                    "working for {pause_ms} ms; believes it holds the lock"
                )),
            );
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            let value = format!("{}: late write", args.name);
            write(&args, &guard, "late write", value).await;
            // Only now, after the fact, does the holder's own view catch up.
            let view = if guard.is_lost() { "lost" } else { "held" };
            emit(
                Event::new(&args.name, Some(epoch), "lease view", view)
                    .detail("what the keepalive task believes after waking"),
            );
        }
        None => {
            let value = format!("{}: new leader write", args.name);
            if !write(&args, &guard, "write", value).await {
                bail!("worker {}: write failed", args.name);
            }
            let event = match guard.release().await {
                Ok(()) => Event::new(&args.name, Some(epoch), "release", "ok"),
                Err(e) => failure(&args.name, epoch, "release", &e),
            };
            emit(event);
        }
    }
    Ok(())
}

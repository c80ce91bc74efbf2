//! The audit log (`palisade serve --audit-log FILE`): one JSON object per line for every
//! failed authentication, permission denial, admin action, lease released by someone
//! other than its owner, and stale-token rejection at the gate.
//!
//! ```json
//! {"ts":"2026-12-01T10:00:00.123Z","event":"stale_token","principal":"billing","lock":"orders","epoch":1,"high_water":2,"route":"/v1/kv/orders/a"}
//! ```
//!
//! Writing never holds up a request: events go through a bounded queue to one writer
//! task, which appends and flushes them in batches. What an outsider can make it write is
//! bounded too: failures (`auth_failed`, `permission_denied`, `stale_token`) pass a rate
//! limit ([`FAILURES_PER_SECOND`], with a burst) and the ones over it are counted in one
//! `suppressed` line per second; the file is rotated to `FILE.1` when it reaches its size
//! limit, so it never takes more than twice that on disk.
//!
//! ## What it does not do
//! - It is not fsync'd per line: a crash can lose the last lines. It is a record for
//!   people, not part of any guarantee.
//! - A full queue drops events (counted, reported in the next `suppressed` line) rather
//!   than slowing the server.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::sync::mpsc;

/// Failure events written per second at most, after a burst of [`FAILURE_BURST`].
pub const FAILURES_PER_SECOND: u32 = 100;
/// Failure events that may be written at once before the rate applies.
pub const FAILURE_BURST: u32 = 1_000;
/// Events waiting for the writer before new ones are dropped.
const QUEUE: usize = 4_096;

/// One line of the audit log.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct AuditEvent {
    pub event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_water: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuditEvent {
    pub fn new(event: &'static str) -> Self {
        AuditEvent {
            event,
            ..Default::default()
        }
    }

    pub fn principal(mut self, principal: Option<&str>) -> Self {
        self.principal = principal.map(str::to_owned);
        self
    }

    pub fn lock(mut self, lock: &str) -> Self {
        self.lock = Some(lock.to_owned());
        self
    }

    pub fn lease(mut self, lease_id: &str) -> Self {
        self.lease_id = Some(lease_id.to_owned());
        self
    }

    pub fn epochs(mut self, epoch: Option<u64>, high_water: Option<u64>) -> Self {
        self.epoch = epoch;
        self.high_water = high_water;
        self
    }

    pub fn route(mut self, route: &str) -> Self {
        self.route = Some(route.to_owned());
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Whether an outsider can cause this event at will (and so it is rate limited).
    fn is_failure(&self) -> bool {
        matches!(
            self.event,
            "auth_failed" | "permission_denied" | "stale_token"
        )
    }
}

/// A handle to the audit log; cheap to clone. [`Audit::off`] records nothing.
#[derive(Clone, Default)]
pub struct Audit {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    tx: mpsc::Sender<AuditEvent>,
    limiter: Mutex<Bucket>,
    suppressed: AtomicU64,
}

/// A token bucket for failure events.
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Audit {
    /// No audit log.
    pub fn off() -> Audit {
        Audit::default()
    }

    /// Opens (appending to) `path` and starts the writer task. The file rotates to
    /// `<path>.1` when it reaches `max_bytes`.
    pub fn open(path: &Path, max_bytes: u64) -> Result<Audit, String> {
        let file = open_append(path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = mpsc::channel(QUEUE);
        let inner = Arc::new(Inner {
            tx,
            limiter: Mutex::new(Bucket {
                tokens: f64::from(FAILURE_BURST),
                last: Instant::now(),
            }),
            suppressed: AtomicU64::new(0),
        });
        let writer = Writer {
            path: path.to_owned(),
            out: BufWriter::new(file),
            size,
            max_bytes: max_bytes.max(4096),
        };
        tokio::spawn(write_loop(writer, rx, Arc::downgrade(&inner)));
        Ok(Audit { inner: Some(inner) })
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Queues an event; never waits.
    pub fn record(&self, event: AuditEvent) {
        let Some(inner) = &self.inner else { return };
        if event.is_failure() && !inner.admit_failure() {
            inner.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if inner.tx.try_send(event).is_err() {
            inner.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Inner {
    fn admit_failure(&self) -> bool {
        let mut bucket = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(bucket.last).as_secs_f64() * f64::from(FAILURES_PER_SECOND);
        bucket.tokens = (bucket.tokens + refill).min(f64::from(FAILURE_BURST));
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

fn open_append(path: &Path) -> Result<File, String> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map_err(|e| format!("cannot open audit log {}: {e}", path.display()))
}

struct Writer {
    path: PathBuf,
    out: BufWriter<File>,
    size: u64,
    max_bytes: u64,
}

impl Writer {
    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.size + line.len() as u64 > self.max_bytes {
            self.out.flush()?;
            let mut rotated = self.path.clone().into_os_string();
            rotated.push(".1");
            std::fs::rename(&self.path, rotated)?;
            let file = open_append(&self.path).map_err(std::io::Error::other)?;
            self.out = BufWriter::new(file);
            self.size = 0;
        }
        self.out.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }
}

#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

#[derive(Serialize)]
struct SuppressedLine {
    ts: String,
    event: &'static str,
    count: u64,
}

async fn write_loop(
    mut writer: Writer,
    mut rx: mpsc::Receiver<AuditEvent>,
    inner: std::sync::Weak<Inner>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let mut batch = Vec::new();
        tokio::select! {
            got = rx.recv_many(&mut batch, 256) => {
                if got == 0 {
                    break;
                }
            }
            _ = tick.tick() => {}
        }
        let mut lines = Vec::new();
        for event in &batch {
            if let Ok(mut line) = serde_json::to_vec(&Line {
                ts: timestamp(),
                event,
            }) {
                line.push(b'\n');
                lines.push(line);
            }
        }
        let suppressed = inner
            .upgrade()
            .map_or(0, |i| i.suppressed.swap(0, Ordering::Relaxed));
        if suppressed > 0 {
            let summary = SuppressedLine {
                ts: timestamp(),
                event: "suppressed",
                count: suppressed,
            };
            if let Ok(mut line) = serde_json::to_vec(&summary) {
                line.push(b'\n');
                lines.push(line);
            }
        }
        if lines.is_empty() {
            continue;
        }
        // Blocking file I/O, but small and on a dedicated task; a failing disk is logged
        // once per batch and the batch dropped (the audit log never stops the server).
        let result = tokio::task::block_in_place(|| {
            for line in &lines {
                writer.write(line)?;
            }
            writer.out.flush()
        });
        if let Err(e) = result {
            tracing::error!(path = %writer.path.display(), error = %e, "cannot write the audit log");
        }
    }
    let _ = writer.out.flush();
}

/// RFC 3339 UTC with milliseconds, without pulling in a date library for one format.
fn timestamp() -> String {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        let ts = timestamp();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
        let year: i32 = ts[..4].parse().unwrap();
        assert!(year >= 2024, "{ts}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failures_are_rate_limited_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let audit = Audit::open(&path, 1 << 30).unwrap();
        let flood = FAILURE_BURST as usize + 500;
        for _ in 0..flood {
            audit.record(AuditEvent::new("auth_failed").detail("unknown key"));
        }
        audit.record(AuditEvent::new("admin_action").detail("keys rotate"));
        // Poll until the writer has written everything: the admin line (recorded last) and
        // the summaries of every suppressed failure, which may span several batches.
        let count = |text: &str| {
            let lines: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let failures = lines.iter().filter(|l| l["event"] == "auth_failed").count();
            let suppressed: u64 = lines
                .iter()
                .filter(|l| l["event"] == "suppressed")
                .map(|l| l["count"].as_u64().unwrap())
                .sum();
            let admin = lines.iter().any(|l| l["event"] == "admin_action");
            (failures, suppressed, admin)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let (failures, suppressed, admin) = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let (failures, suppressed, admin) = count(&text);
            let all = admin && failures as u64 + suppressed == flood as u64;
            if all || Instant::now() > deadline {
                break (failures, suppressed, admin);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(suppressed > 0, "a flood over the burst is summarised");
        assert!(failures <= FAILURE_BURST as usize + 10, "{failures}");
        assert_eq!(failures as u64 + suppressed, flood as u64);
        assert!(admin);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_file_rotates_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let audit = Audit::open(&path, 4096).unwrap();
        for i in 0..200 {
            audit.record(AuditEvent::new("admin_action").detail(format!("action {i}")));
        }
        let rotated = dir.path().join("audit.log.1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(rotated.exists()
            && std::fs::read_to_string(&path).is_ok_and(|t| t.contains("action 199")))
        {
            assert!(Instant::now() < deadline, "no rotation");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for file in [&path, &rotated] {
            assert!(std::fs::metadata(file).unwrap().len() <= 4096);
        }
    }
}

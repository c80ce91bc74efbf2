//! `GET /metrics`: Prometheus counters, gauges and histograms of one server.
//!
//! Every metric lives in this server's own [`Registry`] (two servers in one process, as
//! in tests, count separately), except the process metrics, which describe the process.
//! Recording is an atomic add or a histogram bucket; nothing on a request's path takes a
//! lock this module owns or allocates. Gauges that describe state (live leases, waiters)
//! are read from the issuer when scraped, not kept up to date on every change.
//!
//! ## Bounded cardinality
//! No label takes a lock name, a key, a principal or anything else a client chooses:
//! `code` is an [`ErrorCode`] (a fixed set), `route` the route's template as the router
//! declares it (`/v1/kv/{lock}/{*key}`, never the path itself), `version` the build's.
//! Per-lock figures come from the events stream (docs/operations.md).

use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use palisade_api::wire::ResourceKind;
use palisade_api::ErrorCode;
use palisade_issuer::Census;
use palisade_storage::observe::{CommitObserver, CommitReport};

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The counters of one server. See the module docs.
pub struct Metrics {
    registry: Registry,
    rejections: IntCounterVec,
    fenced_writes: IntCounter,
    /// What gates in other resources reported (`POST /v1/gates/report`).
    gate_admits: IntCounterVec,
    gate_refusals: IntCounterVec,
    pub(crate) grants: IntCounter,
    pub(crate) releases: IntCounter,
    pub(crate) expiries: IntCounter,
    pub(crate) ends: IntCounter,
    leases_live: IntGauge,
    /// 1 once the store has failed (latched) or the issuer stopped: `/healthz` answers 503.
    storage_failed: IntGauge,
    waiters: IntGauge,
    request_duration: HistogramVec,
    fsync_duration: Histogram,
    commit_batch: Histogram,
    event_subscribers: IntGauge,
    events_dropped: IntCounter,
    log_suppressed: IntCounter,
}

/// Request latencies from 100 µs to about 26 s.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.0001, 2.0, 19).unwrap_or_default()
}

impl Metrics {
    /// A fresh registry with every metric at zero, and the process metrics.
    pub fn new() -> Metrics {
        // Fails only on a malformed or repeated metric name: a bug, caught by the tests.
        Self::build().expect("metric names are valid and distinct")
    }

    fn build() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let rejections = IntCounterVec::new(
            Opts::new(
                "palisade_fenced_rejections_total",
                "Mutations of the fenced store refused, by error code.",
            ),
            &["code"],
        )?;
        registry.register(Box::new(rejections.clone()))?;
        // The codes alerts watch start at 0, so that the first refusal is an increase
        // (a series born at 1 shows no increase to `increase()` or `rate()`).
        for code in [
            ErrorCode::StaleToken,
            ErrorCode::StaleSequence,
            ErrorCode::InvalidToken,
            ErrorCode::WrongLock,
            ErrorCode::MissingToken,
        ] {
            rejections.with_label_values(&[code.as_str()]);
        }
        let gate_admits = IntCounterVec::new(
            Opts::new(
                "palisade_gate_admits_total",
                "Writes admitted by gates in other resources, as they reported them, by \
                 resource kind.",
            ),
            &["resource"],
        )?;
        registry.register(Box::new(gate_admits.clone()))?;
        let gate_refusals = IntCounterVec::new(
            Opts::new(
                "palisade_gate_refusals_total",
                "Writes refused by gates in other resources, as they reported them, by \
                 resource kind and error code.",
            ),
            &["resource", "code"],
        )?;
        registry.register(Box::new(gate_refusals.clone()))?;
        // As above: every kind's admits, and the stale refusals the alerts watch, from 0.
        for kind in ResourceKind::ALL {
            gate_admits.with_label_values(&[kind.as_str()]);
            for code in [ErrorCode::StaleToken, ErrorCode::StaleSequence] {
                gate_refusals.with_label_values(&[kind.as_str(), code.as_str()]);
            }
        }
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "palisade_request_duration_seconds",
                "Time from a request's arrival to its response head, by route template.",
            )
            .buckets(latency_buckets()),
            &["route"],
        )?;
        registry.register(Box::new(request_duration.clone()))?;
        let fsync_duration = Histogram::with_opts(
            HistogramOpts::new(
                "palisade_fsync_duration_seconds",
                "Duration of each durable commit: embedded store, the write ending in \
                 fsync; etcd backend, each write transaction until etcd answered (its \
                 quorum has logged it).",
            )
            .buckets(latency_buckets()),
        )?;
        registry.register(Box::new(fsync_duration.clone()))?;
        let commit_batch = Histogram::with_opts(
            HistogramOpts::new(
                "palisade_commit_batch_size",
                "Requests carried by each durable commit of the embedded store.",
            )
            .buckets(exponential_buckets(1.0, 2.0, 11)?),
        )?;
        registry.register(Box::new(commit_batch.clone()))?;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "palisade_build_info",
                "Always 1; the label says which version is running.",
            ),
            &["version"],
        )?;
        registry.register(Box::new(build_info.clone()))?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let metrics = Metrics {
            rejections,
            gate_admits,
            gate_refusals,
            fenced_writes: counter(
                "palisade_fenced_writes_total",
                "Mutations of the fenced store admitted and applied (replays not counted).",
            )?,
            grants: counter("palisade_grants_total", "Leases granted.")?,
            releases: counter("palisade_releases_total", "Leases released.")?,
            expiries: counter(
                "palisade_expiries_total",
                "Leases that expired without being released.",
            )?,
            ends: counter(
                "palisade_lease_ends_total",
                "Leases that ended where this node cannot tell a release from an expiry \
                 (etcd backend: expiries, and releases through other nodes).",
            )?,
            leases_live: gauge(
                "palisade_leases_live",
                "Leases live now (etcd backend: of the whole deployment).",
            )?,
            waiters: gauge(
                "palisade_waiters",
                "Acquisitions waiting in line now (embedded: on this node; etcd backend: \
                 of the whole deployment).",
            )?,
            request_duration,
            fsync_duration,
            commit_batch,
            storage_failed: gauge(
                "palisade_storage_failed",
                "1 when the store has failed (fail-stop) or the issuer stopped: the server \
                 refuses writes and /healthz answers 503; 0 otherwise.",
            )?,
            event_subscribers: gauge(
                "palisade_event_subscribers",
                "Open event streams (GET /v1/events, /v1/locks/{lock}/events).",
            )?,
            events_dropped: counter(
                "palisade_event_resets_total",
                "Reset events sent to subscribers that fell behind or asked for events no \
                 longer held.",
            )?,
            log_suppressed: counter(
                "palisade_log_lines_suppressed_total",
                "Stale-token log lines not written because of the rate limit.",
            )?,
            registry,
        };
        Ok(metrics)
    }

    /// A refused mutation.
    pub fn rejected(&self, code: ErrorCode) {
        self.rejections.with_label_values(&[code.as_str()]).inc();
    }

    /// A gate's report: `admitted` writes and `refused` ones by code, in a `resource`.
    pub fn gate_report(&self, resource: ResourceKind, admitted: u64, refused: &[(ErrorCode, u64)]) {
        let kind = resource.as_str();
        self.gate_admits.with_label_values(&[kind]).inc_by(admitted);
        for (code, n) in refused {
            self.gate_refusals
                .with_label_values(&[kind, code.as_str()])
                .inc_by(*n);
        }
    }

    /// An admitted mutation.
    pub fn fenced_write(&self) {
        self.fenced_writes.inc();
    }

    /// One request's time to its response head, under its route template.
    pub fn request(&self, route: &str, took: Duration) {
        self.request_duration
            .with_label_values(&[route])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn storage_failed(&self) -> &IntGauge {
        &self.storage_failed
    }

    pub(crate) fn subscribers(&self) -> &IntGauge {
        &self.event_subscribers
    }

    pub(crate) fn reset_sent(&self) {
        self.events_dropped.inc();
    }

    pub(crate) fn log_suppressed(&self, lines: u64) {
        self.log_suppressed.inc_by(lines);
    }

    /// The text format, with the gauges read from `census` first.
    pub fn render(&self, census: Option<Census>) -> String {
        if let Some(census) = census {
            self.leases_live
                .set(i64::try_from(census.leases).unwrap_or(i64::MAX));
            self.waiters
                .set(i64::try_from(census.waiters).unwrap_or(i64::MAX));
        }
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics could not be encoded");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl CommitObserver for Metrics {
    fn committed(&self, report: CommitReport) {
        self.fsync_duration.observe(report.sync.as_secs_f64());
        self.commit_batch.observe(report.requests as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of an unlabelled sample in `text`.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn every_named_metric_is_exported() {
        let m = Metrics::new();
        m.rejected(ErrorCode::StaleToken);
        m.rejected(ErrorCode::StaleToken);
        m.fenced_write();
        m.request("/v1/kv/{lock}/{*key}", Duration::from_millis(3));
        m.committed(CommitReport {
            requests: 7,
            sync: Duration::from_millis(2),
        });
        let text = m.render(Some(Census {
            leases: 3,
            waiters: 2,
        }));
        for name in [
            "palisade_fenced_writes_total",
            "palisade_grants_total",
            "palisade_releases_total",
            "palisade_expiries_total",
            "palisade_lease_ends_total",
            "palisade_leases_live",
            "palisade_waiters",
            "palisade_storage_failed",
            "palisade_request_duration_seconds_bucket",
            "palisade_fsync_duration_seconds_bucket",
            "palisade_commit_batch_size_bucket",
            "palisade_build_info{version=",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        #[cfg(target_os = "linux")]
        for name in ["process_resident_memory_bytes", "process_open_fds"] {
            assert!(sample(&text, name).is_some_and(|v| v > 0.0), "{name}");
        }
        assert!(text.contains("palisade_fenced_rejections_total{code=\"stale_token\"} 2"));
        // Watched by the alerts: there from the start, at 0.
        assert!(text.contains("palisade_fenced_rejections_total{code=\"stale_sequence\"} 0"));
        assert_eq!(sample(&text, "palisade_fenced_writes_total"), Some(1.0));
        assert_eq!(sample(&text, "palisade_leases_live"), Some(3.0));
        assert_eq!(sample(&text, "palisade_waiters"), Some(2.0));
        assert_eq!(sample(&text, "palisade_commit_batch_size_sum"), Some(7.0));
        assert!(text.contains("route=\"/v1/kv/{lock}/{*key}\""));
    }
}

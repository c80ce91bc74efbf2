//! Steps 2 to 4 of the scale job: hold many leases, renew each once a second, release.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use palisade_api::ErrorCode;

use super::{add_error, histogram, ScaleReport};
use crate::http::Conn;
use crate::palisade::{acquire, acquire_body, release};
use crate::{BenchArgs, OpError};

/// How often each lease is renewed.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// What one client saw while renewing its leases.
struct Renewal {
    keepalives: u64,
    latency_us: hdrhistogram::Histogram<u64>,
    max_round: Duration,
    max_gap: Duration,
    lost: u64,
    errors: BTreeMap<String, u64>,
}

async fn keepalive(conn: &mut Conn, lease_id: &str) -> Result<(), OpError> {
    let path = format!("/v1/leases/{lease_id}/keepalive");
    let answer = conn.post_json(&path, Bytes::new()).await?;
    match answer.status {
        200 => Ok(()),
        _ => Err(answer.error()),
    }
}

/// (lease id, last successful renewal); None once lost.
type Held = Vec<Option<(String, Instant)>>;

/// One client acquires its share of the leases.
async fn hold(
    mut conn: Conn,
    names: Vec<String>,
    body: Bytes,
) -> (Conn, Held, BTreeMap<String, u64>) {
    let mut errors = BTreeMap::new();
    let mut leases = Vec::with_capacity(names.len());
    for name in &names {
        let path = format!("/v1/locks/{name}/acquire");
        match acquire(&mut conn, &path, body.clone()).await {
            Ok(granted) => leases.push(Some((granted.lease_id, Instant::now()))),
            Err(e) => add_error(&mut errors, &e),
        }
    }
    (conn, leases, errors)
}

/// One client renews its leases once a second until `until`, then releases them.
async fn renew(mut conn: Conn, mut leases: Held, offset: Duration, until: Instant) -> Renewal {
    let mut r = Renewal {
        keepalives: 0,
        latency_us: histogram(),
        max_round: Duration::ZERO,
        max_gap: Duration::ZERO,
        lost: 0,
        errors: BTreeMap::new(),
    };
    tokio::time::sleep(offset).await;
    // Gaps are measured from here: the time it took to acquire them all is `hold_s`.
    let start = Instant::now();
    for (_, last) in leases.iter_mut().flatten() {
        *last = start;
    }
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let round = Instant::now();
        if round >= until {
            break;
        }
        for slot in leases.iter_mut() {
            let Some((lease_id, last)) = slot.as_mut() else {
                continue;
            };
            let start = Instant::now();
            match keepalive(&mut conn, lease_id).await {
                Ok(()) => {
                    let end = Instant::now();
                    r.keepalives += 1;
                    r.latency_us
                        .saturating_record(end.duration_since(start).as_micros() as u64);
                    r.max_gap = r.max_gap.max(end.duration_since(*last));
                    *last = end;
                }
                Err(e) if e.code == ErrorCode::LeaseExpired.as_str() => {
                    r.lost += 1;
                    *slot = None;
                }
                Err(e) => add_error(&mut r.errors, &e),
            }
        }
        r.max_round = r.max_round.max(round.elapsed());
    }
    for (lease_id, _) in leases.into_iter().flatten() {
        if let Err(e) = release(&mut conn, &lease_id).await {
            add_error(&mut r.errors, &e);
        }
    }
    r
}

pub(super) async fn hold_and_renew(
    args: &BenchArgs,
    prefix: &str,
    conns: Vec<Conn>,
    report: &mut ScaleReport,
    rss: &impl Fn() -> Option<u64>,
) {
    let clients = conns.len().max(1);
    eprintln!(
        "scale: holding {} leases, renewing each every second for {:?}",
        report.leases, args.duration
    );
    let body = acquire_body("scale-hold", args.ttl_ms, 0);
    let holding: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, conn)| {
            let names: Vec<String> = (c..report.leases)
                .step_by(clients)
                .map(|i| format!("{prefix}-{i}"))
                .collect();
            tokio::spawn(hold(conn, names, body.clone()))
        })
        .collect();
    let start = Instant::now();
    let mut held = Vec::with_capacity(clients);
    for task in holding {
        match task.await {
            Ok((conn, leases, errors)) => {
                for (code, n) in errors {
                    *report.errors.entry(code).or_default() += n;
                }
                held.push((conn, leases));
            }
            Err(_) => add_error(&mut report.errors, &OpError::new("client_panicked")),
        }
    }
    report.hold_s = start.elapsed().as_secs_f64();
    report.rss_after_hold = rss();

    let until = Instant::now() + args.duration;
    let tasks: Vec<_> = held
        .into_iter()
        .enumerate()
        .map(|(c, (conn, leases))| {
            // Spread the clients' rounds over the second instead of all at once.
            let offset = RENEW_EVERY * c as u32 / clients as u32;
            tokio::spawn(renew(conn, leases, offset, until))
        })
        .collect();
    // Memory while renewing, sampled each second.
    let mut samples = Vec::new();
    while tasks.iter().any(|t| !t.is_finished()) {
        samples.extend(rss());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.rss_max_renewing = samples.iter().copied().max();
    report.renew_s = args.duration.as_secs_f64();
    let mut latency = histogram();
    for task in tasks {
        let Ok(r) = task.await else {
            add_error(&mut report.errors, &OpError::new("client_panicked"));
            continue;
        };
        report.keepalives += r.keepalives;
        let _ = latency.add(&r.latency_us);
        report.max_round_ms = report.max_round_ms.max(r.max_round.as_millis() as u64);
        report.max_gap_ms = report.max_gap_ms.max(r.max_gap.as_millis() as u64);
        report.lost += r.lost;
        for (code, n) in r.errors {
            *report.errors.entry(code).or_default() += n;
        }
    }
    report.keepalives_per_s = report.keepalives as f64 / report.renew_s.max(1e-9);
    report.keepalive_p99_us = latency.value_at_quantile(0.99);
    report.keepalive_max_us = latency.max();
}

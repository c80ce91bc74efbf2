//! Reading what a server shows of itself: `/metrics` samples and the events stream.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use palisade_client::LockEvent;

use super::Http;

/// The samples of a `/metrics` text, by name with labels.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// `GET /metrics` in the Prometheus text format, as samples.
pub async fn scrape(http: &Http) -> BTreeMap<String, f64> {
    let resp = http
        .client
        .get(format!("{}/metrics", http.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    samples(&resp.text().await.unwrap())
}

/// Polls `scrape` (a read of `/metrics` as samples) until the server counts `n` open event
/// streams: a stream connects only when polled, so a test waits for it before acting.
pub async fn until_streams_open<F, Fut>(n: f64, mut scrape: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = BTreeMap<String, f64>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while scrape().await.get("palisade_event_subscribers") != Some(&n) {
        assert!(std::time::Instant::now() < deadline, "stream never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How much the sample `name` moved between two scrapes.
pub fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, name: &str) -> f64 {
    after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
}

/// A compact view of an event, to compare sequences.
pub fn describe(e: &LockEvent) -> String {
    match e {
        LockEvent::Granted { epoch, holder, .. } => format!("granted {epoch} {holder}"),
        LockEvent::Released {
            epoch,
            holder,
            cause,
            ..
        } => format!("released {epoch} {holder} {cause}"),
        LockEvent::Expired { epoch, holder, .. } => format!("expired {epoch} {holder}"),
        LockEvent::Fenced { high_water, .. } => format!("fenced {high_water}"),
        LockEvent::Rejected {
            code,
            epoch,
            high_water,
            ..
        } => format!("rejected {code} {epoch:?} {high_water:?}"),
        LockEvent::GateRefused {
            resource,
            code,
            epoch,
            high_water,
            ..
        } => format!("gate_refused {resource} {code} {epoch:?} {high_water:?}"),
        LockEvent::Reset { reason, .. } => format!("reset {reason}"),
    }
}

/// Drives a watch stream on its own task (a stream connects only when polled), handing
/// its items over; aborted when dropped.
pub struct Following {
    items: tokio::sync::mpsc::UnboundedReceiver<Result<LockEvent, palisade_client::Error>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn follow(
    stream: impl futures::Stream<Item = Result<LockEvent, palisade_client::Error>> + Send + 'static,
) -> Following {
    let (tx, items) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                return;
            }
        }
    });
    Following { items, task }
}

/// The next event, within 20 s.
pub async fn next_event(following: &mut Following) -> LockEvent {
    let item = tokio::time::timeout(Duration::from_secs(20), following.items.recv())
        .await
        .expect("an event within 20 s")
        .expect("the stream goes on");
    item.expect("no error")
}

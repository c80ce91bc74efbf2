//! The events bus behind `GET /v1/events` and `GET /v1/locks/{lock}/events`.
//!
//! Every event gets the next id and goes into a ring of the last `capacity` events (for
//! clients that reconnect with `Last-Event-ID`) and to the subscribers listening now,
//! through a bounded broadcast channel. Nothing here grows with the number or the speed
//! of subscribers:
//!
//! - the ring holds at most `capacity` events, whoever listens;
//! - the live channel holds at most `capacity` events too; a subscriber that falls further
//!   behind (a slow reader, a stalled connection) skips what it missed and gets a `reset`
//!   event instead, telling it to re-read the state;
//! - at most `max_subscribers` streams are open at once, and at most a smaller number per
//!   principal (the caller's limit, [`EventBus::subscribe`]), so that one principal cannot
//!   take every place; past either a new one is refused (429 `quota_exceeded`).
//!
//! ## Ids
//! Ids increase by one per event. The first id of a server run is the wall-clock time of
//! its start in microseconds, so ids of a later run are above every id of an earlier one
//! (unless a run published more than a million events per second on average), and a
//! client resuming with an id from another run, or from another node, gets a `reset`
//! rather than a wrong resume. Ids fit in 53 bits (JavaScript numbers) until the year
//! 2255.
//!
//! ## What this does not do
//! - It is not durable: a restart forgets every event; resuming across one gives `reset`.
//! - Publishing takes a short lock (the ring); it never waits for a subscriber.

use palisade_api::QuotaResource;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, watch};

/// Default of the ring's (and the live channel's) size.
pub const DEFAULT_EVENTS_BUFFER: usize = 4096;
/// Default cap on streams open at once.
pub const DEFAULT_MAX_SUBSCRIBERS: usize = 256;

use palisade_api::wire::Event;
/// What an event says: the contract's type (docs/api.md, "Events").
pub use palisade_api::wire::EventBody as Body;

/// One published event. Its JSON is made when a stream first sends it, once for every
/// subscriber, and never when nobody listens: publishing runs on the request path (a
/// lease change is published under the issuer's lock), encoding need not.
#[derive(Debug)]
pub struct Published {
    pub id: u64,
    pub at_ms: u64,
    pub body: Body,
    json: OnceLock<Box<str>>,
}

impl Published {
    fn new(id: u64, body: Body) -> Published {
        Published {
            id,
            at_ms: now_ms(),
            body,
            json: OnceLock::new(),
        }
    }

    /// The event's `type`.
    pub fn kind(&self) -> &'static str {
        self.body.kind()
    }

    /// The lock it is about ("" for none).
    pub fn lock(&self) -> &str {
        self.body.lock().unwrap_or_default()
    }

    /// The event as sent: `{"id":..,"at_ms":..,"type":..,<the body's fields>}`.
    pub fn json(&self) -> &str {
        self.json.get_or_init(|| {
            serde_json::to_string(&Event {
                id: self.id,
                at_ms: self.at_ms,
                body: &self.body,
            })
            .unwrap_or_default()
            .into_boxed_str()
        })
    }
}

/// Why a subscriber gets a `reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// `Last-Event-ID` names an event no longer held (or of another run or node).
    Unknown,
    /// The subscriber fell behind and events were skipped.
    Lagged,
    /// The node's view of the backend broke off (etcd watch restarted); events may be
    /// missing.
    Gap,
}

impl ResetReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Unknown => "unknown_last_event_id",
            ResetReason::Lagged => "lagged",
            ResetReason::Gap => "gap",
        }
    }
}

/// The JSON of a `reset` event with id `id`. It goes through a `Value`, whose keys are
/// sorted: `{"at_ms":..,"id":..,"reason":..,"type":"reset"}`, as it has always been sent.
pub fn reset_json(id: u64, reason: ResetReason) -> String {
    let event = Event {
        id,
        at_ms: now_ms(),
        body: Body::Reset {
            reason: reason.as_str().into(),
        },
    };
    serde_json::to_value(event)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What goes down the live channel: an event, or a reset for everyone.
#[derive(Debug, Clone)]
pub enum Live {
    Event(Arc<Published>),
    Reset { id: u64, reason: ResetReason },
}

/// Where a new stream starts.
pub enum Start<'a> {
    /// With what is published from now on.
    Now,
    /// After this event id (a `Last-Event-ID`), if the ring still holds everything that
    /// followed it; otherwise with a `reset`.
    After(u64),
    /// With the newest `n` events the ring holds of the locks `covers` accepts, oldest
    /// first, then live (a dashboard that opens shows what just happened).
    Newest(usize, &'a dyn Fn(&str) -> bool),
}

struct Ring {
    events: VecDeque<Arc<Published>>,
    next_id: u64,
}

/// The bus. See the module docs.
pub struct EventBus {
    ring: Mutex<Ring>,
    capacity: usize,
    live: broadcast::Sender<Live>,
    max_subscribers: usize,
    subscribers: Arc<AtomicUsize>,
    owners: Owners,
    closed: watch::Sender<bool>,
}

/// Streams open per principal (only principals with one open).
type Owners = Arc<Mutex<HashMap<String, usize>>>;

/// Why [`EventBus::subscribe`] refused a stream: the resource and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub resource: QuotaResource,
    pub limit: usize,
}

/// A stream's place: the events to send first, then the live channel.
pub struct Subscription {
    /// Sent before anything live: a reset, or the events after `Last-Event-ID`.
    pub backlog: VecDeque<Live>,
    pub live: broadcast::Receiver<Live>,
    /// Becomes true when the server shuts down.
    pub closed: watch::Receiver<bool>,
    _slot: Slot,
}

/// Holds one of the `max_subscribers` places (and one of its principal's) until dropped.
struct Slot {
    all: Arc<AtomicUsize>,
    owner: Option<(Owners, String)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.all.fetch_sub(1, Ordering::AcqRel);
        if let Some((owners, name)) = &self.owner {
            let mut owners = owners.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = owners.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    owners.remove(name);
                }
            }
        }
    }
}

impl EventBus {
    /// A bus keeping the last `capacity` events (at least 1), for at most
    /// `max_subscribers` streams at once.
    pub fn new(capacity: usize, max_subscribers: usize) -> EventBus {
        let capacity = capacity.max(1);
        let first_id = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros()),
        )
        .unwrap_or(1)
        .max(1);
        EventBus {
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(capacity.min(1024)),
                next_id: first_id,
            }),
            capacity,
            live: broadcast::channel(capacity).0,
            max_subscribers,
            subscribers: Arc::new(AtomicUsize::new(0)),
            owners: Arc::default(),
            closed: watch::channel(false).0,
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ring's size.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The most streams open at once.
    pub fn max_subscribers(&self) -> usize {
        self.max_subscribers
    }

    /// Streams open now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Acquire)
    }

    /// Publishes one event; returns its id.
    pub fn publish(&self, body: Body) -> u64 {
        let mut ring = self.ring();
        let id = ring.next_id;
        ring.next_id += 1;
        let event = Arc::new(Published::new(id, body));
        if ring.events.len() == self.capacity {
            ring.events.pop_front();
        }
        ring.events.push_back(event.clone());
        // Sent under the ring's lock, so that a subscriber joining sees every event either
        // in its backlog or live, never both, never neither. No receiver is not an error.
        let _ = self.live.send(Live::Event(event));
        id
    }

    /// Tells every subscriber that events may be missing (the node's view broke off). Takes
    /// an id of its own, so that a client resuming after it does not resume before it.
    pub fn publish_gap(&self) {
        let mut ring = self.ring();
        let id = ring.next_id;
        ring.next_id += 1;
        // The events before the gap cannot be resumed across it: forget them.
        ring.events.clear();
        let _ = self.live.send(Live::Reset {
            id,
            reason: ResetReason::Gap,
        });
    }

    /// Opens a stream starting at `start`, for `owner` (a principal's name and how many
    /// streams it may have open; none with authentication off). Refused when
    /// `max_subscribers` streams are open, or the owner's limit.
    pub fn subscribe(
        &self,
        start: Start<'_>,
        owner: Option<(&str, usize)>,
    ) -> Result<Subscription, Full> {
        let taken = self
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_subscribers).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(Full {
                resource: QuotaResource::EventSubscribers,
                limit: self.max_subscribers,
            });
        }
        let mut slot = Slot {
            all: self.subscribers.clone(),
            owner: None,
        };
        if let Some((name, limit)) = owner {
            let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
            let open = owners.entry(name.to_owned()).or_insert(0);
            if *open >= limit {
                if *open == 0 {
                    owners.remove(name);
                }
                drop(owners);
                return Err(Full {
                    resource: QuotaResource::EventSubscribersPerPrincipal,
                    limit,
                });
            }
            *open += 1;
            slot.owner = Some((self.owners.clone(), name.to_owned()));
        }
        let ring = self.ring();
        let live = self.live.subscribe();
        let newest = ring.next_id - 1;
        let oldest = ring.events.front().map_or(ring.next_id, |e| e.id);
        let mut backlog = VecDeque::new();
        if let Start::Newest(n, covers) = start {
            let mut newest: Vec<Live> = ring
                .events
                .iter()
                .rev()
                .filter(|e| covers(e.lock()))
                .take(n)
                .map(|e| Live::Event(e.clone()))
                .collect();
            newest.reverse();
            backlog.extend(newest);
        }
        if let Start::After(last) = start {
            // Resumable: nothing after `last` was dropped from the ring, and `last` was
            // published by this run.
            if last >= oldest.saturating_sub(1) && last <= newest {
                backlog.extend(
                    ring.events
                        .iter()
                        .filter(|e| e.id > last)
                        .map(|e| Live::Event(e.clone())),
                );
            } else {
                backlog.push_back(Live::Reset {
                    id: newest,
                    reason: ResetReason::Unknown,
                });
            }
        }
        drop(ring);
        Ok(Subscription {
            backlog,
            live,
            closed: self.closed.subscribe(),
            _slot: slot,
        })
    }

    /// Ends every stream (the server is shutting down) and refuses new ones from now on.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Whether [`EventBus::close`] was called.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced(lock: &str, mark: u64) -> Body {
        Body::Fenced {
            lock: lock.into(),
            high_water: mark,
            seq: 0,
        }
    }

    fn ids(backlog: &VecDeque<Live>) -> Vec<Result<u64, u64>> {
        backlog
            .iter()
            .map(|l| match l {
                Live::Event(e) => Ok(e.id),
                Live::Reset { id, .. } => Err(*id),
            })
            .collect()
    }

    #[test]
    fn resumes_from_the_ring_or_resets() {
        let bus = EventBus::new(3, 10);
        let first = bus.publish(fenced("a", 1));
        for mark in 2..=5 {
            bus.publish(fenced("a", mark));
        }
        // Held: first+2 ..= first+4.
        let resumed = bus.subscribe(Start::After(first + 2), None).unwrap();
        assert_eq!(ids(&resumed.backlog), vec![Ok(first + 3), Ok(first + 4)]);
        let edge = bus.subscribe(Start::After(first + 1), None).unwrap();
        assert_eq!(
            ids(&edge.backlog).len(),
            3,
            "nothing after first+1 was dropped"
        );
        let old = bus.subscribe(Start::After(first), None).unwrap();
        assert_eq!(ids(&old.backlog), vec![Err(first + 4)]);
        let other_run = bus.subscribe(Start::After(first + 100), None).unwrap();
        assert_eq!(ids(&other_run.backlog), vec![Err(first + 4)]);
        let current = bus.subscribe(Start::After(first + 4), None).unwrap();
        assert!(current.backlog.is_empty());
        assert!(bus.subscribe(Start::Now, None).unwrap().backlog.is_empty());
    }

    #[test]
    fn a_new_stream_can_start_with_the_newest_events_of_its_locks() {
        let bus = EventBus::new(4, 10);
        let first = bus.publish(fenced("a", 1));
        bus.publish(fenced("b", 2));
        bus.publish(fenced("a", 3));
        bus.publish(fenced("b", 4));
        bus.publish(fenced("a", 5));
        // The ring holds first+1 ..= first+4 (b, a, b, a).
        let only_a = |lock: &str| lock == "a";
        let two = bus.subscribe(Start::Newest(2, &only_a), None).unwrap();
        assert_eq!(
            ids(&two.backlog),
            vec![Ok(first + 2), Ok(first + 4)],
            "oldest first"
        );
        let more = bus.subscribe(Start::Newest(10, &only_a), None).unwrap();
        assert_eq!(
            ids(&more.backlog).len(),
            2,
            "only what the ring still holds"
        );
        let all = |_: &str| true;
        let every = bus.subscribe(Start::Newest(3, &all), None).unwrap();
        assert_eq!(
            ids(&every.backlog),
            vec![Ok(first + 2), Ok(first + 3), Ok(first + 4)]
        );
        assert!(bus
            .subscribe(Start::Newest(0, &all), None)
            .unwrap()
            .backlog
            .is_empty());
    }

    #[test]
    fn subscribers_are_capped_and_slots_come_back() {
        let bus = EventBus::new(4, 2);
        let a = bus.subscribe(Start::Now, None).unwrap();
        let _b = bus.subscribe(Start::Now, None).unwrap();
        assert!(bus.subscribe(Start::Now, None).is_err());
        drop(a);
        assert!(bus.subscribe(Start::Now, None).is_ok());
        assert_eq!(bus.subscribers(), 1);
    }

    #[test]
    fn a_slow_subscriber_lags_instead_of_growing() {
        let bus = EventBus::new(4, 2);
        let mut slow = bus.subscribe(Start::Now, None).unwrap();
        for mark in 0..100 {
            bus.publish(fenced("a", mark));
        }
        assert!(matches!(
            slow.live.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(96))
        ));
        assert_eq!(bus.ring().events.len(), 4);
    }

    #[test]
    fn one_principal_cannot_take_every_place() {
        let bus = EventBus::new(4, 3);
        let a1 = bus.subscribe(Start::Now, Some(("a", 2))).unwrap();
        let _a2 = bus.subscribe(Start::Now, Some(("a", 2))).unwrap();
        let refused = bus.subscribe(Start::Now, Some(("a", 2))).err().unwrap();
        assert_eq!(
            refused,
            Full {
                resource: QuotaResource::EventSubscribersPerPrincipal,
                limit: 2
            }
        );
        // Another principal still finds a place; then the server-wide cap holds.
        let _b = bus.subscribe(Start::Now, Some(("b", 2))).unwrap();
        let full = bus.subscribe(Start::Now, Some(("c", 2))).err().unwrap();
        assert_eq!(full.resource, QuotaResource::EventSubscribers);
        assert_eq!(bus.subscribers(), 3);
        // A place given back is the principal's again, and the count is exact.
        drop(a1);
        assert!(bus.subscribe(Start::Now, Some(("a", 2))).is_ok());
        assert_eq!(bus.owners.lock().unwrap().get("a"), Some(&1));
    }

    #[test]
    fn an_event_is_encoded_once_and_only_when_sent() {
        let bus = EventBus::new(4, 2);
        bus.publish(fenced("a", 1));
        let unheard = bus.ring().events.back().unwrap().clone();
        assert!(unheard.json.get().is_none(), "nobody listens: not encoded");
        let mut one = bus.subscribe(Start::Now, None).unwrap();
        let mut two = bus.subscribe(Start::Now, None).unwrap();
        bus.publish(fenced("a", 2));
        let (Ok(Live::Event(a)), Ok(Live::Event(b))) = (one.live.try_recv(), two.live.try_recv())
        else {
            panic!("no event")
        };
        assert!(a.json.get().is_none(), "publishing does not encode");
        let first = a.json();
        assert!(first.contains(r#""high_water":2"#), "{first}");
        assert!(
            std::ptr::eq(first, b.json()),
            "one encoding for every stream"
        );
    }

    #[test]
    fn the_json_is_the_documented_shape() {
        let bus = EventBus::new(4, 2);
        let mut sub = bus.subscribe(Start::Now, None).unwrap();
        let id = bus.publish(Body::Rejected {
            lock: "orders".into(),
            code: "stale_token".into(),
            epoch: Some(1),
            high_water: Some(2),
        });
        let Ok(Live::Event(e)) = sub.live.try_recv() else {
            panic!("no event")
        };
        let v: serde_json::Value = serde_json::from_str(e.json()).unwrap();
        assert_eq!(v["id"], id);
        assert!(v["at_ms"].as_u64().unwrap() > 0);
        assert_eq!(v["type"], "rejected");
        assert_eq!(v["lock"], "orders");
        assert_eq!(v["code"], "stale_token");
        assert_eq!(
            (v["epoch"].as_u64(), v["high_water"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(v.as_object().unwrap().len(), 7);
    }

    #[test]
    fn the_bytes_keep_their_order() {
        let bus = EventBus::new(4, 2);
        let mut sub = bus.subscribe(Start::Now, None).unwrap();
        let id = bus.publish(Body::Released {
            lock: "orders".into(),
            epoch: 3,
            holder: "h".into(),
            cause: "release".into(),
        });
        let Ok(Live::Event(e)) = sub.live.try_recv() else {
            panic!("no event")
        };
        let head = format!(r#"{{"id":{id},"at_ms":"#);
        assert!(e.json().starts_with(&head), "{}", e.json());
        assert!(
            e.json().ends_with(
                r#","type":"released","lock":"orders","epoch":3,"holder":"h","cause":"release"}"#
            ),
            "{}",
            e.json()
        );
        // A reset's keys are sorted, as they were when it was written with `json!`.
        let reset = reset_json(5, ResetReason::Lagged);
        let (head, tail) = reset.split_once(',').unwrap();
        assert!(head.starts_with(r#"{"at_ms":"#), "{reset}");
        assert_eq!(tail, r#""id":5,"reason":"lagged","type":"reset"}"#);
    }
}

//! Failover between endpoints, against scripted nodes on port 0 that record what they
//! received: a call that cannot reach a node, or gets 503, moves to the next; a fenced
//! write is resent only with the idempotency key it was first sent with; an acquire (or a
//! session creation) whose answer was lost is not resent. The same rules as the Python
//! client's `test_failover.py`; a real node killed under the client is in the CLI's
//! `election` tests.

mod support;

use std::sync::{Arc, Mutex};

use palisade_client::{AcquireOptions, Client, Error};
use support::read_request;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// What a scripted node does with one request.
#[derive(Clone)]
enum Reply {
    /// Answer with this status line and JSON body.
    Json(&'static str, &'static str),
    /// Read the request, then close the connection without an answer.
    Drop,
}

/// A node that answers each request with the next scripted reply (and 500 once the
/// script runs out) and records the raw requests it received.
struct Node {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Node {
    async fn start(script: Vec<Reply>) -> Node {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (log, script) = (log.clone(), script.clone());
                tokio::spawn(serve(sock, log, script));
            }
        });
        Node { url, seen }
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut sock: TcpStream, log: Arc<Mutex<Vec<String>>>, script: Arc<Mutex<Vec<Reply>>>) {
    loop {
        let Some(request) = read_request(&mut sock).await else {
            return;
        };
        log.lock().unwrap().push(request);
        let reply = {
            let mut script = script.lock().unwrap();
            if script.is_empty() {
                Reply::Json("500 Internal Server Error", "{}")
            } else {
                script.remove(0)
            }
        };
        match reply {
            Reply::Drop => return,
            Reply::Json(status, body) => {
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if sock.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn client(nodes: &[&Node]) -> Client {
    let mut builder = Client::builder(&nodes[0].url);
    for node in &nodes[1..] {
        builder = builder.endpoint(&node.url);
    }
    builder.build().unwrap()
}

/// A URL on which nothing listens.
async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

const STATUS: &str =
    r#"{"lock":"l","epoch":3,"holder":"h","lease_id":null,"remaining_ms":5,"waiters":0}"#;
const WRITTEN: &str = r#"{"revision":7,"epoch":1}"#;
const LEASE: &str = r#"{"lock":"l","holder":"h","epoch":1,"token":"t","lease_id":"id","ttl_ms":60000,"lock_delay_ms":0}"#;
const UNAVAILABLE: &str = r#"{"error":{"code":"storage_failed","message":"etcd is unavailable"}}"#;

fn idempotency_key(request: &str) -> Option<String> {
    request.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("idempotency-key:")
            .map(|v| v.trim().to_owned())
    })
}

#[tokio::test]
async fn an_unreachable_node_is_skipped_and_the_next_answers() {
    let dead = dead_url().await;
    let live = Node::start(vec![Reply::Json("200 OK", STATUS)]).await;
    let client = Client::builder(&dead).endpoint(&live.url).build().unwrap();
    let status = client.lock_status("l").await.unwrap();
    assert_eq!(status.epoch, 3);
    // The next call starts from the node that answered.
    assert_eq!(client.base_url(), live.url);
}

#[tokio::test]
async fn a_503_moves_a_read_to_the_next_node() {
    let sick = Node::start(vec![Reply::Json("503 Service Unavailable", UNAVAILABLE)]).await;
    let well = Node::start(vec![Reply::Json("200 OK", STATUS)]).await;
    assert_eq!(
        client(&[&sick, &well])
            .lock_status("l")
            .await
            .unwrap()
            .epoch,
        3
    );
    assert_eq!((sick.requests().len(), well.requests().len()), (1, 1));
}

#[tokio::test]
async fn a_write_whose_answer_was_lost_is_resent_with_the_same_idempotency_key() {
    let lost = Node::start(vec![Reply::Drop]).await;
    let next = Node::start(vec![Reply::Json("200 OK", WRITTEN)]).await;
    let kv = client(&[&lost, &next]).fenced_kv("l", "t");
    let written = kv.put("k", "v").await.unwrap();
    assert_eq!(written.revision, 7);
    let (first, second) = (lost.requests(), next.requests());
    assert_eq!((first.len(), second.len()), (1, 1));
    let key = idempotency_key(&first[0]).expect("a client with several nodes keys its writes");
    assert_eq!(idempotency_key(&second[0]), Some(key));
}

#[tokio::test]
async fn a_write_without_a_key_on_one_node_is_not_resent_after_a_lost_answer() {
    // One endpoint: no automatic key, so a lost answer is the caller's to judge.
    let lost = Node::start(vec![Reply::Drop, Reply::Json("200 OK", WRITTEN)]).await;
    let kv = Client::new(&lost.url).unwrap().fenced_kv("l", "t");
    match kv.put("k", "v").await {
        Err(Error::Transport(_)) => {}
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert_eq!(lost.requests().len(), 1, "sent once");
    assert!(idempotency_key(&lost.requests()[0]).is_none());
}

#[tokio::test]
async fn an_acquire_whose_answer_was_lost_is_not_resent() {
    let lost = Node::start(vec![Reply::Drop]).await;
    let next = Node::start(vec![Reply::Json("200 OK", LEASE)]).await;
    let client = client(&[&lost, &next]);
    match client
        .acquire_raw("l", "h", AcquireOptions::default())
        .await
    {
        Err(Error::Transport(_)) => {}
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert_eq!(lost.requests().len(), 1);
    assert!(
        next.requests().is_empty(),
        "a second acquire would be a second lease"
    );
    // Nor is a session creation.
    let lost = Node::start(vec![Reply::Drop]).await;
    let next = Node::start(vec![]).await;
    let client2 = Client::builder(&lost.url)
        .endpoint(&next.url)
        .build()
        .unwrap();
    assert!(matches!(
        client2
            .create_session("h", std::time::Duration::from_secs(5))
            .await,
        Err(Error::Transport(_))
    ));
    assert!(next.requests().is_empty());
}

#[tokio::test]
async fn an_acquire_that_reached_no_node_or_got_503_moves_on() {
    let dead = dead_url().await;
    let sick = Node::start(vec![Reply::Json("503 Service Unavailable", UNAVAILABLE)]).await;
    let well = Node::start(vec![Reply::Json("200 OK", LEASE)]).await;
    let client = Client::builder(&dead)
        .endpoint(&sick.url)
        .endpoint(&well.url)
        .build()
        .unwrap();
    let lease = client
        .acquire_raw("l", "h", AcquireOptions::default())
        .await
        .unwrap();
    assert_eq!(lease.epoch, 1);
    assert_eq!((sick.requests().len(), well.requests().len()), (1, 1));
}

#[tokio::test]
async fn the_last_503_is_the_answer_when_every_node_is_sick() {
    let a = Node::start(vec![Reply::Json("503 Service Unavailable", UNAVAILABLE)]).await;
    let b = Node::start(vec![Reply::Json("503 Service Unavailable", UNAVAILABLE)]).await;
    assert!(matches!(
        client(&[&a, &b]).lock_status("l").await,
        Err(Error::StorageFailed)
    ));
}

#[tokio::test]
async fn endpoints_must_share_a_scheme() {
    let err = Client::builder("http://127.0.0.1:1")
        .endpoint("https://127.0.0.1:2")
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "config");
}

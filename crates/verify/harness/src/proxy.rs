//! The fault proxy: a userspace TCP relay between one worker and one upstream server.
//!
//! Every worker gets its own listener per upstream, so the nemesis can single one worker
//! out, as a network fault would: its requests can be **delayed** (bytes from the worker
//! are held for a while before they are forwarded, in order, so a write sent while the
//! worker held the lock can land after a newer holder's writes), its connections
//! **dropped** (every open connection cut at once, bytes held in the proxy discarded), or
//! it can be **partitioned** (open connections cut and new ones closed on arrival until
//! the partition heals).
//!
//! Only the worker-to-server direction is delayed: that is the direction in which a late
//! request does harm. Answers flow back at once. A proxy can be pointed at another server
//! ([`Proxy::retarget`]: an address moved to a promoted replica). Everything listens and
//! connects on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::VerifyError;

/// Bound on connecting to the upstream; a killed server refuses at once anyway.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The nemesis's handle on one worker's link. Cheap to share.
#[derive(Debug)]
pub struct Link {
    delay_ms: AtomicU64,
    partitioned: AtomicBool,
    /// Bumped to cut every open connection.
    cut: watch::Sender<u64>,
}

impl Link {
    fn new() -> Link {
        Link {
            delay_ms: AtomicU64::new(0),
            partitioned: AtomicBool::new(false),
            cut: watch::Sender::new(0),
        }
    }

    /// Holds every byte sent from now on for `delay` before forwarding it.
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Cuts every open connection (held bytes are lost with them).
    pub fn drop_connections(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Cuts open connections and refuses new ones until [`Link::heal`].
    pub fn partition(&self) {
        self.partitioned.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// Ends delays and partitions.
    pub fn heal(&self) {
        self.delay_ms.store(0, Ordering::SeqCst);
        self.partitioned.store(false, Ordering::SeqCst);
    }

    fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))
    }
}

/// A running relay. Dropping it stops the listener and every connection.
pub struct Proxy {
    addr: SocketAddr,
    link: Arc<Link>,
    /// Where new connections go ([`Proxy::retarget`]).
    upstream: Arc<Mutex<SocketAddr>>,
    tasks: JoinSet<()>,
}

impl Proxy {
    /// Listens on a free loopback port and relays to `upstream`, under `link`'s faults.
    pub async fn start(upstream: SocketAddr, link: Arc<Link>) -> Result<Proxy, VerifyError> {
        let (listener, addr) = crate::procs::loopback_listener("a proxy port").await?;
        let upstream = Arc::new(Mutex::new(upstream));
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(listener, upstream.clone(), link.clone()));
        Ok(Proxy {
            addr,
            link,
            upstream,
            tasks,
        })
    }

    /// Relays new connections to `upstream` from now on, and cuts the open ones: a
    /// floating address moved to another server (a promoted replica).
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream;
        self.link.drop_connections();
    }

    /// A link with no faults, to share between a worker's proxies.
    pub fn new_link() -> Arc<Link> {
        Arc::new(Link::new())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }

    /// Stops listening and cuts every connection, discarding held bytes.
    pub fn shutdown(&mut self) {
        self.link.drop_connections();
        self.tasks.abort_all();
    }
}

async fn accept_loop(listener: TcpListener, upstream: Arc<Mutex<SocketAddr>>, link: Arc<Link>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                // A failed accept (e.g. out of descriptors) loses one connection, which
                // the worker sees as a transport error; keep serving the others.
                let Ok((client, _)) = accepted else { continue };
                if link.partitioned.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = *upstream.lock().unwrap_or_else(|e| e.into_inner());
                connections.spawn(relay(client, upstream, link.clone()));
            }
            // Reap finished connections so the set does not grow over a long run.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Relays one connection until either side closes or the link cuts it.
async fn relay(client: TcpStream, upstream: SocketAddr, link: Arc<Link>) {
    let mut cut = link.cut.subscribe();
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
        Ok(Ok(s)) => s,
        // Server down: close the worker's connection, as a refused connect would.
        _ => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();

    let up = held(&mut client_rd, &mut server_wr, || link.delay());
    let down = async {
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
        let _ = client_wr.shutdown().await;
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.changed() => {}
    }
}

/// Relays `from` to `to` in order, each chunk read at once and held for `delay()` (read
/// when it arrives) before it is written; shuts `to` down once `from` ends.
async fn held(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    delay: impl Fn() -> Duration,
) {
    let (held_tx, mut held_rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if held_tx
                        .send((Instant::now() + delay(), buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        drop(held_tx);
    };
    let write = async {
        while let Some((release, bytes)) = held_rx.recv().await {
            tokio::time::sleep_until(release).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn relays_delays_and_partitions() {
        let upstream = echo_server().await;
        let proxy = Proxy::start(upstream, Proxy::new_link()).await.unwrap();
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");

        proxy.link().set_delay(Duration::from_millis(300));
        let started = std::time::Instant::now();
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");
        assert!(started.elapsed() >= Duration::from_millis(300));

        proxy.link().partition();
        assert!(round_trip(proxy.addr()).await.is_err());
        proxy.link().heal();
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");
    }

    /// A server that greets every connection with `tag` and keeps it open.
    async fn tag_server(tag: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = s.write_all(tag).await;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn retargeted_it_relays_to_the_new_upstream_and_cuts_the_old_connections() {
        let (old, new) = (tag_server(b"old").await, echo_server().await);
        let proxy = Proxy::start(old, Proxy::new_link()).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 3];
        open.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"old");

        proxy.retarget(new);
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");
        // The connection to the old upstream was cut, not left relaying to it (the old
        // server would hold it open for a minute).
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), open.read_to_end(&mut rest));
        assert!(matches!(read.await, Ok(Ok(0)) | Ok(Err(_))));
    }
}

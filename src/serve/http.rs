//! The HTTP listener: axum's router on hyper HTTP/1.1 connections, with the limits
//! that keep slow, stalled or greedy clients from holding the server:
//! - a read timeout for each request's headers, which also closes a keep-alive
//!   connection idle that long (the body has its own, in `api::read_json`);
//! - a cap on open connections, and a smaller one per client address, so that one
//!   client cannot hold them all; beyond either, new connections are closed at once;
//! - as the cap nears, the connection idle longest (no request in flight: a kept-alive
//!   connection between requests, or one that has not finished sending its first
//!   request's headers) is closed for each new one, so that idle sockets make way for
//!   clients with requests;
//! - on shutdown, a grace period for requests in flight, after which the connections
//!   still open are dropped (and their generations cancelled), so that shutdown, and
//!   the snapshot after it, never wait on a client.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Limits of the listener.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Longest wait for a request's headers (and the idle limit of a kept-alive
    /// connection).
    pub read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one client address.
    pub max_connections_per_client: usize,
    /// How long requests in flight may finish after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl HttpLimits {
    /// Open connections from which each new one closes the idlest: the last sixteenth
    /// of the cap (at least one slot).
    fn high_water(&self) -> usize {
        self.max_connections
            .saturating_sub((self.max_connections / 16).max(1))
    }
}

/// One open connection, as the listener tracks it.
struct Connection {
    peer: IpAddr,
    /// Requests in flight, from their headers to the end of their response body.
    busy: AtomicUsize,
    /// When a request last started or ended (or the connection opened), in ms since
    /// the listener started.
    last_active_ms: AtomicU64,
    /// Asks the connection to close if it is idle.
    close: Notify,
}

/// The open connections and their count per client address.
#[derive(Default)]
struct Connections {
    open: HashMap<u64, Arc<Connection>>,
    per_client: HashMap<IpAddr, usize>,
    next_id: u64,
}

/// Why a connection was not admitted.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// The server holds `max_connections`, none of them idle.
    Full,
    /// The client's address holds `max_connections_per_client`.
    ClientFull,
}

/// The table the listener admits connections through; a connection leaves it when its
/// [`Admitted`] guard drops.
struct Table {
    inner: Mutex<Connections>,
    started: Instant,
}

impl Table {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn len(&self) -> usize {
        self.inner.lock().expect("connections").open.len()
    }

    /// Admit a connection from `peer`, closing the idlest open one when the cap nears.
    fn admit(self: &Arc<Self>, peer: IpAddr, limits: &HttpLimits) -> Result<Admitted, Refusal> {
        let mut t = self.inner.lock().expect("connections");
        if t.per_client.get(&peer).copied().unwrap_or(0) >= limits.max_connections_per_client {
            return Err(Refusal::ClientFull);
        }
        if t.open.len() >= limits.high_water() {
            let idlest = t
                .open
                .values()
                .filter(|c| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|c| c.last_active_ms.load(Ordering::Relaxed));
            if let Some(c) = idlest {
                // It leaves the table when its task ends, a moment later.
                c.close.notify_one();
            }
        }
        if t.open.len() >= limits.max_connections.max(1) {
            return Err(Refusal::Full);
        }
        let connection = Arc::new(Connection {
            peer,
            busy: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
        });
        let id = t.next_id;
        t.next_id += 1;
        t.open.insert(id, connection.clone());
        *t.per_client.entry(peer).or_default() += 1;
        Ok(Admitted {
            table: self.clone(),
            id,
            connection,
        })
    }
}

/// A connection's place in the [`Table`], given back on drop.
struct Admitted {
    table: Arc<Table>,
    id: u64,
    connection: Arc<Connection>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut t = self.table.inner.lock().expect("connections");
        t.open.remove(&self.id);
        let peer = self.connection.peer;
        if let Some(n) = t.per_client.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                t.per_client.remove(&peer);
            }
        }
    }
}

/// A request in flight on a connection: counted from its headers to the end of its
/// response body (a streamed response is busy until its last event).
struct InFlight {
    table: Arc<Table>,
    connection: Arc<Connection>,
}

impl InFlight {
    fn start(table: &Arc<Table>, connection: &Arc<Connection>) -> Self {
        connection.busy.fetch_add(1, Ordering::AcqRel);
        connection
            .last_active_ms
            .store(table.now_ms(), Ordering::Relaxed);
        InFlight {
            table: table.clone(),
            connection: connection.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.connection
            .last_active_ms
            .store(self.table.now_ms(), Ordering::Relaxed);
        self.connection.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until it ends.
struct Tracked {
    body: axum::body::Body,
    _in_flight: InFlight,
}

impl Body for Tracked {
    type Data = <axum::body::Body as Body>::Data;
    type Error = <axum::body::Body as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serve `router` on `listener` until `shutdown` completes, then give requests in
/// flight `limits.shutdown_grace` to finish and return.
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let graceful = GracefulShutdown::new();
    let table = Arc::new(Table {
        inner: Mutex::default(),
        started: Instant::now(),
    });
    let (mut refused, mut refused_per_client) = (0u64, 0u64);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, most often: wait for some to close.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admitted = match table.admit(peer.ip(), &limits) {
            Ok(a) => a,
            Err(Refusal::Full) => {
                refused += 1;
                if refused.is_power_of_two() {
                    tracing::warn!(
                        "{} connections open (--max-connections), none idle: refused {refused} so far",
                        limits.max_connections
                    );
                }
                continue;
            }
            Err(Refusal::ClientFull) => {
                refused_per_client += 1;
                if refused_per_client.is_power_of_two() {
                    tracing::warn!(
                        "{} holds {} connections (--max-connections-per-client): refused {refused_per_client} from clients at their cap so far",
                        peer.ip(),
                        limits.max_connections_per_client
                    );
                }
                continue;
            }
        };
        let inner = TowerToHyperService::new(router.clone());
        let (for_requests, connection) = (table.clone(), admitted.connection.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            // Handlers that limit per client (the admin API's wrong tokens) read it here.
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let in_flight = InFlight::start(&for_requests, &connection);
            let response = hyper::service::Service::call(&inner, request);
            async move {
                let response = response.await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                }))
            }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            tokio::pin!(conn);
            loop {
                tokio::select! {
                    done = &mut conn => {
                        if let Err(e) = done {
                            tracing::debug!("connection closed: {e}");
                        }
                        break;
                    }
                    // Dropping an idle connection closes its socket; one that started a
                    // request since it was picked keeps going.
                    () = admitted.connection.close.notified() => {
                        if admitted.connection.busy.load(Ordering::Acquire) == 0 {
                            break;
                        }
                    }
                }
            }
            drop(admitted);
        });
    }
    drop(listener);
    tracing::info!(
        "shutting down: {} connections open, waiting up to {:.0} s for requests in flight",
        table.len(),
        limits.shutdown_grace.as_secs_f64()
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown grace period over: dropping {} connections still open",
            table.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpSocket, TcpStream};

    /// A listener on 0.0.0.0, so that clients can come from several loopback addresses.
    async fn start(limits: HttpLimits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_http(listener, router, limits, async {
            let _ = stopped.await;
        }));
        (([127, 0, 0, 1], port).into(), stop)
    }

    async fn connect_from(source: [u8; 4], to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
        let socket = TcpSocket::new_v4()?;
        socket.bind((source, 0).into())?;
        socket.connect(to).await
    }

    /// One GET from `source`, answered within `within`.
    async fn answered(source: [u8; 4], to: std::net::SocketAddr, within: Duration) -> bool {
        let exchange = async {
            let mut s = connect_from(source, to).await.ok()?;
            s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut answer = String::new();
            s.read_to_string(&mut answer).await.ok()?;
            Some(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"))
        };
        matches!(tokio::time::timeout(within, exchange).await, Ok(Some(true)))
    }

    fn limits(max: usize, per_client: usize) -> HttpLimits {
        HttpLimits {
            read_timeout: Duration::from_secs(30),
            max_connections: max,
            max_connections_per_client: per_client,
            shutdown_grace: Duration::from_secs(1),
        }
    }

    /// 1,100 idle sockets from one address hold at most its share; a request from
    /// another address is answered within a second, at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_client_s_idle_sockets_do_not_lock_out_another() {
        let (addr, _stop) = start(limits(1024, 512)).await;
        let mut idle = Vec::new();
        for _ in 0..1100 {
            idle.push(connect_from([127, 0, 0, 2], addr).await.unwrap());
        }
        // Let the listener take them all in.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        assert!(answered([127, 0, 0, 3], addr, Duration::from_secs(1)).await);
        assert!(t.elapsed() < Duration::from_secs(1));
        // Beyond its share, the flooding address itself is turned away.
        assert!(!answered([127, 0, 0, 2], addr, Duration::from_secs(1)).await);
        drop(idle);
    }

    /// With every slot held by idle sockets (from many addresses), a new client's
    /// request still gets in: the idlest is closed to make room.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_are_closed_first_when_the_cap_nears() {
        let (addr, _stop) = start(limits(32, 32)).await;
        let mut idle = Vec::new();
        for k in 0..32u8 {
            idle.push(connect_from([127, 0, 1, k], addr).await.unwrap());
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        for k in 0..8u8 {
            assert!(
                answered([127, 0, 2, k], addr, Duration::from_secs(1)).await,
                "request {k} got in"
            );
        }
        // The oldest idle sockets were the ones closed.
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut byte)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    }

    /// A connection with a request in flight is never the one closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_connection_is_not_closed_to_make_room() {
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let release = Arc::new(Notify::new());
        let wait = release.clone();
        let router = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(move || {
                    let wait = wait.clone();
                    async move {
                        wait.notified().await;
                        "slow"
                    }
                }),
            );
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_http(listener, router, limits(2, 2), async {
            let _ = stopped.await;
        }));
        let mut slow = connect_from([127, 0, 3, 1], addr).await.unwrap();
        slow.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The cap (2) nears at 1 open: the slow one is busy, so nothing is closed.
        assert!(answered([127, 0, 3, 2], addr, Duration::from_secs(1)).await);
        release.notify_one();
        let mut answer = String::new();
        slow.read_to_string(&mut answer).await.unwrap();
        assert!(answer.ends_with("slow"), "{answer}");
    }
}

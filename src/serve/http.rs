//! The HTTP listener: axum's router on hyper HTTP/1.1 connections, with the limits
//! that keep slow or stalled clients from holding the server:
//! - a read timeout for each request's headers, which also closes a keep-alive
//!   connection idle that long (the body has its own, in `api::read_json`);
//! - a cap on open connections: beyond it, new ones are closed at once;
//! - on shutdown, a grace period for requests in flight, after which the connections
//!   still open are dropped (and their generations cancelled), so that shutdown, and
//!   the snapshot after it, never wait on a client.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Limits of the listener.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Longest wait for a request's headers (and the idle limit of a kept-alive
    /// connection).
    pub read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long requests in flight may finish after a shutdown signal.
    pub shutdown_grace: Duration,
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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut refused = 0u64;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most often: wait for some to close.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "{} connections open (the limit): refused {refused} so far",
                    limits.max_connections
                );
            }
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection closed: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    let open = limits.max_connections - slots.available_permits();
    tracing::info!(
        "shutting down: {open} connections open, waiting up to {:.0} s for requests in flight",
        limits.shutdown_grace.as_secs_f64()
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown grace period over: dropping {} connections still open",
            limits.max_connections - slots.available_permits()
        );
    }
}

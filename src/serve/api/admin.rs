//! The admin API: snapshots and their jobs, stats, evictions and checks, behind
//! `SUFFIXD_ADMIN_TOKEN` ([`require_admin`], in front of every admin route).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::replicate::ReplicationStats;
use crate::store::EvictScope;
use crate::store::live::StoreStats;
use crate::store::live::now_ms;

use super::{ApiError, read_json};
use crate::serve::AppState;

/// The admin routes' one gate (a `route_layer` in [`crate::serve::router`]): a request
/// goes on to its handler only with the admin token, while the admin API is enabled and
/// wrong tokens are not arriving too fast from where it comes from.
pub async fn require_admin(
    State(app): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let source = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    match authorize(&app, request.headers(), source) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn authorize(app: &AppState, headers: &HeaderMap, source: Option<IpAddr>) -> Result<(), ApiError> {
    let Some(token) = &app.cfg.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "the admin API is disabled: set SUFFIXD_ADMIN_TOKEN to enable it",
        ));
    };
    let unauthorized = |what: &str| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            format!("{what} admin token: send Authorization: Bearer $SUFFIXD_ADMIN_TOKEN"),
        )
    };
    // A request without a token guesses nothing: it is not counted against its source.
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(unauthorized("missing"));
    };
    let source = AdminGuard::source_of(source);
    if !app.admin_guard.may_try(source) {
        let mut refusal = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "more than {} wrong admin tokens in the last second from {source}: its admin requests are refused until it has passed",
                AdminGuard::FAILURES_PER_SECOND
            ),
        );
        refusal.retry_after_s = Some(1);
        return Err(refusal);
    }
    if !same_secret(given.as_bytes(), token.as_bytes()) {
        app.admin_guard.failed(source);
        return Err(unauthorized("wrong"));
    }
    Ok(())
}

/// Whether `given` equals `secret`, in a time that depends on their lengths only, not on
/// where they first differ (which would let a client find the token byte by byte).
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != secret.len());
    for (i, &s) in secret.iter().enumerate() {
        diff |= s ^ given.get(i).copied().unwrap_or(!s);
    }
    std::hint::black_box(diff) == 0
}

/// A cap on wrong admin tokens per source: past [`AdminGuard::FAILURES_PER_SECOND`] in
/// one second, a source's admin requests are refused (429) for the rest of it, so
/// guessing runs at that rate rather than as fast as a connection carries requests,
/// and a guesser elsewhere does not lock the operator out. A source is an IPv4 address
/// or an IPv6 /64 (one host's share); past [`AdminGuard::SOURCES`] sources guessing at
/// once, the rest share one window.
#[derive(Default)]
pub struct AdminGuard {
    /// Each source's current one-second window and the failures in it.
    windows: std::sync::Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl AdminGuard {
    /// Wrong tokens allowed per second and source.
    pub const FAILURES_PER_SECOND: u32 = 20;
    /// Sources tracked at once.
    pub const SOURCES: usize = 4096;
    /// The shared window of sources past [`AdminGuard::SOURCES`] and of requests whose
    /// address is unknown.
    const SHARED: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

    fn source_of(peer: Option<IpAddr>) -> IpAddr {
        match peer.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V6(v6)) => {
                let host = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(host))
            }
            Some(v4) => v4,
            None => Self::SHARED,
        }
    }

    /// The window `source` counts in: its own, or the shared one when [`Self::SOURCES`]
    /// others are tracked.
    fn window_of(windows: &HashMap<IpAddr, (Instant, u32)>, source: IpAddr) -> IpAddr {
        if windows.len() >= Self::SOURCES && !windows.contains_key(&source) {
            Self::SHARED
        } else {
            source
        }
    }

    /// The failures counted against `source` in the current second.
    fn failures(&self, source: IpAddr) -> u32 {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get(&Self::window_of(&windows, source)) {
            Some((start, n)) if start.elapsed() < Duration::from_secs(1) => *n,
            _ => 0,
        }
    }

    fn may_try(&self, source: IpAddr) -> bool {
        self.failures(source) < Self::FAILURES_PER_SECOND
    }

    fn failed(&self, source: IpAddr) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let expired = |start: &Instant| start.elapsed() >= Duration::from_secs(1);
        if Self::window_of(&windows, source) == Self::SHARED {
            windows.retain(|_, (start, _)| !expired(start));
        }
        let key = Self::window_of(&windows, source);
        let window = windows.entry(key).or_insert((Instant::now(), 0));
        if expired(&window.0) {
            *window = (Instant::now(), 0);
        }
        window.1 += 1;
    }
}

/// `POST /admin/snapshot` and `POST /admin/compact`: start in the background, answer 202
/// with a job to poll.
pub async fn admin_snapshot(State(app): State<Arc<AppState>>) -> Response {
    let job = app.start_snapshot_job();
    (
        StatusCode::ACCEPTED,
        Json(json!({"job": job, "status": "running", "poll": format!("/admin/jobs/{job}")})),
    )
        .into_response()
}

/// `GET /admin/jobs/{id}`.
pub async fn admin_job(State(app): State<Arc<AppState>>, UrlPath(id): UrlPath<u64>) -> Response {
    match app.jobs_status.lock().expect("jobs").get(&id) {
        Some(v) => Json(v.clone()).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no job {id}"),
        )
        .into_response(),
    }
}

/// `GET /admin/stats`.
pub async fn admin_stats(State(app): State<Arc<AppState>>) -> Response {
    Json(AdminStats {
        store: app.store.stats(),
        serving: app.metrics.summary(),
        cost_curve: app.metrics.cost_curve(),
        replication: app.replication.as_ref().map(|r| r.stats(&app.store)),
    })
    .into_response()
}

/// Body of `GET /admin/stats`: the store's figures, with the serving ones beside them.
#[derive(Serialize)]
struct AdminStats {
    #[serde(flatten)]
    store: StoreStats,
    serving: serde_json::Value,
    cost_curve: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    replication: Option<ReplicationStats>,
}

/// Body of `POST /admin/evict`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvictRequest {
    namespace: Option<String>,
    id: Option<u64>,
    /// Evict everything not used for this many seconds.
    older_than_s: Option<u64>,
}

impl EvictRequest {
    /// What to evict; `None` for a combination the API does not take.
    fn scope(self, now_ms: u64) -> Option<EvictScope> {
        match (self.namespace, self.id, self.older_than_s) {
            (Some(namespace), Some(id), None) => Some(EvictScope::Id { namespace, id }),
            (Some(namespace), None, None) => Some(EvictScope::Namespace { namespace }),
            // An age past the epoch evicts nothing, however large.
            (None, None, Some(s)) => Some(EvictScope::UnusedSince {
                cutoff_ms: now_ms.saturating_sub(s.saturating_mul(1000)),
            }),
            _ => None,
        }
    }
}

/// `POST /admin/evict`: by id (with its namespace), a whole namespace, or by age.
pub async fn admin_evict(State(app): State<Arc<AppState>>, body: Body) -> Response {
    let req: EvictRequest = match read_json(body, 64 << 10, app.cfg.read_timeout()).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Some(namespace) = &req.namespace
        && let Err(e) = super::openai::check_namespace(namespace)
    {
        return e.into_response();
    }
    let Some(scope) = req.scope(now_ms()) else {
        return ApiError::bad_request(
            "give {\"namespace\", \"id\"}, {\"namespace\"} or {\"older_than_s\"}",
        )
        .into_response();
    };
    let app2 = app.clone();
    let result = tokio::task::spawn_blocking(move || {
        let evicted = app2.store.evict(&scope).map_err(|e| e.to_string())?;
        // An operator's eviction reaches every replica: it is written down before the
        // answer, and goes out when NATS can take it.
        if let Some(r) = &app2.replication {
            r.evicted(scope).map_err(|e| {
                format!("evicted {evicted} here, but not sent to the other replicas: {e}. Retry the eviction")
            })?;
        }
        Ok::<usize, String>(evicted)
    })
    .await;
    match result {
        Ok(Ok(n)) => Json(json!({"evicted": n})).into_response(),
        Ok(Err(e)) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e).into_response()
        }
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
        .into_response(),
    }
}

/// `GET /admin/verify`: check the current snapshot completely.
pub async fn admin_verify(State(app): State<Arc<AppState>>) -> Response {
    let store = app.store.clone();
    match tokio::task::spawn_blocking(move || store.verify()).await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => (
            StatusCode::OK,
            Json(json!({"ok": false, "error": e.to_string()})),
        )
            .into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(AdminGuard::source_of(Some(v4)), v4);
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(AdminGuard::source_of(Some(mapped)), v4);
        let (a, b): (IpAddr, IpAddr) = (
            "2001:db8:1:2::1".parse().unwrap(),
            "2001:db8:1:2:ffff::9".parse().unwrap(),
        );
        assert_eq!(
            AdminGuard::source_of(Some(a)),
            AdminGuard::source_of(Some(b))
        );
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_ne!(
            AdminGuard::source_of(Some(a)),
            AdminGuard::source_of(Some(other))
        );
        assert_eq!(AdminGuard::source_of(None), AdminGuard::SHARED);
    }

    #[test]
    fn one_source_guessing_does_not_lock_out_another() {
        let guard = AdminGuard::default();
        let (guesser, operator): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..AdminGuard::FAILURES_PER_SECOND {
            assert!(guard.may_try(guesser));
            guard.failed(guesser);
        }
        assert!(!guard.may_try(guesser));
        assert!(guard.may_try(operator));
    }

    #[test]
    fn sources_past_the_cap_share_one_window() {
        let guard = AdminGuard::default();
        for i in 0..AdminGuard::SOURCES as u32 {
            guard.failed(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        let late: IpAddr = "192.0.2.9".parse().unwrap();
        for _ in 0..AdminGuard::FAILURES_PER_SECOND {
            guard.failed(late);
        }
        assert_eq!(guard.windows.lock().unwrap().len(), AdminGuard::SOURCES + 1);
        assert!(
            !guard.may_try(late),
            "the late source's failures filled the shared window"
        );
        assert!(!guard.may_try("192.0.2.10".parse().unwrap()));
        assert!(guard.may_try(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000))));
    }
}

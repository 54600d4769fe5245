//! The admin API: snapshots and their jobs, stats, evictions and checks, behind
//! `SUFFIXD_ADMIN_TOKEN` ([`require_admin`], in front of every admin route).

use std::net::IpAddr;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::replicate::ReplicationStats;
use crate::store::EvictScope;
use crate::store::live::StoreStats;
use crate::store::live::now_ms;

use super::secrets::{GuessGuard, bearer, same_secret};
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
    let source = GuessGuard::source_of_request(&request);
    match authorize(&app, request.headers(), source) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn authorize(app: &AppState, headers: &HeaderMap, source: IpAddr) -> Result<(), ApiError> {
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
    let Some(given) = bearer(headers) else {
        return Err(unauthorized("missing"));
    };
    if let Some(refusal) = app.admin_guard.refusal(source, "admin token") {
        return Err(refusal);
    }
    if !same_secret(given.as_bytes(), token.as_bytes()) {
        app.admin_guard.failed(source);
        return Err(unauthorized("wrong"));
    }
    Ok(())
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

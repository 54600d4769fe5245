//! `GET /health` (liveness) and `GET /ready` (readiness), for supervisors and load
//! balancers. Both answer JSON: `{"status": "ok"}` with 200, or `{"status": .., "reason":
//! ..}` with 503.
//!
//! - Healthy: the model thread runs and has shown progress (finished a step, or an idle
//!   wait) within `--stall-limit-s`. A process that is not healthy should be restarted;
//!   one whose model thread died exits non-zero by itself.
//! - Ready: healthy, and not draining (a shutdown signal turns it off first, for
//!   `--drain-delay-s`, while requests are still served). The model is loaded and the
//!   store open before the server listens, so a server that answers is otherwise ready.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::serve::AppState;

/// Why the server is not healthy, if it is not.
fn unhealthy(since_beat: Option<Duration>, limit: Duration) -> Option<String> {
    match since_beat {
        None => Some("the model thread has stopped".into()),
        Some(quiet) if quiet > limit => Some(format!(
            "the model thread has shown no progress for {:.0} s (--stall-limit-s {})",
            quiet.as_secs_f64(),
            limit.as_secs()
        )),
        Some(_) => None,
    }
}

fn answer(problem: Option<String>) -> Response {
    match problem {
        None => Json(json!({"status": "ok"})).into_response(),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": reason})),
        )
            .into_response(),
    }
}

fn health_problem(app: &AppState) -> Option<String> {
    unhealthy(
        app.liveness.since_beat(),
        Duration::from_secs(app.cfg.stall_limit_s),
    )
}

/// `GET /health`: 200 while the model thread makes progress, else 503.
pub async fn health(State(app): State<Arc<AppState>>) -> Response {
    answer(health_problem(&app))
}

/// `GET /ready`: 200 while healthy and not draining, else 503.
pub async fn ready(State(app): State<Arc<AppState>>) -> Response {
    let problem = health_problem(&app).or_else(|| {
        app.draining
            .load(Ordering::Relaxed)
            .then(|| "draining: the server is shutting down".to_string())
    });
    answer(problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_or_stalled_model_thread_is_unhealthy() {
        let limit = Duration::from_secs(120);
        assert_eq!(unhealthy(Some(Duration::from_secs(3)), limit), None);
        assert!(unhealthy(None, limit).unwrap().contains("stopped"));
        let stalled = unhealthy(Some(Duration::from_secs(121)), limit).unwrap();
        assert!(stalled.contains("121 s"), "{stalled}");
    }
}

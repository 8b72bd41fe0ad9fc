//! The admin listener: its own address (loopback by default), never the proxy port.
//!
//! - `GET /healthz` — alive (no auth). It and `/readyz` answer even when the listener
//!   is at `limits.admin_max_connections`: [`PROBE_CONNECTIONS`] more connections are
//!   kept for them alone (one request each, sent within 2 s of connecting).
//! - `GET /readyz` — 200 while the store answers; 503 when it does not (the proxy keeps
//!   serving: fail-open) (no auth; the store's error text only with the admin token).
//! - `GET /metrics` — Prometheus/OpenMetrics text, every metric `abridge_*` (no auth:
//!   scrapers sit on the private admin network).
//! - `GET /admin/` — the dashboard page (static; it asks for the token and keeps it in
//!   the tab's sessionStorage; every number comes from the token-guarded API), served
//!   with a Content-Security-Policy that allows only its own script and style, and no
//!   framing or sniffing.
//! - `/admin/*` — `Authorization: Bearer <admin.token>` (constant-time compare); wrong or
//!   missing → 401; more than `admin.auth_failures_per_minute` wrong tokens from one
//!   address → 429 for its further wrong tokens for the rest of that minute (the right
//!   token is never refused); no token configured → 403 saying how:
//!   `GET stats`, `GET compactions`, `GET conversations`, `GET|DELETE conversations/{id}`,
//!   `POST conversations/{id}/compact`, `POST preview`, `GET|DELETE windows`
//!   (`?model=<name>`: the learned context windows, one model's or all forgotten).
//!
//! This module: the router, the admin-token check and its per-address limiter. The
//! handlers: [`metrics`] (health, readiness, `/metrics`, the dashboard page), [`api`]
//! (stats, compactions, conversations, scheduling, learned windows) and [`preview`].

mod api;
mod metrics;
mod preview;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use self::api::{
    compactions, conversation, conversations, delete_conversation, forget_windows,
    schedule_compaction, stats, windows,
};
use self::metrics::{dashboard, healthz, metrics, readyz, registry};
use self::preview::preview;
use crate::AppState;
use crate::error::Error;

pub fn router(state: AppState) -> Router {
    let registry = Arc::new(registry(&state));
    let guarded = Router::new()
        .route("/admin/stats", get(stats))
        .route("/admin/compactions", get(compactions))
        .route("/admin/conversations", get(conversations))
        .route(
            "/admin/conversations/{id}",
            get(conversation).delete(delete_conversation),
        )
        .route(
            "/admin/conversations/{id}/compact",
            post(schedule_compaction),
        )
        .route("/admin/preview", post(preview))
        .route("/admin/windows", get(windows).delete(forget_windows))
        .route_layer(middleware::from_fn_with_state(
            Admin {
                state: state.clone(),
                failures: Arc::new(Failures::new(state.config().admin.auth_failures_per_minute)),
            },
            authorize,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(move || metrics(registry.clone())))
        .route("/admin", get(dashboard))
        .route("/admin/", get(dashboard))
        .merge(guarded)
        .fallback(not_found)
        .with_state(state)
}

/// Connections the admin listener keeps beyond `limits.admin_max_connections` for
/// health and readiness probes alone.
pub const PROBE_CONNECTIONS: usize = 8;

/// What the admin listener's reserved connections serve: `/healthz` and `/readyz`, and
/// for anything else the 503 a connection over the cap gets.
pub fn probes(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async { Error::Overloaded("limits.admin_max_connections") })
        .with_state(state)
}

/// `/admin/*` needs `Authorization: Bearer <admin.token>`. A client address that
/// presents more than `admin.auth_failures_per_minute` wrong tokens is answered 429 for
/// every further wrong (or missing) token until its minute is over; the right token is
/// always let in.
async fn authorize(
    State(admin): State<Admin>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &admin.state.config().admin.token else {
        return admin_error(
            StatusCode::FORBIDDEN,
            "The admin API is disabled: set admin.token in the configuration (or ABRIDGE_ADMIN__TOKEN) to a long random string.",
            "admin_disabled",
        );
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    // The right token is never refused: the limit is for guessing, and anyone behind
    // the same address (an ingress, a NAT) could otherwise lock the operator out.
    if presented.is_some_and(|p| token.matches(p)) {
        return next.run(request).await;
    }
    if admin.failures.locked(peer.ip()) {
        let mut response = admin_error(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many wrong admin tokens from this address; wait a minute.",
            "too_many_attempts",
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        return response;
    }
    // Only a token that was presented and is wrong counts towards the limit.
    if presented.is_some() {
        admin.failures.failed(peer.ip());
        tracing::warn!(%peer, "wrong admin token");
    }
    let mut response = admin_error(
        StatusCode::UNAUTHORIZED,
        "Missing or wrong admin token (Authorization: Bearer <admin.token>).",
        "unauthorized",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Whether a request carries the right admin token (for what anyone may ask but only
/// an operator may read in detail).
fn is_operator(state: &AppState, headers: &HeaderMap) -> bool {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    match (&state.config().admin.token, presented) {
        (Some(token), Some(p)) => token.matches(p),
        _ => false,
    }
}

/// The state of the guarded routes' middleware.
#[derive(Clone)]
struct Admin {
    state: AppState,
    failures: Arc<Failures>,
}

/// Wrong admin tokens per client address, in the current minute of each (std mutex:
/// map operations only, never held across an `.await`; bounded, oldest dropped).
struct Failures {
    per_minute: u32,
    seen: std::sync::Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Failures {
    const MAX_ADDRESSES: usize = 10_000;

    fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            seen: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn locked(&self, ip: IpAddr) -> bool {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.get(&ip).is_some_and(|(since, n)| {
            since.elapsed() < Duration::from_secs(60) && *n >= self.per_minute
        })
    }

    fn failed(&self, ip: IpAddr) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= Self::MAX_ADDRESSES && !seen.contains_key(&ip) {
            seen.retain(|_, (since, _)| since.elapsed() < Duration::from_secs(60));
            if seen.len() >= Self::MAX_ADDRESSES {
                seen.clear();
            }
        }
        let entry = seen.entry(ip).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= Duration::from_secs(60) {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

fn admin_error(status: StatusCode, message: &str, code: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}});
    (status, axum::Json(body)).into_response()
}

async fn not_found(request: Request) -> Error {
    Error::NotFound {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

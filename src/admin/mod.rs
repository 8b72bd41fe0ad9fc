//! The admin listener: its own address (loopback by default), never the proxy port.
//!
//! - `GET /healthz` — alive (no auth).
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
//!   address → 429 for the rest of that minute; no token configured → 403 saying how:
//!   `GET stats`, `GET compactions`, `GET conversations`, `GET|DELETE conversations/{id}`,
//!   `POST conversations/{id}/compact`, `POST preview`.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::chat;
use crate::compactor::{self, Reason, Turn};
use crate::config::Anonymous;
use crate::controls::Controls;
use crate::error::Error;
use crate::identity::{self, Fingerprint};
use crate::headers::Credentials;
use crate::server::AppState;
use crate::store::{Checkpoint, Store, now_ms};

const DASHBOARD: &str = include_str!("dashboard.html");

/// Conversations used within this window count as active.
const ACTIVE_WINDOW_MS: u64 = 3600 * 1000;

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

/// The metrics registry: the request-path counters plus what is read at scrape time
/// (store health, background queue).
fn registry(state: &AppState) -> Registry {
    let mut registry = Registry::default();
    state.stats().register(&mut registry);
    registry.register_collector(Box::new(ScrapeTime {
        store: state.store().clone(),
        compactor: state.compactor().clone(),
    }));
    registry
}

/// Metrics whose value lives elsewhere, read when scraped.
struct ScrapeTime {
    store: Store,
    compactor: Arc<compactor::Compactor>,
}

impl std::fmt::Debug for ScrapeTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeTime")
    }
}

impl prometheus_client::collector::Collector for ScrapeTime {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let healthy = ConstGauge::new(i64::from(self.store.is_healthy()));
        healthy.encode(encoder.encode_descriptor(
            "abridge_store_healthy",
            "1 while the store answers, 0 while abridge runs without it (fail-open)",
            None,
            healthy.metric_type(),
        )?)?;
        let errors = ConstCounter::new(self.store.errors());
        errors.encode(encoder.encode_descriptor(
            "abridge_store_errors",
            "Store calls that failed, timed out or were skipped while it was down",
            None,
            errors.metric_type(),
        )?)?;
        let pending =
            ConstGauge::new(i64::try_from(self.compactor.pending_jobs()).unwrap_or(i64::MAX));
        pending.encode(encoder.encode_descriptor(
            "abridge_background_pending",
            "Background compactions queued or running",
            None,
            pending.metric_type(),
        )?)?;
        Ok(())
    }
}

/// `/admin/*` needs `Authorization: Bearer <admin.token>`. A client address that
/// presents more than `admin.auth_failures_per_minute` wrong tokens is answered 429
/// (right tokens included) until its minute is over.
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
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if !presented.is_some_and(|p| token.matches(p)) {
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
        return response;
    }
    next.run(request).await
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

/// Alive: the process answers. Needs no token.
async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}

/// Ready: the store answers. A degraded store does not stop the proxy (fail-open), but
/// an orchestrator should know. The reason (`last_error`) is shown only with the admin
/// token. Asks the store once if it looks down, so a recovered
/// store reports ready without waiting for traffic.
async fn readyz(State(state): State<AppState>, request_headers: HeaderMap) -> Response {
    let store = state.store();
    if !store.is_healthy() {
        let _ = store.active_since(now_ms()).await;
    }
    // Read once, so the status code and the body cannot disagree.
    let healthy = store.is_healthy();
    // The store's own error text (addresses, Redis messages) only for the operator.
    let last_error = if is_operator(&state, &request_headers) {
        store.last_error()
    } else {
        None
    };
    let body = json!({
        "status": if healthy { "ready" } else { "degraded" },
        "store": {"backend": store.backend_name(), "healthy": healthy, "last_error": last_error},
    });
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(registry: Arc<Registry>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => Error::Internal("encoding metrics".to_owned()).into_response(),
    }
}

/// The dashboard page, with headers that keep it from being framed, sniffed or made to
/// run anything but its own inline script (the script and style are pinned by hash).
async fn dashboard() -> Response {
    static CSP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let csp = CSP.get_or_init(|| {
        let hash = |tag: &str| {
            let open = format!("<{tag}>");
            let close = format!("</{tag}>");
            let body = DASHBOARD
                .split_once(&open)
                .and_then(|(_, rest)| rest.split_once(&close))
                .map_or("", |(inner, _)| inner);
            use base64::Engine as _;
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(body.as_bytes());
            format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest))
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash("script"),
            hash("style")
        )
    });
    let mut response = Html(DASHBOARD).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, value);
    }
    for (name, value) in [
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn stats(State(state): State<AppState>) -> Response {
    let store = state.store();
    let active = store
        .active_since(now_ms().saturating_sub(ACTIVE_WINDOW_MS))
        .await
        .ok();
    let body = json!({
        "uptime_secs": state.started().elapsed().as_secs(),
        "store": {
            "backend": store.backend_name(),
            "healthy": store.is_healthy(),
            "errors": store.errors(),
            "last_error": store.last_error(),
        },
        "active_conversations": active,
        "background_pending": state.compactor().pending_jobs(),
        "counters": state.stats().snapshot(),
        "compaction": {
            "mode": state.config().compaction.mode,
            "strategy": state.config().compaction.strategy,
            "threshold_tokens": state.config().compaction.threshold_tokens,
            "threshold_ratio": state.config().compaction.threshold_ratio,
        },
    });
    axum::Json(body).into_response()
}

async fn compactions(State(state): State<AppState>) -> Response {
    axum::Json(json!({"compactions": state.compactor().recent_compactions()})).into_response()
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    50
}

/// Recent conversations (most recent first), each with its state.
async fn conversations(State(state): State<AppState>, Query(page): Query<Page>) -> Response {
    let limit = page.limit.min(500);
    let store = state.store();
    let recent = match store.recent(page.offset, limit).await {
        Ok(recent) => recent,
        Err(e) => return store_error(&e),
    };
    let mut items = Vec::with_capacity(recent.len());
    for r in recent {
        let loaded = store.load(&r.conversation).await.ok();
        let state = loaded.as_ref().and_then(|l| l.state.as_ref());
        // The latest report among its histories.
        let latest = loaded.as_ref().and_then(|l| l.usage.first());
        items.push(json!({
            "id": r.conversation,
            "last_seen_ms": r.last_seen_ms,
            "tokens": latest.map(|u| u.tokens),
            "messages": latest.map(|u| u.messages),
            "histories": loaded.as_ref().map(|l| l.usage.len()),
            "compactions": state.map(|s| s.compactions),
            "checkpoints": loaded.as_ref().map(|l| l.checkpoints.len()),
        }));
    }
    axum::Json(json!({"offset": page.offset, "limit": limit, "conversations": items}))
        .into_response()
}

fn no_such_conversation() -> Response {
    admin_error(
        StatusCode::NOT_FOUND,
        "No such conversation (ids are 64 hex digits).",
        "not_found",
    )
}

fn store_error(e: &crate::store::StoreError) -> Response {
    admin_error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("The store did not answer: {e}"),
        "store_unavailable",
    )
}

/// A checkpoint as the admin API shows it: what it covers, how big, and its text.
fn checkpoint_json(c: &Checkpoint) -> Value {
    let replacement: Vec<Value> = c
        .replacement
        .iter()
        .map(|r| serde_json::from_str(r.get()).unwrap_or(Value::Null))
        .collect();
    json!({
        "through": c.through,
        "head": c.head,
        "messages_replaced": c.messages_replaced(),
        "strategy": c.strategy,
        "fallback": c.fallback,
        "tokens_before": c.tokens_before,
        "tokens_after": c.tokens_after,
        "replacement_bytes": c.replacement_bytes(),
        "created_ms": c.created_ms,
        "summary": c.summary,
        "replacement": replacement,
    })
}

async fn conversation(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    let loaded = match state.store().load(&id).await {
        Ok(loaded) => loaded,
        Err(e) => return store_error(&e),
    };
    let Some(s) = &loaded.state else {
        return no_such_conversation();
    };
    let body = json!({
        "id": id,
        "state": {
            "scheduled": s.scheduled,
            "compactions": s.compactions,
            "last_seen_ms": s.last_seen_ms,
        },
        // Each history's last report, newest first.
        "usage": loaded.usage.iter().map(|u| json!({
            "prefix": u.prefix,
            "messages": u.messages,
            "tokens": u.tokens,
            "applied": u.applied,
            "head_tokens": u.head_tokens,
            "growth": u.growth,
            "at_ms": u.at_ms,
        })).collect::<Vec<_>>(),
        "checkpoints": loaded.checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>(),
    });
    axum::Json(body).into_response()
}

async fn delete_conversation(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    match state.store().delete(&id).await {
        Ok(true) => {
            tracing::info!(conversation = %id, "conversation deleted by an operator");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => no_such_conversation(),
        Err(e) => store_error(&e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CompactRequest {
    /// What a summary should keep in particular detail.
    #[serde(default)]
    focus: Option<String>,
}

/// Recompaction happens at the conversation's next turn: abridge keeps checkpoints, not
/// the conversation itself, so the next request (which carries the whole history) is
/// compacted, forced, with the focus for a summarising strategy.
async fn schedule_compaction(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    let request: CompactRequest = if body.is_empty() {
        CompactRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return admin_error(
                    StatusCode::BAD_REQUEST,
                    &format!("Invalid body: {e}"),
                    "invalid_body",
                );
            }
        }
    };
    let focus = request.focus.unwrap_or_default();
    match state.store().schedule_compaction(&id, &focus).await {
        Ok(true) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"scheduled": true, "at": "next turn", "focus": focus})),
        )
            .into_response(),
        Ok(false) => no_such_conversation(),
        Err(e) => store_error(&e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewRequest {
    /// A chat-completions request body.
    request: Value,
    /// The headers it would carry: the tenant header (e.g. `authorization`) and any
    /// `x-abridge-*` controls.
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct PreviewPlan {
    head: u32,
    through: u32,
    strategy: String,
    fallback: Option<String>,
    tokens_before: u64,
    tokens_after: u64,
}

/// What abridge would forward for a request, without forwarding it or storing anything.
/// A strategy that needs a summary calls the summariser, as the request would.
async fn preview(State(state): State<AppState>, body: Bytes) -> Response {
    let preview: PreviewRequest = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid body: {e}"),
                "invalid_body",
            );
        }
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &preview.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid header {name}"),
                "invalid_header",
            );
        };
        headers.insert(name, value);
    }
    let controls = match Controls::from_headers(&headers, state.config().compaction.allowed()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let bytes = match serde_json::to_vec(&preview.request) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid request: {e}"),
                "invalid_body",
            );
        }
    };
    let parsed = match chat::parse(&bytes) {
        Ok(p) => p,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Not a chat request abridge understands: {e}"),
                "unparseable",
            );
        }
    };
    crate::headers::strip_request(&mut headers);
    let credentials = Credentials::from_headers(
        &headers,
        state.config().identity.tenant_headers.iter().map(|h| &h.0),
    );
    let key = state.identity_key().await;
    let anonymous_refused =
        credentials.is_empty() && state.config().identity.anonymous == Anonymous::None;
    let identified = key.filter(|_| !anonymous_refused).and_then(|key| {
        identity::identify(
            &key,
            &credentials.tenant(),
            controls.conversation.as_deref().map(str::as_bytes),
            &parsed.messages,
        )
    });
    let loaded = match &identified {
        Some(i) => state.store().load(&i.conversation).await.ok(),
        None => None,
    };
    let turn = Turn::new(
        &parsed,
        identified.as_ref(),
        loaded.as_ref(),
        &controls,
        &credentials,
        bytes.len(),
    );
    let decision = state.compactor().plan(&turn, Reason::Preview).await;
    let forwarded: Vec<Value> = match &decision.apply {
        Some(c) => compactor::forwarded(&parsed.messages, c)
            .into_iter()
            .map(|raw| serde_json::from_str(raw.get()).unwrap_or(Value::Null))
            .collect(),
        None => parsed
            .messages
            .iter()
            .map(|m| serde_json::from_str(m.raw.get()).unwrap_or(Value::Null))
            .collect(),
    };
    let plan = decision.apply.as_ref().map(|c| PreviewPlan {
        head: c.head,
        through: c.through,
        strategy: c.strategy.to_string(),
        fallback: c.fallback.clone(),
        tokens_before: c.tokens_before,
        tokens_after: c.tokens_after,
    });
    let mut report_headers = HeaderMap::new();
    decision.report.write(&mut report_headers);
    let report: BTreeMap<&str, &str> = report_headers
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        .collect();
    axum::Json(json!({
        "compacted": decision.report.compacted,
        "messages": forwarded,
        "plan": plan,
        "estimate": decision.estimate,
        "threshold": decision.threshold,
        "conversation": identified.as_ref().map(|i| i.conversation),
        "headers": report,
    }))
    .into_response()
}

async fn not_found(request: Request) -> Error {
    Error::NotFound {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

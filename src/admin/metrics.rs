//! The admin listener's open routes: `/healthz`, `/readyz`, `/metrics` (the registry,
//! with the figures read at scrape time) and the dashboard page with its security
//! headers.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde_json::json;

use super::is_operator;
use crate::AppState;
use crate::compactor;
use crate::error::Error;
use crate::store::{Store, now_ms};

const DASHBOARD: &str = include_str!("dashboard.html");

/// The metrics registry: the request-path counters plus what is read at scrape time
/// (store health, background queue).
pub(super) fn registry(state: &AppState) -> Registry {
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

/// Alive: the process answers. Needs no token.
pub(super) async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}

/// Ready: the store answers. A degraded store does not stop the proxy (fail-open), but
/// an orchestrator should know. The reason (`last_error`) is shown only with the admin
/// token. Asks the store once if it looks down, so a recovered
/// store reports ready without waiting for traffic.
pub(super) async fn readyz(State(state): State<AppState>, request_headers: HeaderMap) -> Response {
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

pub(super) async fn metrics(registry: Arc<Registry>) -> Response {
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
pub(super) async fn dashboard() -> Response {
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

//! The admin listener (its own address, loopback by default): `/healthz` now; stats,
//! metrics and conversation inspection arrive with later issues.

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::get;
use http::header;

use crate::error::Error;
use crate::server::AppState;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(state)
}

/// Alive: the process answers. Needs no token.
async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}

async fn not_found(request: Request) -> Error {
    Error::NotFound {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

//! Wiring: the proxy router, and `run`, which serves the proxy and admin listeners until
//! shutdown and then drains.

use std::future::Future;

use axum::Router;
use axum::routing::post;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::state::AppState;
use crate::{admin, provider_apis, proxy, serve, websocket};

/// The proxy's routes: chat completions, Responses and Anthropic Messages are read —
/// chat completions and Responses also at Azure OpenAI's paths (the v1 base, the classic
/// deployment path and the classic preview Responses path; see [`crate::azure`]);
/// everything else (other methods on those paths included) passes through. Where
/// abridge serves the provider compaction APIs ([`provider_apis::serves`]),
/// `/responses/compact` is answered too; where it serves Anthropic's
/// ([`provider_apis::messages::serves`]), `/v1/messages/count_tokens` counts what
/// `/v1/messages` would forward ([`proxy::count_tokens`]). A WebSocket handshake on the Responses paths is
/// relayed or refused ([`websocket`]).
pub fn router(state: AppState) -> Router {
    let chat = || post(proxy::chat).fallback(proxy::passthrough);
    let responses = || {
        post(proxy::responses)
            .get(websocket::responses_get)
            .fallback(proxy::passthrough)
    };
    let mut router = Router::new();
    if provider_apis::serves(state.config()) {
        let compact = || post(proxy::compact).fallback(proxy::passthrough);
        router = router
            .route("/v1/responses/compact", compact())
            .route("/openai/v1/responses/compact", compact());
    }
    if provider_apis::messages::serves(state.config()) {
        let count = post(proxy::count_tokens).fallback(proxy::passthrough);
        router = router.route("/v1/messages/count_tokens", count);
    }
    router
        .route("/v1/chat/completions", chat())
        .route("/openai/v1/chat/completions", chat())
        .route("/openai/deployments/{deployment}/chat/completions", chat())
        .route("/v1/responses", responses())
        .route("/openai/v1/responses", responses())
        .route("/openai/responses", responses())
        .route(
            "/v1/messages",
            post(proxy::messages).fallback(proxy::passthrough),
        )
        .fallback(proxy::passthrough)
        .with_state(state)
}

/// Bound listeners; the caller binds (tests bind `127.0.0.1:0`).
pub struct Listeners {
    pub proxy: TcpListener,
    pub admin: TcpListener,
}

/// Serves both listeners until `shutdown` completes, then stops accepting and lets
/// in-flight requests finish for up to `timeouts.shutdown_grace_ms`.
pub async fn run(
    listeners: Listeners,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = state.config().timeouts.shutdown_grace();
    let (stop, stopped) = watch::channel(());
    let config = state.config();
    let bounds = |max_connections, max_inflight| serve::Bounds {
        header: config.timeouts.client_header(),
        idle: config.timeouts.client_idle(),
        max_connections,
        max_inflight,
    };
    let proxy_bounds = bounds(
        config.limits.max_connections,
        config.limits.max_inflight_requests,
    );
    let admin_bounds = bounds(
        config.limits.admin_max_connections,
        config.limits.admin_max_inflight_requests,
    );
    let proxy = serve::serve(
        listeners.proxy,
        router(state.clone()),
        proxy_bounds,
        None,
        stopped.clone(),
    );
    let mut workers = state.compactor().start_background(stopped.clone());
    // Health and readiness answer even when the admin cap is full (see `serve`).
    let probes = serve::Reserve {
        router: admin::probes(state.clone()),
        connections: admin::PROBE_CONNECTIONS,
    };
    let admin = serve::serve(
        listeners.admin,
        admin::router(state.clone()),
        admin_bounds,
        Some(probes),
        stopped,
    );
    let servers = async move { tokio::try_join!(proxy, admin).map(|_| ()) };
    tokio::pin!(servers);

    tokio::select! {
        result = &mut servers => return result,
        () = shutdown => {}
    }
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: not accepting, draining in-flight requests"
    );
    drop(stop);
    let deadline = tokio::time::Instant::now() + grace;
    let result = match tokio::time::timeout_at(deadline, servers).await {
        Ok(result) => {
            tracing::info!("drained");
            result
        }
        Err(_) => {
            tracing::warn!("grace period over; closing the remaining connections");
            Ok(())
        }
    };
    // Background compactions finish the job at hand (queued ones are dropped).
    let finished = tokio::time::timeout_at(deadline, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!("grace period over; abandoning background compactions");
    }
    result
}

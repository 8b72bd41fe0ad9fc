//! Wiring: the shared state handle, the proxy router, and `run`, which serves the proxy
//! and admin listeners until shutdown and then drains.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::routing::post;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::stats::Stats;
use crate::upstream::Upstream;
use crate::{admin, proxy};

/// Everything a request needs, behind one `Arc`: cloning is a reference-count bump.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    upstream: Upstream,
    stats: Stats,
    started: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("TLS setup for the upstream client failed: {0}")]
    Tls(#[from] rustls::Error),
}

impl AppState {
    pub fn new(config: Config) -> Result<Self, StartError> {
        let upstream = Upstream::new(&config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                upstream,
                stats: Stats::default(),
                started: Instant::now(),
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn upstream(&self) -> &Upstream {
        &self.inner.upstream
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    pub fn started(&self) -> Instant {
        self.inner.started
    }
}

/// The proxy's routes: chat completions is read; everything else passes through.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(proxy::chat).fallback(proxy::passthrough),
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
    let wait = |mut rx: watch::Receiver<()>| async move {
        // Resolves when the sender is dropped.
        let _ = rx.changed().await;
    };
    let nodelay = |tcp: &mut tokio::net::TcpStream| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
    };

    let proxy = axum::serve(listeners.proxy.tap_io(nodelay), router(state.clone()))
        .with_graceful_shutdown(wait(stopped.clone()))
        .into_future();
    let admin = axum::serve(listeners.admin, admin::router(state))
        .with_graceful_shutdown(wait(stopped))
        .into_future();
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
    match tokio::time::timeout(grace, servers).await {
        Ok(result) => {
            tracing::info!("drained; bye");
            result
        }
        Err(_) => {
            tracing::warn!("grace period over; closing the remaining connections");
            Ok(())
        }
    }
}

//! Wiring: the shared state handle, the proxy router, and `run`, which serves the proxy
//! and admin listeners until shutdown and then drains.

use std::future::{Future, IntoFuture};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::Router;
use axum::routing::post;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::compaction::Compactor;
use crate::config::Config;
use crate::identity::IdentityKey;
use crate::offload::Offload;
use crate::stats::Stats;
use crate::store::{Store, StoreError};
use crate::summariser::Summariser;
use crate::tenants::Tenants;
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
    store: Store,
    identity: Identity,
    compactor: Arc<Compactor>,
    stats: Arc<Stats>,
    cpu: Offload,
    tenants: Arc<Tenants>,
    started: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("TLS setup for the upstream client failed: {0}")]
    Tls(#[from] rustls::Error),
    #[error("store configuration: {0}")]
    Store(#[from] StoreError),
    #[error("no randomness for the identity secret: {0}")]
    Random(#[from] getrandom::Error),
}

impl AppState {
    pub fn new(config: Config) -> Result<Self, StartError> {
        let upstream = Upstream::new(&config)?;
        let store = Store::from_config(&config.store)?;
        let stats = Arc::new(Stats::default());
        let summariser = Summariser::new(&config.summary, &upstream);
        let cpu = Offload::new(config.compaction.cpu_concurrency);
        let tenants = Arc::new(Tenants::new(
            store.clone(),
            config.summary.max_per_tenant_per_minute,
        ));
        let compactor = Arc::new(Compactor::new(
            &config,
            summariser,
            store.clone(),
            stats.clone(),
            cpu.clone(),
            tenants.clone(),
        ));
        let identity = match &config.identity.secret {
            Some(secret) => Identity::Configured(Arc::new(IdentityKey::new(secret.clone()))),
            None => Identity::Shared {
                agreed: RwLock::new(None),
                candidate: Arc::new(IdentityKey::generate()?),
            },
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                upstream,
                store,
                identity,
                compactor,
                stats,
                cpu,
                tenants,
                started: Instant::now(),
            }),
        })
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn compactor(&self) -> &Arc<Compactor> {
        &self.inner.compactor
    }

    /// The key conversations are identified with: `identity.secret`, or the secret the
    /// store holds (this replica's random candidate if it was the first to ask). After
    /// the store recovers from an incident the secret is published again (set-if-absent),
    /// so a Redis that restarted empty gets this replica's secret back instead of a new
    /// one from the next replica to start. `None` only while the store has never been
    /// reachable — requests then go on unidentified (fail-open).
    pub async fn identity_key(&self) -> Option<Arc<IdentityKey>> {
        let (agreed, candidate) = match &self.inner.identity {
            Identity::Configured(key) => return Some(key.clone()),
            Identity::Shared { agreed, candidate } => (agreed, candidate),
        };
        let epoch = self.inner.store.recoveries();
        let current = read(agreed).clone();
        if let Some((key, seen)) = &current
            && *seen == epoch
        {
            return Some(key.clone());
        }
        let proposal = current.as_ref().map_or(candidate, |(key, _)| key);
        match self.inner.store.identity_secret(proposal.secret()).await {
            Ok(secret) => {
                let key = match &current {
                    Some((key, _)) if key.secret() == &secret => key.clone(),
                    Some(_) => {
                        tracing::warn!(
                            "the store holds another identity secret now; conversations start afresh"
                        );
                        Arc::new(IdentityKey::new(secret))
                    }
                    None => Arc::new(IdentityKey::new(secret)),
                };
                *write(agreed) = Some((key.clone(), epoch));
                Some(key)
            }
            // Store down: keep the key we had (if any); nothing is stored meanwhile anyway.
            Err(_) => current.map(|(key, _)| key),
        }
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

    /// What abridge knows of each tenant (accepted by the provider, summary budget).
    pub fn tenants(&self) -> &Tenants {
        &self.inner.tenants
    }

    /// Where CPU-heavy work on large requests runs.
    pub fn cpu(&self) -> &Offload {
        &self.inner.cpu
    }

    pub fn started(&self) -> Instant {
        self.inner.started
    }
}

/// Where the identity key comes from.
enum Identity {
    Configured(Arc<IdentityKey>),
    /// Agreed through the store: the key and the store recovery epoch it was checked in.
    Shared {
        agreed: RwLock<Option<(Arc<IdentityKey>, u64)>>,
        candidate: Arc<IdentityKey>,
    },
}

// A std lock: held only to copy an `Arc` in or out, never across an `.await`.
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    let mut workers = state.compactor().start_background(stopped.clone());
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

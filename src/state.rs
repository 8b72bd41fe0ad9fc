//! The shared state a request needs, behind one `Arc` ([`AppState`]), and where the
//! identity key comes from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::compactor::Compactor;
use crate::compactor::summariser::Summariser;
use crate::config::Config;
use crate::identity::IdentityKey;
use crate::ingress::BodyBudget;
use crate::offload::Offload;
use crate::prices::Prices;
use crate::relay::decode::DecodeBudget;
use crate::stats::Stats;
use crate::store::{Store, StoreError};
use crate::tenants::Tenants;
use crate::upstream::Upstream;

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
    /// What tokens cost, per model.
    prices: Arc<Prices>,
    cpu: Offload,
    tenants: Arc<Tenants>,
    /// Decoded chunks of compressed responses in flight
    /// (`limits.max_inflight_decoded_bytes`).
    decode_budget: DecodeBudget,
    /// Bytes of request bodies held at once (`limits.max_inflight_body_bytes`).
    body_budget: BodyBudget,
    /// The upstream refused `stream_options` once: abridge no longer adds it.
    refuses_usage_option: AtomicBool,
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
    #[error("prices: {0}")]
    Prices(String),
}

impl AppState {
    pub fn new(config: Config) -> Result<Self, StartError> {
        let upstream = Upstream::new(&config)?;
        let store = Store::from_config(&config.store)?;
        let stats = Arc::new(Stats::default());
        let prices = Arc::new(Prices::new(&config.prices).map_err(StartError::Prices)?);
        let summariser = Summariser::new(&config.summary, &upstream);
        let cpu = Offload::new(config.compaction.cpu_concurrency);
        let body_budget = BodyBudget::new(config.limits.max_inflight_body_bytes);
        let decode_budget = DecodeBudget::new(config.limits.max_inflight_decoded_bytes);
        let tenants = Arc::new(Tenants::new(
            store.clone(),
            crate::tenants::Budget {
                tokens: config.summary.max_tokens_per_tenant_per_minute,
                calls: config.summary.max_per_tenant_per_minute,
            },
        ));
        let compactor = Arc::new(Compactor::new(
            &config,
            summariser,
            store.clone(),
            (stats.clone(), prices.clone()),
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
                prices,
                cpu,
                tenants,
                decode_budget,
                body_budget,
                refuses_usage_option: AtomicBool::new(false),
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

    /// What tokens cost, per model (the built-in table and `[prices]`).
    pub fn prices(&self) -> &Prices {
        &self.inner.prices
    }

    /// What abridge knows of each tenant (accepted by the provider, summary budget).
    pub fn tenants(&self) -> &Tenants {
        &self.inner.tenants
    }

    /// Whether the upstream refused the `stream_options` abridge adds to streaming
    /// requests (then it is not added again by this process).
    pub fn refuses_usage_option(&self) -> bool {
        self.inner.refuses_usage_option.load(Ordering::Relaxed)
    }

    /// The upstream refused `stream_options`: remember it, count it, say it once.
    pub fn refuse_usage_option(&self) {
        self.inner.stats.usage_option_refused();
        if !self
            .inner
            .refuses_usage_option
            .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                upstream = %self.inner.config.upstream,
                "the provider refuses stream_options; streaming requests go as the client sent them and their usage is not read"
            );
        }
    }

    /// The budget of request-body bytes held at once.
    pub fn body_budget(&self) -> &BodyBudget {
        &self.inner.body_budget
    }

    /// A client's request body, read whole within the configured bounds
    /// (`limits.max_body_bytes`, `timeouts.client_body_ms`, the body budget; see
    /// [`crate::ingress::read_body`]).
    pub async fn read_body(
        &self,
        body: axum::body::Body,
        headers: &http::HeaderMap,
    ) -> Result<(bytes::Bytes, crate::ingress::Held), crate::error::Error> {
        let config = self.config();
        crate::ingress::read_body(
            body,
            headers,
            config.limits.max_body_bytes,
            config.timeouts.client_body(),
            self.body_budget(),
        )
        .await
    }

    pub fn decode_budget(&self) -> &DecodeBudget {
        &self.inner.decode_budget
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

//! The store: what abridge remembers about a conversation between turns — checkpoints
//! (which messages a replacement stands for), the usage the provider reported for each
//! history, and a little state — plus the single-flight lock for summary builds.
//!
//! One enum, two backends with the same behaviour and the same test suite:
//! [`memory::MemoryStore`] (the default: nothing to install, state lost on restart) and
//! [`redis::RedisStore`] (a single Redis, a Redis Cluster or Redis behind Sentinel,
//! shared by replicas).
//!
//! **Fail-open.** Every call is bounded by `store.response_timeout_ms`. An error or a
//! timeout is returned to the caller, which proceeds as if there were no state (the
//! request is forwarded uncompacted). The first failure of an incident is logged once
//! and marks the store unhealthy; while unhealthy, calls fail at once without touching
//! the backend, except one probe every [`PROBE_INTERVAL`], so a dead or paused Redis costs
//! requests nothing. The first success logs the recovery.
//!
//! Keys (Redis) — all of one conversation under one hash tag, so a Cluster keeps them in
//! one slot; only hashes appear in key names; every conversation key has a TTL refreshed
//! on use:
//! - `<prefix>:{<conv>}:ckpt`  — hash: `<through, 10 digits>:<prefix hash>` → checkpoint JSON
//! - `<prefix>:{<conv>}:state` — hash: compactions, last_seen, scheduled
//! - `<prefix>:{<conv>}:account` — hash: what its requests saved and cost (see
//!   [`crate::accounting::Tally`]), its format
//! - `<prefix>:{<conv>}:series` — list: its latest requests, for the plot
//! - `<prefix>:{<conv>}:usage` — hash: `<history prefix hash>` → the usage reported for it
//! - `<prefix>:{<conv>}:lock`  — the single-flight lock token (SET NX PX)
//! - `<prefix>:{<tenant>}:tenant` — "1" once the provider accepted the tenant's credential
//! - `<prefix>:recent`         — sorted set of conversations by last use (admin listing)
//! - `<prefix>:secret`         — the identity secret (no TTL: see [`Store::identity_secret`])
//! - `<prefix>:windows`        — hash: learned context windows (see `crate::windows`),
//!   expiring a week after its last write

pub mod memory;
pub mod redis;
mod types;

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::accounting::{Account, Entry, Tally};
use crate::config::StoreConfig;
use crate::identity::Fingerprint;
use crate::secret::Secret;

pub(crate) use types::checkpoint_field;
pub use types::{
    Checkpoint, INDEX_REFRESH_MS, Kept, Loaded, Lock, MAX_USAGE, Piece, Recent, Saved, State, Usage,
};

/// After a failure, the backend is not asked again for this long (but once, as a probe).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("store unavailable since a recent failure (probing every {PROBE_INTERVAL:?})")]
    Unavailable,
    #[error("store error: {0}")]
    Backend(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// The store: a backend plus the fail-open machinery around it. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    health: std::sync::Arc<Health>,
    timeout: Duration,
}

/// Every backend this build can keep state in, as [`Store::backend_name`] names them
/// (`abridge --version` lists them).
pub const BACKENDS: &[&str] = &["memory", "redis", "redis-cluster", "redis-sentinel"];

#[derive(Clone)]
enum Backend {
    Memory(memory::MemoryStore),
    Redis(redis::RedisStore),
}

impl Store {
    /// The backend the configuration names. Connects lazily: a Redis that is down at
    /// start-up only makes the store unhealthy until it is up.
    pub fn from_config(config: &StoreConfig) -> Result<Self, StoreError> {
        let backend = if config.redis_url.is_some()
            || !config.redis_cluster.is_empty()
            || !config.sentinel.nodes.is_empty()
        {
            Backend::Redis(redis::RedisStore::new(config)?)
        } else {
            Backend::Memory(memory::MemoryStore::new(config))
        };
        Ok(Self {
            backend,
            health: Default::default(),
            timeout: config.response_timeout(),
        })
    }

    /// `"memory"`, `"redis"`, `"redis-cluster"` or `"redis-sentinel"` (one of [`BACKENDS`]).
    pub fn backend_name(&self) -> &'static str {
        match &self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(r) => r.kind(),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.health.healthy.load(Ordering::Relaxed)
    }

    /// The last error of the current (or last) incident (a timeout does not replace the
    /// error that began it).
    pub fn last_error(&self) -> Option<String> {
        lock(&self.health.last_error).clone()
    }

    /// Failed calls (errors, timeouts and calls skipped while unhealthy).
    pub fn errors(&self) -> u64 {
        self.health.errors.load(Ordering::Relaxed)
    }

    /// How many times the store came back after an incident. Whatever was only in the
    /// store may be gone (a Redis without persistence restarts empty), so callers that
    /// published something there check it again when this changes.
    pub fn recoveries(&self) -> u64 {
        self.health.recoveries.load(Ordering::Acquire)
    }

    /// Checkpoints and state of a conversation, in one round trip; refreshes its TTL.
    pub async fn load(&self, conversation: &Fingerprint) -> Result<Loaded, StoreError> {
        self.call("load", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.load(conversation)),
                Backend::Redis(r) => r.load(conversation).await,
            }
        })
        .await
    }

    /// Saves a checkpoint and drops the fields `drop` (see [`Loaded::to_drop`]).
    /// Monotonic: a checkpoint for the same depth and history that is already there
    /// stays (and nothing is dropped), so a late writer never replaces a checkpoint.
    pub async fn save_checkpoint(
        &self,
        conversation: &Fingerprint,
        checkpoint: &Checkpoint,
        drop: &[String],
    ) -> Result<Saved, StoreError> {
        self.call("save_checkpoint", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.save_checkpoint(conversation, checkpoint, drop)),
                Backend::Redis(r) => r.save_checkpoint(conversation, checkpoint, drop).await,
            }
        })
        .await
    }

    /// Records the usage the provider reported for a history of this conversation.
    /// `replaces`: the prefix of the record this request was predicted from (an
    /// earlier turn of the same history), which the new record supersedes.
    /// With it, what the request adds to the conversation's account.
    pub async fn record_usage(
        &self,
        conversation: &Fingerprint,
        (usage, entry): (Usage, &Entry),
        replaces: Option<Fingerprint>,
        touch_index: bool,
    ) -> Result<(), StoreError> {
        self.call("record_usage", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.record_usage(conversation, (usage, entry), replaces);
                    Ok(())
                }
                Backend::Redis(r) => {
                    r.record_usage(conversation, (usage, entry), replaces, touch_index)
                        .await
                }
            }
        })
        .await
    }

    /// Takes the conversation's single-flight lock for `ttl`, if free.
    pub async fn try_lock(
        &self,
        conversation: &Fingerprint,
        ttl: Duration,
    ) -> Result<Option<Lock>, StoreError> {
        self.call("try_lock", async {
            let lock = Lock::new()?;
            let taken = match &self.backend {
                Backend::Memory(m) => m.try_lock(conversation, &lock, ttl),
                Backend::Redis(r) => r.try_lock(conversation, &lock, ttl).await?,
            };
            Ok(taken.then_some(lock))
        })
        .await
    }

    /// Extends a lock for `ttl` if it is still ours (a build in progress keeps it alive;
    /// a holder that dies lets it expire soon); `false` when it is not ours any more.
    pub async fn refresh_lock(
        &self,
        conversation: &Fingerprint,
        lock: &Lock,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.call("refresh_lock", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.refresh_lock(conversation, lock, ttl)),
                Backend::Redis(r) => r.refresh_lock(conversation, lock, ttl).await,
            }
        })
        .await
    }

    /// Whether someone holds the conversation's lock.
    pub async fn lock_held(&self, conversation: &Fingerprint) -> Result<bool, StoreError> {
        self.call("lock_held", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.lock_held(conversation)),
                Backend::Redis(r) => r.lock_held(conversation).await,
            }
        })
        .await
    }

    /// Releases a lock if it is still ours (compare-and-delete); `false` when it had
    /// expired and possibly been taken by someone else.
    pub async fn unlock(
        &self,
        conversation: &Fingerprint,
        lock: &Lock,
    ) -> Result<bool, StoreError> {
        self.call("unlock", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.unlock(conversation, lock)),
                Backend::Redis(r) => r.unlock(conversation, lock).await,
            }
        })
        .await
    }

    /// Forgets a conversation; `true` if there was anything.
    pub async fn delete(&self, conversation: &Fingerprint) -> Result<bool, StoreError> {
        self.call("delete", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.delete(conversation)),
                Backend::Redis(r) => r.delete(conversation).await,
            }
        })
        .await
    }

    /// Schedules a compaction of the conversation at its next turn (with an optional
    /// focus for a summary); `false` if the conversation is unknown.
    pub async fn schedule_compaction(
        &self,
        conversation: &Fingerprint,
        focus: &str,
    ) -> Result<bool, StoreError> {
        self.call("schedule_compaction", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.schedule(conversation, Some(focus))),
                Backend::Redis(r) => r.schedule(conversation, Some(focus)).await,
            }
        })
        .await
    }

    /// Adds what a summary call or a recall spent to the conversation's account.
    pub async fn add_tally(
        &self,
        conversation: &Fingerprint,
        tally: &Tally,
    ) -> Result<(), StoreError> {
        self.call("add_tally", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.add_tally(conversation, tally);
                    Ok(())
                }
                Backend::Redis(r) => r.add_tally(conversation, tally).await,
            }
        })
        .await
    }

    /// What the conversation's requests saved and cost, its format, its latest requests
    /// (empty for a conversation the store does not know).
    pub async fn account(&self, conversation: &Fingerprint) -> Result<Account, StoreError> {
        self.call("account", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.account_of(conversation).unwrap_or_default()),
                Backend::Redis(r) => r.account(conversation).await,
            }
        })
        .await
    }

    /// Clears a scheduled compaction (it ran).
    pub async fn clear_scheduled(&self, conversation: &Fingerprint) -> Result<(), StoreError> {
        self.call("clear_scheduled", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.schedule(conversation, None);
                    Ok(())
                }
                Backend::Redis(r) => r.schedule(conversation, None).await.map(|_| ()),
            }
        })
        .await
    }

    /// Remembers that the provider accepted a tenant's credential (a 2xx), for `ttl`.
    pub async fn accept_tenant(
        &self,
        tenant: &Fingerprint,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.call("accept_tenant", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.accept_tenant(tenant, ttl);
                    Ok(())
                }
                Backend::Redis(r) => r.accept_tenant(tenant, ttl).await,
            }
        })
        .await
    }

    /// Forgets that the provider accepted a tenant's credential (it refused it since).
    pub async fn reject_tenant(&self, tenant: &Fingerprint) -> Result<(), StoreError> {
        self.call("reject_tenant", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.reject_tenant(tenant);
                    Ok(())
                }
                Backend::Redis(r) => r.reject_tenant(tenant).await,
            }
        })
        .await
    }

    /// Whether the provider accepted a tenant's credential within the TTL.
    pub async fn tenant_accepted(&self, tenant: &Fingerprint) -> Result<bool, StoreError> {
        self.call("tenant_accepted", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.tenant_accepted(tenant)),
                Backend::Redis(r) => r.tenant_accepted(tenant).await,
            }
        })
        .await
    }

    /// Conversations used since `since_ms` (ms since the epoch).
    pub async fn active_since(&self, since_ms: u64) -> Result<u64, StoreError> {
        self.call("active_since", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.active_since(since_ms)),
                Backend::Redis(r) => r.active_since(since_ms).await,
            }
        })
        .await
    }

    /// Conversations by last use, most recent first.
    pub async fn recent(&self, offset: usize, limit: usize) -> Result<Vec<Recent>, StoreError> {
        self.call("recent", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.recent(offset, limit)),
                Backend::Redis(r) => r.recent(offset, limit).await,
            }
        })
        .await
    }

    /// Learned context windows (`crate::windows`): `set` (field, value) written,
    /// `forget` removed; the hash expires `ttl` after its last write.
    pub async fn write_windows(
        &self,
        set: Option<(&str, &str)>,
        forget: &[String],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.call("write_windows", async {
            match &self.backend {
                Backend::Memory(m) => {
                    m.write_windows(set, forget);
                    Ok(())
                }
                Backend::Redis(r) => r.write_windows(set, forget, ttl).await,
            }
        })
        .await
    }

    /// Every learned context window, as stored.
    pub async fn windows(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.call("windows", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.windows()),
                Backend::Redis(r) => r.windows().await,
            }
        })
        .await
    }

    /// The identity secret shared through the store: `candidate` if none was there yet
    /// (set-if-absent), else the one already there. Kept without a TTL: it holds no user
    /// data, and if it expired while replicas run, a restarted replica would create a
    /// new one and the replicas would stop recognising each other's conversations.
    pub async fn identity_secret(&self, candidate: &Secret) -> Result<Secret, StoreError> {
        self.call("identity_secret", async {
            match &self.backend {
                Backend::Memory(m) => Ok(m.identity_secret(candidate)),
                Backend::Redis(r) => r.identity_secret(candidate).await,
            }
        })
        .await
    }

    async fn call<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.health.admit() {
            self.health.errors.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable);
        }
        let result = match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        match &result {
            Ok(_) => self.health.succeeded(self.backend_name()),
            Err(e) => self.health.failed(self.backend_name(), op, e),
        }
        result
    }
}

/// Health and the probe gate (see the module docs).
struct Health {
    healthy: AtomicBool,
    /// While unhealthy: when the next probe may go (ms since the epoch).
    probe_at_ms: AtomicU64,
    errors: AtomicU64,
    recoveries: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            healthy: AtomicBool::new(true),
            probe_at_ms: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }
}

impl Health {
    /// Whether a call may go to the backend: always when healthy; when not, one caller
    /// per probe interval.
    fn admit(&self) -> bool {
        if self.healthy.load(Ordering::Relaxed) {
            return true;
        }
        let now = now_ms();
        let due = self.probe_at_ms.load(Ordering::Relaxed);
        now >= due
            && self
                .probe_at_ms
                .compare_exchange(
                    due,
                    now + PROBE_INTERVAL.as_millis() as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn succeeded(&self, backend: &str) {
        if !self.healthy.swap(true, Ordering::AcqRel) {
            self.recoveries.fetch_add(1, Ordering::AcqRel);
            tracing::info!(
                backend,
                "store recovered; conversations are compacted again"
            );
        }
    }

    fn failed(&self, backend: &str, op: &str, error: &StoreError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.probe_at_ms.store(
            now_ms() + PROBE_INTERVAL.as_millis() as u64,
            Ordering::Relaxed,
        );
        // Within an incident, a timeout says less than the error that began it (a call
        // waiting on a connection attempt that failed on its certificate times out):
        // the cause is kept.
        let mut last = lock(&self.last_error);
        let ongoing = !self.healthy.load(Ordering::Acquire) && last.is_some();
        if !(ongoing && matches!(error, StoreError::Timeout(_))) {
            *last = Some(format!("{op}: {error}"));
        }
        drop(last);
        if self.healthy.swap(false, Ordering::AcqRel) {
            tracing::warn!(backend, op, %error, "store unavailable; requests go on without conversation state until it recovers");
        }
    }
}

/// A std mutex around plain data; no `.await` is ever held under it. A poisoned lock
/// only means a panic elsewhere; the data is still consistent enough to read.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

//! Context windows learned from the providers, per (upstream, model) — and, until
//! confirmed, per tenant.
//!
//! **Where a window comes from.** An overflow answer that states the window (the family's
//! own overflow error, read by `compactor::overflow`; never a bare 413, never words the
//! client's own request carries) teaches the tenant whose request overflowed, and only
//! it. An overflow that states no number shrinks that tenant's window below what abridge
//! sent. A window becomes everyone's (*confirmed*) when the server says it when asked
//! (llama-server's `/props`, vLLM's `/v1/models`, Ollama's `/api/show`: see
//! [`crate::ask`]) or when a second tenant's overflow states the same number. So no
//! request of one tenant changes what another tenant's conversations are compacted to.
//! Every learned window is at least [`FLOOR`]; a tenant's own wins over the confirmed one
//! (it is what its provider told it).
//!
//! **Bounded.** Client-chosen model names longer than [`MAX_MODEL_BYTES`] are never kept;
//! at most [`MAX_CONFIRMED`] confirmed windows, [`MAX_TENANT_WINDOWS`] tenant windows in
//! all and [`MAX_PER_TENANT`] per tenant. When full, the window used least recently goes
//! (a lookup marks its window used), so a flood of junk model names never locks out a
//! model in use: at worst a window is learned again.
//!
//! **Kept** in the store (shared by replicas, kept across restarts: one hash, its entries
//! expiring [`TTL`] after they were learned, the hash itself [`TTL`] after its last write)
//! and in-process for the request path, which never waits for the store: each process
//! reads the store's at start and every [`REFRESH_EVERY`], and forgets what the store no
//! longer has (`DELETE /admin/windows` on any replica reaches all). What is configured
//! (`compaction.context_windows`) always wins over what is learned; what is learned wins
//! over the built-in table.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::identity::Fingerprint;
use crate::store::{Store, now_ms};

/// Confirmed windows kept at most, per process and in the store.
pub const MAX_CONFIRMED: usize = 512;
/// Tenants' own windows kept at most, in all.
pub const MAX_TENANT_WINDOWS: usize = 1024;
/// One tenant's own windows kept at most.
pub const MAX_PER_TENANT: usize = 8;
/// Model names longer than this (bytes) are never kept, asked for or labelled.
pub const MAX_MODEL_BYTES: usize = 256;
/// No learned window is smaller: the smallest window a served model really has.
pub const FLOOR: u64 = 2048;
/// How long a learned window is kept after it was learned.
pub const TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a process reads what other replicas learned.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// A window shrunk from an overflow that stated none: this share of what was sent.
const SHRINK: f64 = 0.9;

/// How a window was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The provider's overflow answer stated it.
    Overflow,
    /// An overflow stated no number: below what was sent.
    Shrunk,
    /// The server said when asked (`/props`, `/v1/models`, `/api/show`).
    Asked,
}

/// A learned window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Learned {
    pub window: u64,
    pub source: Source,
    pub at_ms: u64,
}

/// Which model behind which upstream, and for whom.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// `None`: confirmed, everyone's.
    pub tenant: Option<Fingerprint>,
    /// The upstream's base URL (never with credentials: the configuration refuses them).
    pub upstream: String,
    /// The model, in lower case, at most [`MAX_MODEL_BYTES`].
    pub model: String,
}

impl Key {
    /// The key of `model` behind `upstream` for `tenant`; `None` for a model name too
    /// long to keep.
    pub fn of(tenant: Option<Fingerprint>, upstream: &str, model: &str) -> Option<Self> {
        (model.len() <= MAX_MODEL_BYTES).then(|| Self {
            tenant,
            upstream: upstream.to_owned(),
            model: model.to_ascii_lowercase(),
        })
    }

    /// The store's field: tenant (or `*`), upstream and model, unit-separated.
    fn field(&self) -> String {
        let tenant = self.tenant.map_or_else(|| "*".to_owned(), |t| t.to_hex());
        format!("{tenant}\u{1f}{}\u{1f}{}", self.upstream, self.model)
    }

    fn from_field(field: &str) -> Option<Self> {
        let mut parts = field.split('\u{1f}');
        let tenant = match parts.next()? {
            "*" => None,
            hex => Some(Fingerprint::from_hex(hex)?),
        };
        let (upstream, model) = (parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Self::of(tenant, upstream, model).filter(|k| k.model == model)
    }
}

/// One learned window, for `/admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub upstream: String,
    pub model: String,
    /// The tenant it holds for (a prefix of its keyed hash); `None`: confirmed.
    pub tenant: Option<String>,
    #[serde(flatten)]
    pub learned: Learned,
}

/// A window in the map: what was learned, and the [`Windows::clock`] tick it was last
/// used at.
#[derive(Debug)]
struct Entry {
    learned: Learned,
    used: AtomicU64,
}

pub struct Windows {
    store: Store,
    /// (std lock: plain map operations, never held across an `.await`.)
    learned: RwLock<HashMap<Key, Entry>>,
    /// Ticks once per lookup that finds a window: which was used least recently.
    clock: AtomicU64,
}

impl Windows {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            learned: RwLock::new(HashMap::new()),
            clock: AtomicU64::new(0),
        }
    }

    fn entry(&self, learned: Learned) -> Entry {
        Entry {
            learned,
            used: AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The window learned for `model` behind `upstream`, as `tenant` sees it: its own,
    /// else the confirmed one.
    pub fn get(&self, upstream: &str, model: &str, tenant: Option<Fingerprint>) -> Option<u64> {
        let learned = read(&self.learned);
        // Asked on every request: nothing learned (a hosted API's) costs no key.
        if learned.is_empty() {
            return None;
        }
        let mut key = Key::of(tenant, upstream, model)?;
        let entry = tenant.and_then(|_| learned.get(&key)).or_else(|| {
            key.tenant = None;
            learned.get(&key)
        })?;
        entry.used.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        Some(entry.learned.window)
    }

    /// An overflow of `tenant`'s request for `model` behind `upstream`: the window it
    /// `stated`, or — none stated — one below what was `sent` (the provider's count) and
    /// below what is `known`; never under [`FLOOR`]. Learned for that tenant, and for
    /// everyone once a second tenant's overflow states the same window. The window now
    /// in force for the tenant (`None`: a model name too long to keep).
    pub fn overflowed(
        &self,
        (upstream, model, tenant): (&str, &str, Fingerprint),
        stated: Option<u64>,
        sent: u64,
        known: u64,
    ) -> Option<u64> {
        let key = Key::of(Some(tenant), upstream, model)?;
        let (window, source) = match stated {
            Some(window) => (window, Source::Overflow),
            None => {
                let below = ((sent as f64) * SHRINK) as u64;
                (below.min(known), Source::Shrunk)
            }
        };
        let window = window.max(FLOOR);
        let confirmed = source == Source::Overflow && self.stated_by_another(&key, window);
        self.learn(key.clone(), window, source);
        if confirmed {
            self.learn(
                Key {
                    tenant: None,
                    ..key
                },
                window,
                source,
            );
        }
        Some(window)
    }

    /// Whether a tenant other than `key`'s had an overflow state `window` for its model.
    fn stated_by_another(&self, key: &Key, window: u64) -> bool {
        read(&self.learned).iter().any(|(k, e)| {
            k.tenant.is_some()
                && k.tenant != key.tenant
                && (&k.upstream, &k.model) == (&key.upstream, &key.model)
                && e.learned.source == Source::Overflow
                && e.learned.window == window
        })
    }

    /// What a server said its window is, when asked: everyone's.
    pub fn asked(&self, upstream: &str, model: &str, window: u64) {
        if let Some(key) = Key::of(None, upstream, model) {
            self.learn(key, window.max(FLOOR), Source::Asked);
        }
    }

    fn learn(&self, key: Key, window: u64, source: Source) {
        let learned = Learned {
            window,
            source,
            at_ms: now_ms(),
        };
        let evicted = {
            let mut map = write(&self.learned);
            if map.get(&key).is_some_and(|e| e.learned.window == window) {
                return;
            }
            let evicted = room_for(&map, &key);
            for gone in &evicted {
                map.remove(gone);
            }
            map.insert(key.clone(), self.entry(learned));
            evicted
        };
        tracing::info!(
            upstream = key.upstream,
            model = key.model,
            tenant = key.tenant.is_some(),
            window,
            ?source,
            "context window learned"
        );
        let store = self.store.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let Ok(value) = serde_json::to_string(&learned) else {
                    return;
                };
                let forget: Vec<String> = evicted.iter().map(Key::field).collect();
                // Failures are counted and logged by the store; the next overflow or
                // refresh tries again.
                let _ = store
                    .write_windows(Some((&key.field(), &value)), &forget, TTL)
                    .await;
            });
        }
    }

    /// Reads what the store holds (other replicas' and earlier runs' windows): the newer
    /// of each wins, what expired or cannot be read is removed from the store, and what
    /// the store no longer has (deleted, expired) is forgotten here too.
    pub async fn refresh(&self) {
        let started = now_ms();
        let Ok(stored) = self.store.windows().await else {
            return;
        };
        let oldest = now_ms().saturating_sub(TTL.as_millis() as u64);
        let mut forget = Vec::new();
        let mut seen = std::collections::HashSet::new();
        {
            let mut map = write(&self.learned);
            for (field, value) in stored {
                let parsed = Key::from_field(&field)
                    .zip(serde_json::from_str::<Learned>(&value).ok())
                    .filter(|(_, l)| l.at_ms >= oldest && l.window >= FLOOR);
                let Some((key, learned)) = parsed else {
                    forget.push(field);
                    continue;
                };
                seen.insert(key.clone());
                if map
                    .get(&key)
                    .is_some_and(|e| e.learned.at_ms >= learned.at_ms)
                {
                    continue;
                }
                for gone in room_for(&map, &key) {
                    forget.push(gone.field());
                    map.remove(&gone);
                }
                map.insert(key, self.entry(learned));
            }
            // Learned here since the read began, or not yet written: kept.
            map.retain(|k, e| seen.contains(k) || e.learned.at_ms >= started);
        }
        if !forget.is_empty() {
            let _ = self.store.write_windows(None, &forget, TTL).await;
        }
    }

    /// Forgets the windows learned for `model` (every model when `None`), here and in the
    /// store: how many.
    pub async fn forget(&self, model: Option<&str>) -> usize {
        let model = model.map(str::to_ascii_lowercase);
        let gone: Vec<Key> = {
            let mut map = write(&self.learned);
            let gone: Vec<Key> = map
                .keys()
                .filter(|k| model.as_ref().is_none_or(|m| &k.model == m))
                .cloned()
                .collect();
            for key in &gone {
                map.remove(key);
            }
            gone
        };
        let fields: Vec<String> = gone.iter().map(Key::field).collect();
        if !fields.is_empty() {
            let _ = self.store.write_windows(None, &fields, TTL).await;
        }
        gone.len()
    }

    /// Everything learned, by upstream, model and tenant.
    pub fn list(&self) -> Vec<Listed> {
        let mut out: Vec<Listed> = read(&self.learned)
            .iter()
            .map(|(key, entry)| Listed {
                upstream: key.upstream.clone(),
                model: key.model.clone(),
                tenant: key.tenant.map(|t| t.hex()[..12].to_owned()),
                learned: entry.learned,
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.upstream, &a.model, &a.tenant).cmp(&(&b.upstream, &b.model, &b.tenant))
        });
        out
    }
}

/// What must go for `key` to be added to `map`: nothing when it is there or there is
/// room; else the least recently used window of its tenant (at [`MAX_PER_TENANT`]) or of
/// its kind (at [`MAX_CONFIRMED`] or [`MAX_TENANT_WINDOWS`]).
fn room_for(map: &HashMap<Key, Entry>, key: &Key) -> Vec<Key> {
    if map.contains_key(key) {
        return Vec::new();
    }
    let least_used = |same: &dyn Fn(&Key) -> bool, max: usize| {
        let mut of: Vec<(&Key, u64)> = map
            .iter()
            .filter(|(k, _)| same(k))
            .map(|(k, e)| (k, e.used.load(Ordering::Relaxed)))
            .collect();
        if of.len() < max {
            return None;
        }
        of.sort_by_key(|(_, used)| *used);
        Some(of[0].0.clone())
    };
    let mut gone = Vec::new();
    match key.tenant {
        None => gone.extend(least_used(&|k| k.tenant.is_none(), MAX_CONFIRMED)),
        Some(tenant) => {
            gone.extend(least_used(&|k| k.tenant == Some(tenant), MAX_PER_TENANT));
            if gone.is_empty() {
                gone.extend(least_used(&|k| k.tenant.is_some(), MAX_TENANT_WINDOWS));
            }
        }
    }
    gone
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;

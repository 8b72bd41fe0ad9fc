//! Context windows learned from the providers, per (upstream, model): read from an
//! overflow answer (or, where it states no number, shrunk below what was sent), or asked
//! of the server (llama-server's `/props`, vLLM's `/v1/models`, Ollama's `/api/show`).
//!
//! Kept in the store (shared by replicas, kept across restarts: one hash, at most
//! [`MAX_LEARNED`] entries, no TTL) and in-process for the request path, which never
//! waits for the store: each process reads the store's at start and every
//! [`REFRESH_EVERY`]. What is configured (`compaction.context_windows`) always wins
//! over what is learned; what is learned wins over the built-in table.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{Store, now_ms};

/// Learned windows kept at most, per process and in the store.
pub const MAX_LEARNED: usize = 1024;
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

/// One learned window, for `/admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub upstream: String,
    pub model: String,
    #[serde(flatten)]
    pub learned: Learned,
}

pub struct Windows {
    store: Store,
    /// By [`field`] (std lock: plain map operations, never held across an `.await`).
    learned: RwLock<HashMap<String, Learned>>,
}

/// The store's field for (upstream, model): the upstream's base URL (never with
/// credentials: the configuration refuses them), a space, the model in lower case.
fn field(upstream: &str, model: &str) -> String {
    format!("{upstream} {}", model.to_ascii_lowercase())
}

impl Windows {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            learned: RwLock::new(HashMap::new()),
        }
    }

    /// The learned window of `model` behind `upstream`.
    pub fn get(&self, upstream: &str, model: &str) -> Option<u64> {
        let learned = read(&self.learned);
        // Asked on every request: nothing learned (a hosted API's) costs no key.
        if learned.is_empty() {
            return None;
        }
        learned.get(&field(upstream, model)).map(|l| l.window)
    }

    /// An overflow for `model` behind `upstream`: the window it stated, or — none
    /// stated — one below what was `sent` (the provider's count) and below what is
    /// known. Remembered in the store in the background. The window now in force.
    pub fn overflowed(
        &self,
        (upstream, model): (&str, &str),
        stated: Option<u64>,
        sent: u64,
        known: u64,
    ) -> u64 {
        let (window, source) = match stated {
            Some(window) => (window, Source::Overflow),
            None => {
                let below = ((sent as f64) * SHRINK) as u64;
                (below.min(known).max(1), Source::Shrunk)
            }
        };
        self.learn(upstream, model, window, source);
        window
    }

    /// What a server said its window is, when asked.
    pub fn asked(&self, upstream: &str, model: &str, window: u64) {
        self.learn(upstream, model, window, Source::Asked);
    }

    fn learn(&self, upstream: &str, model: &str, window: u64, source: Source) {
        let key = field(upstream, model);
        let learned = Learned {
            window,
            source,
            at_ms: now_ms(),
        };
        {
            let mut map = write(&self.learned);
            if map.get(&key).is_some_and(|l| l.window == window) {
                return;
            }
            if map.len() >= MAX_LEARNED && !map.contains_key(&key) {
                tracing::warn!(model, "learned context windows are full: not remembered");
                return;
            }
            map.insert(key.clone(), learned);
        }
        tracing::info!(upstream, model, window, ?source, "context window learned");
        let store = self.store.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let Ok(value) = serde_json::to_string(&learned) else {
                    return;
                };
                // Failures are counted and logged by the store; the next overflow or
                // refresh tries again.
                let _ = store.learn_window(&key, &value, MAX_LEARNED).await;
            });
        }
    }

    /// Reads what the store holds (other replicas' and earlier runs' windows); the
    /// newer of each wins.
    pub async fn refresh(&self) {
        let Ok(stored) = self.store.windows().await else {
            return;
        };
        let mut map = write(&self.learned);
        for (key, value) in stored {
            let Ok(learned) = serde_json::from_str::<Learned>(&value) else {
                continue;
            };
            let newer = map.get(&key).is_none_or(|l| l.at_ms < learned.at_ms);
            if newer && (map.len() < MAX_LEARNED || map.contains_key(&key)) {
                map.insert(key, learned);
            }
        }
    }

    /// Everything learned, by upstream and model.
    pub fn list(&self) -> Vec<Listed> {
        let mut out: Vec<Listed> = read(&self.learned)
            .iter()
            .filter_map(|(key, learned)| {
                let (upstream, model) = key.rsplit_once(' ')?;
                Some(Listed {
                    upstream: upstream.to_owned(),
                    model: model.to_owned(),
                    learned: *learned,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.upstream, &a.model).cmp(&(&b.upstream, &b.model)));
        out
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;

    #[tokio::test]
    async fn windows_are_learned_shrunk_and_shared_through_the_store() {
        let store = Store::from_config(&StoreConfig::default()).unwrap();
        let one = Windows::new(store.clone());
        let up = "http://127.0.0.1:8080/v1";
        assert_eq!(one.get(up, "Local-Model"), None);
        assert_eq!(
            one.overflowed((up, "Local-Model"), Some(8192), 9000, 128_000),
            8192
        );
        assert_eq!(
            one.get(up, "local-model"),
            Some(8192),
            "model names by case"
        );
        assert_eq!(
            one.get("http://other/v1", "local-model"),
            None,
            "per upstream"
        );
        // No number stated: below what was sent, and below what is known.
        assert_eq!(one.overflowed((up, "quiet"), None, 10_000, 128_000), 9_000);
        assert_eq!(one.overflowed((up, "quiet"), None, 10_000, 6_000), 6_000);
        // Another replica (or a restart) reads them from the store.
        let mut shared = false;
        for _ in 0..50 {
            let two = Windows::new(store.clone());
            two.refresh().await;
            if two.get(up, "local-model") == Some(8192) && two.get(up, "quiet") == Some(6_000) {
                shared = true;
                assert_eq!(two.list().len(), 2);
                assert_eq!(two.list()[0].learned.source, Source::Overflow);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(shared);
    }
}

//! The `[compaction]` section: when and how conversations are compacted — the mode and
//! strategy, the thresholds, the policy that decides (cost or size), the background
//! builds and the clients' controls.

use serde::{Deserialize, Serialize};

/// When and how conversations are compacted.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// `on`; `observe`: decide and report (headers, stats) what would be done, but
    /// forward every request unmodified; `off`: never compact.
    pub mode: CompactionMode,
    /// Strategy when a request does not choose one with `x-abridge-strategy`.
    pub strategy: crate::strategies::Strategy,
    /// Hard threshold in prompt tokens: over it, a request is compacted before it is
    /// forwarded. 0: `threshold_ratio` × the model's context window.
    pub threshold_tokens: u64,
    /// Hard threshold as a share of the model's context window (when
    /// `threshold_tokens` is 0).
    pub threshold_ratio: f64,
    /// Soft threshold as a share of the hard one: over it, the next checkpoint is built in
    /// the background, so the turn crossing the hard threshold finds it ready. A
    /// compaction aims at most this high (lower when the history grows fast, see
    /// `room_turns`).
    pub soft_ratio: f64,
    /// Context window of models the built-in table does not know.
    pub default_context_window: u64,
    /// Context windows by model name prefix, overriding and extending the built-in table.
    pub context_windows: std::collections::BTreeMap<String, u64>,
    /// Build checkpoints in the background at the soft threshold.
    pub background: bool,
    /// Background compactions running at once.
    pub background_workers: usize,
    /// Background compactions waiting at most; more are dropped (and counted).
    pub background_queue: usize,
    /// Lifetime of the single-flight lock of a summary build; the builder renews it
    /// every third of it, so it only bounds how long a crashed builder blocks others.
    pub lock_ttl_ms: u64,
    /// Turns of a history's observed growth a compaction leaves room for below the hard
    /// threshold (at least the soft threshold's headroom), so compactions come in steps
    /// and the forwarded prefix stays put between them.
    pub room_turns: u32,
    /// CPU-heavy work on large requests (estimates, strategies) running at once, off
    /// the async workers; more waits its turn. 0: half the cores, at least one.
    pub cpu_concurrency: usize,
    /// Clients may choose the strategy (`x-abridge-strategy`).
    pub client_strategy: bool,
    /// Clients may force a compaction (`x-abridge-compact: force`).
    pub client_force: bool,
    /// What decides whether a conversation over its threshold is compacted: `cost`
    /// (whether it pays at the provider's prices, see `compactor::cost`), or `size`
    /// (always: quality over money).
    pub policy: Policy,
    /// Under the cost policy, where a compaction aims: this share of the threshold, so
    /// one checkpoint serves many requests and the forwarded prefix stays frozen.
    pub target_ratio: f64,
    /// How long the provider keeps a prompt cached without use: a request after a longer
    /// pause finds the cache cold, and compacting it costs nearly nothing more.
    pub cache_ttl_ms: u64,
}

/// See [`CompactionConfig::policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Cost,
    Size,
}

impl CompactionConfig {
    /// The controls clients may use.
    pub fn allowed(&self) -> crate::controls::Allowed {
        crate::controls::Allowed {
            strategy: self.client_strategy,
            force: self.client_force,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompactionMode {
    On,
    Observe,
    Off,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            mode: CompactionMode::On,
            strategy: crate::strategies::Strategy::Recency,
            threshold_tokens: 0,
            threshold_ratio: 0.75,
            soft_ratio: 0.7,
            default_context_window: 128_000,
            context_windows: std::collections::BTreeMap::new(),
            background: true,
            background_workers: 2,
            background_queue: 64,
            lock_ttl_ms: 15_000,
            room_turns: 3,
            cpu_concurrency: 0,
            client_strategy: true,
            client_force: true,
            policy: Policy::Cost,
            target_ratio: 0.4,
            cache_ttl_ms: 5 * 60 * 1000,
        }
    }
}

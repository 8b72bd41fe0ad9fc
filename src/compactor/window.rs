//! The context window a request's model has behind its upstream — configured, else
//! learned from the provider (see [`crate::windows`]), else the built-in table, else
//! `compaction.default_context_window` — the threshold it makes, and what an overflow
//! teaches.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::headers::Provider;
use crate::identity::Fingerprint;
use crate::models;
use crate::windows::{Listed, MAX_MODEL_BYTES};

use super::Compactor;
use super::Turn;
use super::overflow::{self, Overflow};

/// Model names an overflow is counted under at most; later ones count as `other`.
const LABELLED_MODELS: usize = 64;
/// (upstream, model) pairs remembered as asked, at most; the oldest is forgotten first
/// (it may be asked again).
const MAX_ASKED: usize = 1024;
/// Asks one tenant's requests may start per [`ASK_PERIOD`].
const ASKS_PER_TENANT: u32 = 4;
const ASK_PERIOD: Duration = Duration::from_secs(600);
/// Tenants whose asks are counted at most (the oldest period is forgotten first).
const MAX_ASKERS: usize = 10_000;

/// What windows are learned for: each route's upstream, by its base URL.
pub(super) struct Upstreams {
    main: String,
    anthropic: String,
    /// Each one's host is a hosted API's, never asked for windows ([`crate::ask`]):
    /// decided once, from the configuration.
    hosted: (bool, bool),
    /// Models overflows were counted under (bounded: clients choose model names).
    labelled: Mutex<std::collections::HashSet<String>>,
    /// Asks made (bounded likewise; see [`Asks`]).
    asks: Mutex<Asks>,
}

/// Which (upstream, model) pairs were asked for their window, and how many asks each
/// tenant started lately: a tenant spraying model names starts at most
/// [`ASKS_PER_TENANT`] asks a period, and the oldest pairs are forgotten first, so no
/// flood locks a model out for good.
#[derive(Default)]
struct Asks {
    /// (upstream, model) → the tick it was asked at.
    asked: HashMap<(String, String), u64>,
    tick: u64,
    /// Tenant → asks started since the period began.
    by_tenant: HashMap<Fingerprint, (Instant, u32)>,
}

impl Asks {
    /// Whether `tenant` may ask for `model` on `upstream` now (recorded when it may).
    fn first(&mut self, upstream: &str, model: &str, tenant: Fingerprint) -> bool {
        let pair = (upstream.to_owned(), model.to_ascii_lowercase());
        if self.asked.contains_key(&pair) {
            return false;
        }
        let now = Instant::now();
        if self.by_tenant.len() >= MAX_ASKERS && !self.by_tenant.contains_key(&tenant) {
            self.by_tenant
                .retain(|_, (since, _)| now.duration_since(*since) < ASK_PERIOD);
            if self.by_tenant.len() >= MAX_ASKERS {
                return false;
            }
        }
        let (since, count) = self.by_tenant.entry(tenant).or_insert((now, 0));
        if now.duration_since(*since) >= ASK_PERIOD {
            (*since, *count) = (now, 0);
        }
        if *count >= ASKS_PER_TENANT {
            return false;
        }
        *count += 1;
        if self.asked.len() >= MAX_ASKED
            && let Some(oldest) = self
                .asked
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
        {
            self.asked.remove(&oldest);
        }
        self.tick += 1;
        self.asked.insert(pair, self.tick);
        true
    }
}

impl Upstreams {
    pub(super) fn of(config: &Config) -> Self {
        let main = config.upstream.to_string();
        let host =
            |base: &crate::config::UpstreamBase| crate::ask::is_hosted(base.authority.host());
        let main_hosted = host(&config.upstream);
        Self {
            hosted: (
                main_hosted,
                config.anthropic_upstream.as_ref().map_or(main_hosted, host),
            ),
            anthropic: config
                .anthropic_upstream
                .as_ref()
                .map_or_else(|| main.clone(), ToString::to_string),
            main,
            labelled: Mutex::default(),
            asks: Mutex::default(),
        }
    }

    fn of_provider(&self, provider: Provider) -> &str {
        match provider {
            Provider::Main => &self.main,
            Provider::Anthropic => &self.anthropic,
        }
    }

    fn is_hosted(&self, provider: Provider) -> bool {
        match provider {
            Provider::Main => self.hosted.0,
            Provider::Anthropic => self.hosted.1,
        }
    }

    /// The label an overflow of `model` is counted under: the model, for the first
    /// [`LABELLED_MODELS`] names short enough to keep; else `other`.
    fn label(&self, model: &str) -> String {
        let mut seen = self
            .labelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if model.len() <= MAX_MODEL_BYTES && (seen.contains(model) || seen.len() < LABELLED_MODELS)
        {
            seen.insert(model.to_owned());
            model.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

impl Compactor {
    /// The context window of `model` on `provider`'s upstream, as `tenant` sees it (see
    /// the module docs).
    pub fn window(&self, provider: Provider, model: &str, tenant: Option<Fingerprint>) -> u64 {
        models::configured_window(model, &self.config.context_windows)
            .or_else(|| self.learned_window(provider, model, tenant))
            .or_else(|| models::table_window(model))
            .unwrap_or(self.config.default_context_window)
    }

    /// What was learned for `model` on `provider`'s upstream, unless configured.
    fn learned_window(
        &self,
        provider: Provider,
        model: &str,
        tenant: Option<Fingerprint>,
    ) -> Option<u64> {
        self.windows
            .get(self.upstreams.of_provider(provider), model, tenant)
    }

    /// The hard threshold: `compaction.threshold_tokens` when set (but never above
    /// what a learned window allows), else `threshold_ratio` × the window.
    pub fn threshold(&self, provider: Provider, model: &str, tenant: Option<Fingerprint>) -> u64 {
        let of = |window: u64| ((window as f64) * self.config.threshold_ratio) as u64;
        if self.config.threshold_tokens > 0 {
            let learned = models::configured_window(model, &self.config.context_windows)
                .is_none()
                .then(|| self.learned_window(provider, model, tenant))
                .flatten();
            return learned.map_or(self.config.threshold_tokens, |w| {
                self.config.threshold_tokens.min(of(w))
            });
        }
        of(self.window(provider, model, tenant))
    }

    /// The provider answered `overflow` to `turn`'s request, sent as `body` and counted
    /// `sent` tokens (its count): counted; and, when it proves an overflow (see
    /// [`crate::compactor::overflow`]) in words the client did not send, the window it
    /// stated (or one below what was sent) learned for the tenant (see
    /// [`crate::windows`]) — unless one is configured for the model, which always wins.
    pub fn overflowed(&self, turn: &Turn<'_, '_>, overflow: &Overflow, sent: u64, body: &[u8]) {
        let (provider, model) = (turn.provider, turn.model);
        self.stats.context_overflow(&self.upstreams.label(model));
        if models::configured_window(model, &self.config.context_windows).is_some()
            || !overflow.proves
        {
            return;
        }
        let Some(tenant) = turn.payer else { return };
        if let Some(evidence) = &overflow.evidence
            && overflow::echoed(evidence, body)
        {
            tracing::warn!(
                model,
                "an overflow answer quotes the request's own words: no window learned"
            );
            return;
        }
        let known = self.window(provider, model, Some(tenant));
        let upstream = self.upstreams.of_provider(provider);
        self.windows
            .overflowed((upstream, model, tenant), overflow.window, sent, known);
    }

    /// Whether the server behind `provider`'s upstream should be asked for `model`'s
    /// window (see [`crate::ask`]) on `tenant`'s request: it is not a hosted API,
    /// nothing configured, learned or in the table says it, it was not asked before
    /// (lately), and the tenant has asks left.
    pub fn should_ask(&self, provider: Provider, model: &str, tenant: Fingerprint) -> bool {
        !self.upstreams.is_hosted(provider)
            && !model.is_empty()
            && model.len() <= MAX_MODEL_BYTES
            && models::configured_window(model, &self.config.context_windows).is_none()
            && self.learned_window(provider, model, None).is_none()
            && models::table_window(model).is_none()
            && self
                .upstreams
                .asks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .first(self.upstreams.of_provider(provider), model, tenant)
    }

    /// What the server said `model`'s window is, when asked.
    pub fn asked(&self, provider: Provider, model: &str, window: u64) {
        self.windows
            .asked(self.upstreams.of_provider(provider), model, window);
    }

    /// Everything learned, for `/admin/stats`.
    pub fn learned_windows(&self) -> Vec<Listed> {
        self.windows.list()
    }

    /// Forgets what was learned for `model` (every model when `None`): how many.
    pub async fn forget_windows(&self, model: Option<&str>) -> usize {
        self.windows.forget(model).await
    }

    /// Reads what other replicas (and earlier runs) learned.
    pub async fn refresh_windows(&self) {
        self.windows.refresh().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_spraying_model_names_asks_a_few_and_locks_no_model_out() {
        let mut asks = Asks::default();
        let (junk, real) = (
            Fingerprint::from_hex(&"11".repeat(32)).unwrap(),
            Fingerprint::from_hex(&"22".repeat(32)).unwrap(),
        );
        let up = "http://gpu:8080/v1";
        let started = (0..2000)
            .filter(|i| asks.first(up, &format!("junk-{i}"), junk))
            .count();
        assert_eq!(started, ASKS_PER_TENANT as usize);
        assert!(
            asks.first(up, "Qwen3-8B", real),
            "another tenant's model is asked"
        );
        assert!(!asks.first(up, "qwen3-8b", real), "once");
        // Past the bound on pairs, the oldest are forgotten, never the newest.
        for t in 0..(MAX_ASKED as u32 * 2) {
            let mut bytes = [0u8; 32];
            bytes[..4].copy_from_slice(&t.to_le_bytes());
            let tenant = Fingerprint::from_hex(&hex::encode(bytes)).unwrap();
            asks.first(up, &format!("m-{t}"), tenant);
        }
        assert!(asks.asked.len() <= MAX_ASKED);
        assert!(asks.by_tenant.len() <= MAX_ASKERS);
        assert!(
            !asks.first(up, &format!("m-{}", MAX_ASKED * 2 - 1), real),
            "the newest is still known"
        );
        assert!(
            asks.first(up, "qwen3-8b", real),
            "the first, long forgotten, may be asked again"
        );
    }
}

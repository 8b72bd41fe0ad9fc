//! The context window a request's model has behind its upstream — configured, else
//! learned from the provider (see [`crate::windows`]), else the built-in table, else
//! `compaction.default_context_window` — the threshold it makes, and what an overflow
//! teaches.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::config::Config;
use crate::headers::Provider;
use crate::models;
use crate::windows::{Listed, MAX_LEARNED};

use super::Compactor;
use super::overflow::Overflow;

/// Model names an overflow is counted under at most; later ones count as `other`.
const LABELLED_MODELS: usize = 64;

/// What windows are learned for: each route's upstream, by its base URL.
pub(super) struct Upstreams {
    main: String,
    anthropic: String,
    /// Each one's host is a hosted API's, never asked for windows ([`crate::ask`]):
    /// decided once, from the configuration.
    hosted: (bool, bool),
    /// Models overflows were counted under (bounded: clients choose model names).
    labelled: Mutex<HashSet<String>>,
    /// (upstream, model) pairs whose server was asked for the window (bounded likewise).
    asked: Mutex<HashSet<String>>,
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
            labelled: Mutex::new(HashSet::new()),
            asked: Mutex::new(HashSet::new()),
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

    /// Whether to ask for `model`'s window on `upstream` now: the first time, and while
    /// fewer than [`MAX_LEARNED`] pairs were asked.
    fn first_ask(&self, upstream: &str, model: &str) -> bool {
        let mut asked = self
            .asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        asked.len() < MAX_LEARNED && asked.insert(format!("{upstream} {model}"))
    }

    /// The label an overflow of `model` is counted under.
    fn label(&self, model: &str) -> String {
        let mut seen = self
            .labelled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(model) || seen.len() < LABELLED_MODELS {
            seen.insert(model.to_owned());
            model.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

impl Compactor {
    /// The context window of `model` on `provider`'s upstream (see the module docs).
    pub fn window(&self, provider: Provider, model: &str) -> u64 {
        models::configured_window(model, &self.config.context_windows)
            .or_else(|| self.learned_window(provider, model))
            .or_else(|| models::table_window(model))
            .unwrap_or(self.config.default_context_window)
    }

    /// What was learned for `model` on `provider`'s upstream, unless configured.
    fn learned_window(&self, provider: Provider, model: &str) -> Option<u64> {
        self.windows
            .get(self.upstreams.of_provider(provider), model)
    }

    /// The hard threshold: `compaction.threshold_tokens` when set (but never above
    /// what a learned window allows), else `threshold_ratio` × the window.
    pub fn threshold(&self, provider: Provider, model: &str) -> u64 {
        let of = |window: u64| ((window as f64) * self.config.threshold_ratio) as u64;
        if self.config.threshold_tokens > 0 {
            let learned = models::configured_window(model, &self.config.context_windows)
                .is_none()
                .then(|| self.learned_window(provider, model))
                .flatten();
            return learned.map_or(self.config.threshold_tokens, |w| {
                self.config.threshold_tokens.min(of(w))
            });
        }
        of(self.window(provider, model))
    }

    /// The provider answered `overflow` for a request of `sent` tokens (its count):
    /// counted, and the window it stated (or one below what was sent) learned — unless
    /// one is configured for the model, which always wins.
    pub fn overflowed(&self, provider: Provider, model: &str, overflow: Overflow, sent: u64) {
        self.stats.context_overflow(&self.upstreams.label(model));
        if models::configured_window(model, &self.config.context_windows).is_some() {
            return;
        }
        let known = self.window(provider, model);
        let upstream = self.upstreams.of_provider(provider);
        self.windows
            .overflowed((upstream, model), overflow.window, sent, known);
    }

    /// Whether the server behind `provider`'s upstream should be asked for `model`'s
    /// window (see [`crate::ask`]): it is not a hosted API, nothing configured, learned
    /// or in the table says it, and it was not asked before.
    pub fn should_ask(&self, provider: Provider, model: &str) -> bool {
        !self.upstreams.is_hosted(provider)
            && !model.is_empty()
            && models::configured_window(model, &self.config.context_windows).is_none()
            && self.learned_window(provider, model).is_none()
            && models::table_window(model).is_none()
            && self
                .upstreams
                .first_ask(self.upstreams.of_provider(provider), model)
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

    /// Reads what other replicas (and earlier runs) learned.
    pub async fn refresh_windows(&self) {
        self.windows.refresh().await;
    }
}

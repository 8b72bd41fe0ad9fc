//! What tokens cost: a price per model (input, cached input, cache write, output, in US
//! dollars per million tokens), from a built-in table of the common hosted models and
//! the configuration's `[prices]`, which overrides and extends it. A model is priced by
//! the longest key its name starts with (`claude-sonnet-4-5-20250929` by
//! `claude-sonnet-4-5`), after any `vendor/` prefix a router adds; a model no key
//! matches has no price, and the figures that need one say so.
//!
//! The built-in prices are the providers' published list prices as of
//! [`BUILT_IN_AS_OF`]; contracts, batch and regional prices differ, so an operator who
//! knows better sets `[prices]`.

use std::collections::BTreeMap;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

/// When the built-in table was taken from the providers' price pages.
pub const BUILT_IN_AS_OF: &str = "2025-08";

/// A model's prices, US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Input tokens read neither from nor into the prompt cache.
    pub input: f64,
    /// Input tokens the prompt cache served. Default: `input`.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Input tokens written to the prompt cache (Anthropic's cache writes). Default:
    /// `input`.
    #[serde(default)]
    pub cache_write: Option<f64>,
    pub output: f64,
}

/// Tokens of one exchange, by how they are billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    /// Every input token, the cache's reads and writes included.
    pub input: u64,
    /// Of which the prompt cache served.
    pub cached: u64,
    /// Of which were written to the prompt cache.
    pub cache_write: u64,
    pub output: u64,
}

impl Price {
    const fn new(input: f64, cached_input: f64, cache_write: f64, output: f64) -> Self {
        Self {
            input,
            cached_input: Some(cached_input),
            cache_write: Some(cache_write),
            output,
        }
    }

    /// What `tokens` cost, in millionths of a dollar.
    pub fn micros(&self, tokens: Tokens) -> f64 {
        let plain = tokens
            .input
            .saturating_sub(tokens.cached)
            .saturating_sub(tokens.cache_write);
        plain as f64 * self.input
            + tokens.cached as f64 * self.cached_input.unwrap_or(self.input)
            + tokens.cache_write as f64 * self.cache_write.unwrap_or(self.input)
            + tokens.output as f64 * self.output
    }

    /// Why a configured price cannot be used (negative or not a number).
    fn check(&self) -> Result<(), String> {
        let all = [
            Some(self.input),
            self.cached_input,
            self.cache_write,
            Some(self.output),
        ];
        if all.into_iter().flatten().all(|p| p.is_finite() && p >= 0.0) {
            Ok(())
        } else {
            Err("every price must be a number of dollars per million tokens, 0 or more".into())
        }
    }
}

/// OpenAI: a cache write costs what input costs (and is not reported).
const fn openai(input: f64, cached: f64, output: f64) -> Price {
    Price::new(input, cached, input, output)
}

/// Anthropic: a cache read is a tenth of input, a five-minute cache write 1.25×.
const fn anthropic(input: f64, output: f64) -> Price {
    Price::new(input, input / 10.0, input * 1.25, output)
}

/// The built-in table, by model name prefix (see [`BUILT_IN_AS_OF`]).
const BUILT_IN: &[(&str, Price)] = &[
    ("gpt-5", openai(1.25, 0.125, 10.0)),
    ("gpt-5-mini", openai(0.25, 0.025, 2.0)),
    ("gpt-5-nano", openai(0.05, 0.005, 0.4)),
    ("gpt-4.1", openai(2.0, 0.5, 8.0)),
    ("gpt-4.1-mini", openai(0.4, 0.1, 1.6)),
    ("gpt-4.1-nano", openai(0.1, 0.025, 0.4)),
    ("gpt-4o", openai(2.5, 1.25, 10.0)),
    ("gpt-4o-mini", openai(0.15, 0.075, 0.6)),
    ("o1", openai(15.0, 7.5, 60.0)),
    ("o1-mini", openai(1.1, 0.55, 4.4)),
    ("o3", openai(2.0, 0.5, 8.0)),
    ("o3-mini", openai(1.1, 0.55, 4.4)),
    ("o4-mini", openai(1.1, 0.275, 4.4)),
    ("codex-mini", openai(1.5, 0.375, 6.0)),
    ("claude-opus-4", anthropic(15.0, 75.0)),
    ("claude-opus-4-5", anthropic(5.0, 25.0)),
    ("claude-sonnet-4", anthropic(3.0, 15.0)),
    ("claude-3-7-sonnet", anthropic(3.0, 15.0)),
    ("claude-3-5-sonnet", anthropic(3.0, 15.0)),
    ("claude-haiku-4-5", anthropic(1.0, 5.0)),
    ("claude-3-5-haiku", anthropic(0.8, 4.0)),
    ("claude-3-haiku", anthropic(0.25, 1.25)),
    ("claude-3-opus", anthropic(15.0, 75.0)),
];

/// The price table in force: the built-in one overlaid by the configuration's.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    by_prefix: BTreeMap<String, Price>,
}

impl Default for Prices {
    fn default() -> Self {
        Self::new(&BTreeMap::new()).unwrap_or(Self {
            by_prefix: BTreeMap::new(),
        })
    }
}

impl Prices {
    /// The built-in table overlaid by `configured`; an error names the first bad entry.
    pub fn new(configured: &BTreeMap<String, Price>) -> Result<Self, String> {
        let mut by_prefix: BTreeMap<String, Price> = BUILT_IN
            .iter()
            .map(|(model, price)| ((*model).to_owned(), *price))
            .collect();
        for (model, price) in configured {
            price.check().map_err(|e| format!("{model}: {e}"))?;
            if model.trim().is_empty() {
                return Err("a model name must not be empty".into());
            }
            by_prefix.insert(model.clone(), *price);
        }
        Ok(Self { by_prefix })
    }

    /// The price of `model`: the longest key its name starts with, tried again without
    /// a `vendor/` prefix (`openai/gpt-4o`); `None` when no key matches.
    pub fn of(&self, model: &str) -> Option<Price> {
        self.longest(model).or_else(|| {
            let (_, bare) = model.rsplit_once('/')?;
            self.longest(bare)
        })
    }

    fn longest(&self, model: &str) -> Option<Price> {
        // Keys that are prefixes of `model` sort at or before it; the longest is the last
        // of them. Walking back from `model` stops at the first key that is one.
        self.by_prefix
            .range::<str, _>((Bound::Unbounded, Bound::Included(model)))
            .rev()
            .take_while(|(key, _)| model.as_bytes().first() == key.as_bytes().first())
            .find(|(key, _)| model.starts_with(key.as_str()))
            .map(|(_, price)| *price)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_prefix_prices_a_model() {
        let prices = Prices::default();
        let of = |m: &str| prices.of(m).map(|p| p.input);
        assert_eq!(of("gpt-4o-2024-08-06"), Some(2.5));
        assert_eq!(of("gpt-4o-mini-2024-07-18"), Some(0.15));
        assert_eq!(of("gpt-5-mini"), Some(0.25));
        assert_eq!(of("gpt-5.1-codex"), Some(1.25));
        assert_eq!(of("claude-sonnet-4-5-20250929"), Some(3.0));
        assert_eq!(of("claude-opus-4-1-20250805"), Some(15.0));
        assert_eq!(of("claude-opus-4-5"), Some(5.0));
        assert_eq!(of("openai/gpt-4o-mini"), Some(0.15));
        assert_eq!(of("anthropic/claude-haiku-4-5"), Some(1.0));
        assert_eq!(of("qwen2.5-coder-7b"), None);
        assert_eq!(of(""), None);
    }

    #[test]
    fn the_configuration_overrides_and_extends_the_table() {
        let mut configured = BTreeMap::new();
        let local = Price {
            input: 0.0,
            cached_input: None,
            cache_write: None,
            output: 0.0,
        };
        configured.insert("qwen".to_owned(), local);
        configured.insert("gpt-4o".to_owned(), openai(2.0, 1.0, 8.0));
        let prices = Prices::new(&configured).unwrap();
        assert_eq!(prices.of("qwen2.5-coder-7b"), Some(local));
        assert_eq!(prices.of("gpt-4o").map(|p| p.input), Some(2.0));
        // A longer built-in key still wins for the models it names.
        assert_eq!(prices.of("gpt-4o-mini").map(|p| p.input), Some(0.15));
        configured.insert(
            "bad".to_owned(),
            Price {
                input: -1.0,
                ..local
            },
        );
        assert!(Prices::new(&configured).unwrap_err().starts_with("bad:"));
    }

    #[test]
    fn a_price_applies_to_each_kind_of_token() {
        let price = anthropic(3.0, 15.0);
        // 1,000 input of which 600 read from the cache and 300 written; 100 output.
        let tokens = Tokens {
            input: 1000,
            cached: 600,
            cache_write: 300,
            output: 100,
        };
        let expected = 100.0 * 3.0 + 600.0 * 0.3 + 300.0 * 3.75 + 100.0 * 15.0;
        assert!((price.micros(tokens) - expected).abs() < 1e-9);
        // Unset cache prices are input's.
        let plain = Price {
            input: 2.0,
            cached_input: None,
            cache_write: None,
            output: 4.0,
        };
        assert!((plain.micros(tokens) - (1000.0 * 2.0 + 100.0 * 4.0)).abs() < 1e-9);
    }
}

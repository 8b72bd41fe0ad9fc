//! Context windows of models, for `compaction.threshold_ratio`.
//!
//! A built-in table of common models (tokens), matched by the longest prefix of the
//! model name after any provider prefix (`openai/gpt-4o` is `gpt-4o`), overridable and
//! extendable in configuration. Unknown models get `compaction.default_context_window`.

use std::collections::BTreeMap;

/// (model name prefix, context window in tokens). Longest matching prefix wins.
const KNOWN: &[(&str, u64)] = &[
    // Of its 400,000 tokens up to 128,000 are output: 272,000 of input, the window
    // Codex works with (its rollouts record `model_context_window: 272000`).
    ("gpt-5", 272_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.5", 128_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("chatgpt-4o", 128_000),
    ("o1-mini", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude", 200_000),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-2", 1_048_576),
    ("gemini-3", 1_048_576),
    ("llama-3.1", 131_072),
    ("llama-3.2", 131_072),
    ("llama-3.3", 131_072),
    ("llama-4", 1_048_576),
    ("meta-llama-3.1", 131_072),
    ("mistral-large", 131_072),
    ("mistral-small", 32_768),
    ("codestral", 256_000),
    ("deepseek", 128_000),
    ("qwen2.5", 131_072),
    ("qwen3", 131_072),
    ("grok", 131_072),
];

/// The window `compaction.context_windows` gives `model` (longest prefix), if any.
pub fn configured_window(model: &str, configured: &BTreeMap<String, u64>) -> Option<u64> {
    longest(model, &mut configured.iter().map(|(k, v)| (k.as_str(), *v)))
}

/// The built-in table's window for `model` (longest prefix), if any.
pub fn table_window(model: &str) -> Option<u64> {
    longest(model, &mut KNOWN.iter().copied())
}

fn longest(model: &str, entries: &mut dyn Iterator<Item = (&str, u64)>) -> Option<u64> {
    let name = model.rsplit('/').next().unwrap_or(model);
    // Case-insensitive prefix test without allocating: this runs on every request.
    let has_prefix = |prefix: &str| {
        name.len() >= prefix.len()
            && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
    };
    entries
        .filter(|(prefix, _)| has_prefix(prefix) || model.eq_ignore_ascii_case(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, window)| window)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Configured prefixes first, then the table, else `default` (the compactor puts
    /// learned windows between the two).
    fn context_window(model: &str, configured: &BTreeMap<String, u64>, default: u64) -> u64 {
        configured_window(model, configured)
            .or_else(|| table_window(model))
            .unwrap_or(default)
    }

    #[test]
    fn longest_prefix_after_the_provider_wins() {
        let none = BTreeMap::new();
        assert_eq!(context_window("gpt-4o-mini-2024-07-18", &none, 1), 128_000);
        assert_eq!(context_window("gpt-4", &none, 1), 8_192);
        assert_eq!(context_window("gpt-4-turbo-preview", &none, 1), 128_000);
        assert_eq!(context_window("openai/gpt-4.1-mini", &none, 1), 1_047_576);
        assert_eq!(
            context_window("anthropic/claude-sonnet-4", &none, 1),
            200_000
        );
        assert_eq!(context_window("gpt-5.1-codex-max", &none, 1), 272_000);
        assert_eq!(context_window("o1-mini", &none, 1), 128_000);
        assert_eq!(context_window("o1-preview", &none, 1), 200_000);
        assert_eq!(context_window("my-local-model", &none, 4096), 4096);
    }

    #[test]
    fn configuration_overrides_and_extends() {
        let configured =
            BTreeMap::from([("gpt-4o".to_owned(), 64_000), ("smollm2".to_owned(), 8_192)]);
        assert_eq!(context_window("gpt-4o-mini", &configured, 1), 64_000);
        assert_eq!(
            context_window("SmolLM2-135M-Instruct", &configured, 1),
            8_192
        );
        assert_eq!(context_window("gpt-4.1", &configured, 1), 1_047_576);
    }
}

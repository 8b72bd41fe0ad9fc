//! Which request parameters a summary model accepts. OpenAI's reasoning models (gpt-5,
//! the o-series) refuse `max_tokens` ("Use 'max_completion_tokens' instead") and any
//! `temperature` but the default; other providers and older models want `max_tokens`.
//! A summary request starts from what the model's name suggests; when the provider
//! answers 400 naming a parameter abridge can do without, the summariser retries once
//! in the other form and remembers it for that model (in this process).

use std::collections::HashMap;
use std::sync::Mutex;

/// How a summary request is asked of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Params {
    /// `max_completion_tokens` instead of `max_tokens`.
    pub completion_tokens: bool,
    /// No `temperature` (the model's default).
    pub default_temperature: bool,
}

impl Params {
    /// What the model's name suggests (a provider prefix such as `openai/` aside).
    pub fn guess(model: &str) -> Self {
        // `openai/gpt-5` (routers), `ft:gpt-5…:org::id` (fine-tunes).
        let name = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let name = name.strip_prefix("ft:").unwrap_or(&name);
        let o_series = name.len() > 1
            && name.starts_with('o')
            && name.as_bytes().get(1).is_some_and(u8::is_ascii_digit);
        let reasoning = name.starts_with("gpt-5") || o_series;
        Self {
            completion_tokens: reasoning,
            default_temperature: reasoning,
        }
    }

    /// The form to retry in after a 400 with `message`: `None` when the refusal names
    /// nothing abridge can change.
    pub fn after_refusal(self, message: &str) -> Option<Self> {
        let message = message.to_ascii_lowercase();
        let mut next = self;
        if message.contains("max_tokens") {
            next.completion_tokens = true;
        }
        if message.contains("temperature") {
            next.default_temperature = true;
        }
        (next != self).then_some(next)
    }
}

/// Most models remembered; past it the memory starts over (guesses still apply).
const MAX_MODELS: usize = 1024;

/// What was learned per model.
#[derive(Debug, Default)]
pub struct Learned {
    models: Mutex<HashMap<String, Params>>,
}

impl Learned {
    /// The form to ask `model` in: what was learned, else the guess.
    pub fn for_model(&self, model: &str) -> Params {
        let models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        models
            .get(model)
            .copied()
            .unwrap_or_else(|| Params::guess(model))
    }

    pub fn remember(&self, model: &str, params: Params) {
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if models.len() >= MAX_MODELS && !models.contains_key(model) {
            models.clear();
        }
        models.insert(model.to_owned(), params);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_models_are_asked_in_their_form() {
        for model in [
            "gpt-5",
            "gpt-5.2-mini",
            "o3",
            "o4-mini",
            "openai/gpt-5",
            "O1",
            "ft:gpt-5-mini:acme::x1",
        ] {
            assert_eq!(
                Params::guess(model),
                Params {
                    completion_tokens: true,
                    default_temperature: true
                },
                "{model}"
            );
        }
        for model in ["gpt-4o-mini", "claude-sonnet-4-5", "llama-3", "olmo-2", "o"] {
            assert_eq!(Params::guess(model), Params::default(), "{model}");
        }
    }

    #[test]
    fn a_refusal_names_what_to_drop_once() {
        let p = Params::default();
        let tokens = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.";
        let temp = "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported.";
        let after = p.after_refusal(tokens).unwrap();
        assert!(after.completion_tokens && !after.default_temperature);
        assert!(after.after_refusal(temp).unwrap().default_temperature);
        assert_eq!(after.after_refusal(tokens), None, "nothing left to change");
        assert_eq!(p.after_refusal("invalid api key"), None);
    }

    #[test]
    fn what_is_learned_is_remembered_per_model() {
        let learned = Learned::default();
        assert_eq!(learned.for_model("m"), Params::default());
        let p = Params {
            completion_tokens: true,
            default_temperature: false,
        };
        learned.remember("m", p);
        assert_eq!(learned.for_model("m"), p);
        assert_eq!(learned.for_model("other"), Params::default());
    }
}

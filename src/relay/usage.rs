//! The token usage a provider reports, in each naming and wherever the format puts it.
//!
//! Chat Completions says `prompt_tokens` / `completion_tokens`; the Responses API and
//! several OpenAI-compatible servers say `input_tokens` / `output_tokens`. Both are read;
//! `prompt_tokens` wins when a body carries both. Anthropic's Messages API counts cached
//! input apart: the prompt is `input_tokens` + `cache_creation_input_tokens` +
//! `cache_read_input_tokens` (the last is what the cache served).
//!
//! Where: chat bodies and chunks and Responses bodies at the top level (`usage`); a
//! Responses stream's terminal event (`response.completed`, `.incomplete`, `.failed`)
//! in `response.usage`; an Anthropic stream's `message_start` in `message.usage` and
//! its `message_delta` at the top level (cumulative: the latest wins, never a sum).

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input tokens the provider counted for the request (what compaction keeps in check).
    pub prompt_tokens: u64,
    pub completion_tokens: Option<u64>,
    /// Input tokens served from the provider's prompt cache, when it says.
    pub cached_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`; OpenAI's cache writes are not reported).
    pub cache_write_tokens: Option<u64>,
}

/// The `usage` object as providers send it.
#[derive(Debug, Deserialize)]
pub struct RawUsage {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

impl RawUsage {
    /// `None` when the object names no input token count at all.
    pub fn normalise(self) -> Option<Usage> {
        let completion_tokens = self.completion_tokens.or(self.output_tokens);
        // Anthropic's naming: cached input is counted apart from `input_tokens`.
        if self.prompt_tokens.is_none()
            && (self.cache_creation_input_tokens.is_some()
                || self.cache_read_input_tokens.is_some())
        {
            let (created, read) = (
                self.cache_creation_input_tokens.unwrap_or(0),
                self.cache_read_input_tokens.unwrap_or(0),
            );
            return Some(Usage {
                prompt_tokens: self
                    .input_tokens?
                    .saturating_add(created)
                    .saturating_add(read),
                completion_tokens,
                cached_tokens: self.cache_read_input_tokens,
                cache_write_tokens: self.cache_creation_input_tokens,
            });
        }
        let prompt_tokens = self.prompt_tokens.or(self.input_tokens)?;
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens: self
                .prompt_tokens_details
                .or(self.input_tokens_details)
                .and_then(|d| d.cached_tokens),
            cache_write_tokens: self.cache_creation_input_tokens,
        })
    }
}

/// A `usage` object already parsed (`None` when it names no input token count).
pub fn of_value(usage: &serde_json::Value) -> Option<Usage> {
    RawUsage::deserialize(usage).ok()?.normalise()
}

/// The input and output tokens of a `usage` object (0 for what it does not say).
pub fn spent(usage: &serde_json::Value) -> (u64, u64) {
    of_value(usage).map_or((0, 0), |u| {
        (u.prompt_tokens, u.completion_tokens.unwrap_or(0))
    })
}

/// A response body or stream event, of which only `usage` (and whether `choices` is
/// empty) matters here; everything else is skipped without being built.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    pub choices: Option<Array>,
    /// A Responses stream event's response object.
    #[serde(default)]
    response: Option<Inner>,
    /// An Anthropic `message_start` event's message.
    #[serde(default)]
    message: Option<Inner>,
}

/// An object nested in an event that may carry `usage`.
#[derive(Debug, Deserialize)]
struct Inner {
    #[serde(default)]
    usage: Option<RawUsage>,
}

impl Envelope {
    /// The usage this body or event reports, wherever its format puts it.
    pub fn usage(self) -> Option<Usage> {
        let nested = |inner: Option<Inner>| inner.and_then(|i| i.usage);
        self.usage
            .or_else(|| nested(self.response))
            .or_else(|| nested(self.message))?
            .normalise()
    }
}

/// A JSON array, of which only the length is kept: its elements are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Array {
    pub len: usize,
}

impl<'de> Deserialize<'de> for Array {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counter;
        impl<'de> serde::de::Visitor<'de> for Counter {
            type Value = Array;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Array, A::Error> {
                let mut len = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    len += 1;
                }
                Ok(Array { len })
            }
        }
        d.deserialize_seq(Counter)
    }
}

/// Reads `usage` from a complete JSON response body.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<Envelope>(body).ok()?.usage()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_namings() {
        let a = from_json(
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,
                "prompt_tokens_details":{"cached_tokens":8}}}"#,
        )
        .unwrap();
        assert_eq!(
            a,
            Usage {
                prompt_tokens: 12,
                completion_tokens: Some(3),
                cached_tokens: Some(8),
                cache_write_tokens: None,
            }
        );
        let b = from_json(br#"{"usage":{"input_tokens":7,"output_tokens":2}}"#).unwrap();
        assert_eq!(b.prompt_tokens, 7);
        assert_eq!(b.completion_tokens, Some(2));
    }

    #[test]
    fn choices_are_counted_not_collected() {
        let e: Envelope = serde_json::from_slice(br#"{"choices":[{"a":[1,{}]},2],"x":1}"#).unwrap();
        assert_eq!(e.choices, Some(Array { len: 2 }));
        let e: Envelope = serde_json::from_slice(br#"{"choices":null}"#).unwrap();
        assert_eq!(e.choices, None);
        assert!(serde_json::from_slice::<Envelope>(br#"{"choices":{}}"#).is_err());
    }

    #[test]
    fn absent_or_null_usage_is_none() {
        assert_eq!(from_json(br#"{"choices":[]}"#), None);
        assert_eq!(from_json(br#"{"usage":null}"#), None);
        assert_eq!(from_json(br#"{"usage":{"total_tokens":3}}"#), None);
        assert_eq!(from_json(b"not json"), None);
    }
}

//! The token usage a provider reports, in either naming.
//!
//! Chat Completions says `prompt_tokens` / `completion_tokens`; the Responses API and
//! several OpenAI-compatible servers say `input_tokens` / `output_tokens`. Both are read;
//! `prompt_tokens` wins when a body carries both.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input tokens the provider counted for the request (what compaction keeps in check).
    pub prompt_tokens: u64,
    pub completion_tokens: Option<u64>,
    /// Input tokens served from the provider's prompt cache, when it says.
    pub cached_tokens: Option<u64>,
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
}

#[derive(Debug, Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

impl RawUsage {
    /// `None` when the object names no input token count at all.
    pub fn normalise(self) -> Option<Usage> {
        let prompt_tokens = self.prompt_tokens.or(self.input_tokens)?;
        Some(Usage {
            prompt_tokens,
            completion_tokens: self.completion_tokens.or(self.output_tokens),
            cached_tokens: self
                .prompt_tokens_details
                .or(self.input_tokens_details)
                .and_then(|d| d.cached_tokens),
        })
    }
}

/// A response body or stream event, of which only `usage` (and whether `choices` is
/// empty) matters here; everything else is skipped without being built.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    #[serde(default)]
    pub usage: Option<RawUsage>,
    #[serde(default)]
    pub choices: Option<Array>,
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
    serde_json::from_slice::<Envelope>(body)
        .ok()?
        .usage?
        .normalise()
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
                cached_tokens: Some(8)
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

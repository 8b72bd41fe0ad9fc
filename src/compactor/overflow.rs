//! Recognising a provider's "the prompt does not fit the context window" answer, for
//! compact-and-retry.
//!
//! OpenAI says `400` with `code: "context_length_exceeded"`; llama.cpp's server says
//! `400` with `type: "exceed_context_size_error"`; vLLM, OpenRouter and others put it in
//! the message only ("maximum context length", "prompt is too long", ...); some gateways
//! answer `413`. Only the error body's code, type and message are read.

use http::StatusCode;
use serde::Deserialize;

/// Phrases providers use in the message of a context overflow (lower case).
const PHRASES: [&str; 8] = [
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "exceeds the available context size",
    "exceed_context_size",
    "prompt is too long",
    "input is too long",
    "reduce the length of the messages",
];

/// Whether a provider's error response means the request was too long for the model.
pub fn is_context_overflow(status: StatusCode, body: &[u8]) -> bool {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return true;
    }
    if !matches!(status.as_u16(), 400 | 422) {
        return false;
    }
    #[derive(Deserialize)]
    struct Envelope {
        error: ErrorBody,
    }
    #[derive(Deserialize)]
    struct ErrorBody {
        #[serde(default)]
        message: Option<String>,
        #[serde(default, rename = "type")]
        kind: Option<String>,
        #[serde(default)]
        code: Option<serde_json::Value>,
    }
    let Ok(Envelope { error }) = serde_json::from_slice::<Envelope>(body) else {
        return false;
    };
    let code = match &error.code {
        Some(serde_json::Value::String(s)) => s.as_str(),
        _ => "",
    };
    if code == "context_length_exceeded"
        || error.kind.as_deref() == Some("exceed_context_size_error")
    {
        return true;
    }
    let message = error.message.unwrap_or_default().to_lowercase();
    PHRASES.iter().any(|p| message.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_providers_ways_of_saying_it() {
        let bad = StatusCode::BAD_REQUEST;
        for body in [
            r#"{"error":{"message":"This model's maximum context length is 10 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens","type":"BadRequestError","code":400}}"#,
            r#"{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum","code":400}}"#,
        ] {
            assert!(is_context_overflow(bad, body.as_bytes()), "{body}");
        }
        assert!(is_context_overflow(StatusCode::PAYLOAD_TOO_LARGE, b""));
    }

    #[test]
    fn other_errors_are_not_overflows() {
        let bad = StatusCode::BAD_REQUEST;
        assert!(!is_context_overflow(
            bad,
            br#"{"error":{"message":"Invalid value: 'wizard'","code":"invalid_value"}}"#
        ));
        assert!(!is_context_overflow(bad, b"not json"));
        assert!(!is_context_overflow(
            StatusCode::INTERNAL_SERVER_ERROR,
            br#"{"error":{"message":"maximum context length","code":"context_length_exceeded"}}"#
        ));
        assert!(!is_context_overflow(
            StatusCode::TOO_MANY_REQUESTS,
            br#"{"error":{"message":"slow down"}}"#
        ));
    }
}

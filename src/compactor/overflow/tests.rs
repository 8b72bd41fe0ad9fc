//! Each family's overflow answer, as the providers write it (bodies from their issues
//! and sources; see `docs/src/windows.md`), and answers that are not overflows.

use serde_json::json;

use super::*;

const BAD: StatusCode = StatusCode::BAD_REQUEST;

/// (family, status, body, the window it states).
const FAMILIES: &[(&str, u16, &str, Option<u64>)] = &[
    (
        "openai",
        400,
        r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        Some(8192),
    ),
    (
        "openai-requested",
        400,
        r#"{"error":{"message":"This model's maximum context length is 16385 tokens. However, you requested 17000 tokens (15000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        Some(16385),
    ),
    (
        "openai-gpt5",
        400,
        r#"{"error":{"message":"Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 289650 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        Some(272000),
    ),
    (
        "openai-responses",
        400,
        r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
        None,
    ),
    (
        "anthropic",
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 191989 tokens > 180000 maximum"},"request_id":"req_011CWAgPbMohjStFaYrkLZCm"}"#,
        Some(180000),
    ),
    (
        "anthropic-max-tokens",
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, decrease input length or `max_tokens` and try again"}}"#,
        Some(204648),
    ),
    (
        "anthropic-413",
        413,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"Request size exceeds model context window"}}"#,
        None,
    ),
    (
        "llama-server",
        400,
        r#"{"error":{"code":400,"message":"request (124315 tokens) exceeds the available context size (123904 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":124315,"n_ctx":123904}}"#,
        Some(123904),
    ),
    (
        "llama-server-2025",
        400,
        r#"{"error":{"code":400,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":14429,"n_ctx":8192}}"#,
        Some(8192),
    ),
    (
        "llama-server-old",
        400,
        r#"{"error":{"code":400,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"invalid_request_error"}}"#,
        None,
    ),
    (
        "vllm-flat",
        400,
        r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 6751 tokens (6719 in the messages, 32 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
        Some(2048),
    ),
    (
        "vllm-wrapped",
        400,
        r#"{"error":{"message":"This model's maximum context length is 32768 tokens. However, your request has 40000 input tokens. Please reduce the length of the input messages.","type":"BadRequestError","param":null,"code":400}}"#,
        Some(32768),
    ),
    (
        "vllm-renderer",
        400,
        r#"{"error":{"message":"You passed 27905 input tokens and requested 4096 output tokens. However, the model's context length is only 32000 tokens, resulting in a maximum input length of 27904 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=27905)","type":"BadRequestError","param":"input_tokens","code":400}}"#,
        Some(32000),
    ),
    (
        "vllm-engine",
        400,
        r#"{"error":{"message":"The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens.","type":"BadRequestError","param":null,"code":400}}"#,
        Some(8192),
    ),
    (
        "ollama",
        400,
        r#"{"error":{"message":"the prompt is longer than the context length currently available to the model; shorten the prompt, adjust the context length in settings, or use a model with a longer context length","type":"invalid_request_error","param":null,"code":null}}"#,
        None,
    ),
    (
        "ollama-raw-llama",
        400,
        r#"{"error":{"message":"{\"error\":{\"code\":400,\"message\":\"request (9000 tokens) exceeds the available context size (4096 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":9000,\"n_ctx\":4096}}","type":"invalid_request_error","param":null,"code":null}}"#,
        Some(4096),
    ),
    (
        "lm-studio-string",
        400,
        r#"{"error":"Trying to keep the first 9000 tokens when context the overflows. However, the model is loaded with context length of only 4096 tokens, which is not enough. Try to load the model with a larger context length, or provide a shorter input"}"#,
        Some(4096),
    ),
    (
        "lm-studio-n-keep",
        400,
        r#"{"error":"The number of tokens to keep from the initial prompt is greater than the context length (n_keep: 13055>= n_ctx: 4096). Try to load the model with a larger context length, or provide a shorter input."}"#,
        Some(4096),
    ),
    (
        "openrouter",
        400,
        r#"{"error":{"message":"This endpoint's maximum context length is 131072 tokens. However, you requested about 141607 tokens (10535 of text input, 131072 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","code":400,"metadata":{"provider_name":"Chutes"}}}"#,
        Some(131072),
    ),
    (
        "openrouter-raw",
        413,
        r#"{"error":{"message":"Provider returned error","code":413,"metadata":{"raw":"{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 210000 tokens > 200000 maximum\"}}","provider_name":"Anthropic"}}}"#,
        Some(200000),
    ),
    (
        "gemini",
        400,
        r#"[{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}]"#,
        Some(1048576),
    ),
    (
        "mistral",
        400,
        r#"{"object":"error","message":"Prompt contains 159202 tokens and 0 draft tokens, too large for model with 131072 maximum context length","type":"invalid_request_invalid_args","param":null,"code":"3051","raw_status_code":400}"#,
        Some(131072),
    ),
    (
        "groq",
        400,
        r#"{"error":{"message":"Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        None,
    ),
    (
        "together",
        400,
        r#"{"error":{"message":"The input (605732 tokens) is longer than the model's context length (262144 tokens).","type":"invalid_request_error"}}"#,
        Some(262144),
    ),
    (
        "together-tgi",
        400,
        r#"{"error":{"message":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4097. Given: 80125 `inputs` tokens and 4096 `max_new_tokens`","type":"invalid_request_error","param":"max_tokens","code":null}}"#,
        Some(4097),
    ),
    (
        "sglang",
        400,
        r#"{"object":"error","message":"The input (605732 tokens) is longer than the model's context length (262144 tokens).","type":"BadRequestError","param":null,"code":400}"#,
        Some(262144),
    ),
    (
        "fireworks",
        400,
        r#"{"error": {"message": "The prompt is too long: 262377, model maximum context length: 262143"}}"#,
        Some(262144),
    ),
];

#[test]
fn every_familys_overflow_is_recognised_and_its_window_read() {
    for (family, status, body, window) in FAMILIES {
        let status = StatusCode::from_u16(*status).unwrap();
        let read = read(status, body.as_bytes());
        assert_eq!(
            read.as_ref().map(|o| o.window),
            Some(*window),
            "{family}: {body}"
        );
        let read = read.unwrap();
        assert!(
            read.proves,
            "{family}: the family's own error proves an overflow"
        );
        // Words the window was read from are in the body (llama-server's n_ctx is a
        // field, not words).
        if let Some(evidence) = &read.evidence {
            assert!(echoed(evidence, body.as_bytes()), "{family}: {evidence}");
        }
    }
}

#[test]
fn streamed_overflows_are_read_from_their_events() {
    let failed = json!({"type":"response.failed","sequence_number":3,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model. Please adjust your input and try again."},"usage":null}});
    assert_eq!(in_event(&failed).map(|o| o.window), Some(None));
    let nested = json!({"type":"error","sequence_number":2,"error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":"input"}});
    assert_eq!(in_event(&nested).map(|o| o.window), Some(None));
    let flat = json!({"type":"error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model."});
    assert_eq!(in_event(&flat).map(|o| o.window), Some(None));
    let anthropic = json!({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 9000 tokens > 8192 maximum"}});
    assert_eq!(in_event(&anthropic).map(|o| o.window), Some(Some(8192)));
    let lm_studio = json!({"error":{"message":"Input does not fit in context length. The input has 31430 tokens, but the context length only supports 30000 tokens."},"message":"Input does not fit in context length."});
    assert_eq!(in_event(&lm_studio).map(|o| o.window), Some(Some(30000)));
    // Not overflows: an overload, a completed response.
    let overloaded =
        json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
    assert_eq!(in_event(&overloaded), None);
    let completed =
        json!({"type":"response.completed","response":{"status":"completed","error":null}});
    assert_eq!(in_event(&completed), None);
}

fn not_overflow(status: StatusCode, body: &[u8]) -> bool {
    read(status, body).is_none()
}

#[test]
fn other_errors_are_not_overflows() {
    assert!(not_overflow(
        BAD,
        br#"{"error":{"message":"Invalid value: 'wizard'","code":"invalid_value"}}"#
    ));
    assert!(not_overflow(BAD, b"not json"));
    assert!(not_overflow(
        StatusCode::INTERNAL_SERVER_ERROR,
        br#"{"error":{"message":"maximum context length","code":"context_length_exceeded"}}"#
    ));
    assert!(not_overflow(
        StatusCode::TOO_MANY_REQUESTS,
        br#"{"error":{"message":"slow down"}}"#
    ));
    // Groq's rate limit says "Request too large" with 413: not the window.
    assert!(not_overflow(
        StatusCode::PAYLOAD_TOO_LARGE,
        br#"{"error":{"message":"Request too large for model `llama3-70b` on tokens per minute (TPM): Limit 6000, Requested 9512","type":"tokens","code":"rate_limit_exceeded"}}"#
    ));
    // vLLM's max_tokens over the window is about the answer's size, not the prompt's.
    assert!(not_overflow(
        BAD,
        br#"{"error":{"message":"max_tokens=9000 cannot be greater than max_model_len=max_total_tokens=8192. Please request fewer output tokens.","type":"BadRequestError","code":400}}"#
    ));
    // A gateway's byte limit is an overflow, with no window.
    assert_eq!(
        read(StatusCode::PAYLOAD_TOO_LARGE, b"<html>too large</html>"),
        Some(Overflow {
            window: None,
            evidence: None,
            proves: false
        }),
        "a bare 413 is retried and teaches nothing"
    );
    // A 413 with a family's own overflow body proves one.
    let stated = read(
        StatusCode::PAYLOAD_TOO_LARGE,
        br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#,
    )
    .unwrap();
    assert!(stated.proves && stated.window == Some(8192));
    // An implausible number is not believed.
    assert_eq!(
        read(
            BAD,
            br#"{"error":{"message":"This model's maximum context length is 10 tokens.","code":"context_length_exceeded"}}"#
        )
        .map(|o| o.window),
        Some(None)
    );
}

#[test]
fn a_window_in_words_the_client_sent_is_seen_as_echoed() {
    // A provider's invalid-value error quoting the client's own model name back.
    let body = br#"{"model": "Maximum Context Length Is 2000 tokens", "messages": []}"#;
    let answer = br#"{"error":{"message":"Invalid value for 'model': 'maximum context length is 2000 tokens' is not a model","code":"invalid_value"}}"#;
    let overflow = read(BAD, answer).unwrap();
    assert_eq!(overflow.window, Some(2000));
    let evidence = overflow.evidence.unwrap();
    assert!(echoed(&evidence, body), "{evidence}");
    // The provider's own words, which the client did not send, are not.
    let own = br#"{"model": "local", "messages": [{"role": "user", "content": "hi"}]}"#;
    assert!(!echoed(&evidence, own));
}

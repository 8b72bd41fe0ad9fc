//! Context overflows as each provider family answers them on its OpenAI-compatible chat
//! route (the bodies of their issues and sources), and the endpoints some of them
//! answer their window at (llama-server's `/props`, vLLM's `/v1/models`, Ollama's
//! `/api/show`), for testing a proxy that learns windows; and the overflows some report
//! inside a 200 stream (`x-fake-overflow-stream: 1`): Responses' `response.failed`,
//! an `error` event on Messages (as proxies in front of Anthropic re-emit it), LM
//! Studio 0.4's `event: error` and older llama-server's `error:` field on chat.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

/// Whose overflow answer the chat route gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// `code: "context_length_exceeded"`, "maximum context length is M tokens".
    #[default]
    OpenAi,
    /// `type: "exceed_context_size_error"` with `n_ctx`; answers `/props`.
    LlamaServer,
    /// Flat `{"object": "error", "message": …}` (v0.10.0 and older); answers
    /// `/v1/models` with `max_model_len`.
    VllmFlat,
    /// The renderer's "context length is only M tokens", wrapped in `error`.
    VllmRenderer,
    /// No number; answers `/api/show`.
    Ollama,
    /// The error as a string.
    LmStudio,
    /// "This endpoint's maximum context length is M tokens."
    OpenRouter,
    /// An array around Google's error.
    Gemini,
    /// Flat, "too large for model with M maximum context length".
    Mistral,
    /// `context_length_exceeded` and no number.
    Groq,
    /// "longer than the model's context length (M tokens)".
    Together,
    /// "model maximum context length: M−1".
    Fireworks,
}

impl Family {
    pub const ALL: [Family; 12] = [
        Family::OpenAi,
        Family::LlamaServer,
        Family::VllmFlat,
        Family::VllmRenderer,
        Family::Ollama,
        Family::LmStudio,
        Family::OpenRouter,
        Family::Gemini,
        Family::Mistral,
        Family::Groq,
        Family::Together,
        Family::Fireworks,
    ];

    /// The name `x-fake-overflow` and `--overflow` take.
    pub fn name(self) -> &'static str {
        match self {
            Family::OpenAi => "openai",
            Family::LlamaServer => "llama-server",
            Family::VllmFlat => "vllm",
            Family::VllmRenderer => "vllm-renderer",
            Family::Ollama => "ollama",
            Family::LmStudio => "lm-studio",
            Family::OpenRouter => "openrouter",
            Family::Gemini => "gemini",
            Family::Mistral => "mistral",
            Family::Groq => "groq",
            Family::Together => "together",
            Family::Fireworks => "fireworks",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The overflow answer to a prompt of `prompt` tokens for a window of `window`.
    pub fn answer(self, window: u64, prompt: u64) -> (StatusCode, Bytes) {
        let body = match self {
            Family::OpenAi => {
                json!({"error": {"message": format!("This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."), "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
            }
            Family::LlamaServer => {
                json!({"error": {"code": 400, "message": format!("request ({prompt} tokens) exceeds the available context size ({window} tokens), try increasing it"), "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": window}})
            }
            Family::VllmFlat => {
                json!({"object": "error", "message": format!("This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, 16 in the completion). Please reduce the length of the messages or completion.", prompt + 16), "type": "BadRequestError", "param": null, "code": 400})
            }
            Family::VllmRenderer => {
                json!({"error": {"message": format!("You passed {} input tokens and requested 256 output tokens. However, the model's context length is only {window} tokens, resulting in a maximum input length of {} tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={})", window - 255, window - 256, window - 255), "type": "BadRequestError", "param": "input_tokens", "code": 400}})
            }
            Family::Ollama => {
                json!({"error": {"message": "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust the context length in settings, or use a model with a longer context length", "type": "invalid_request_error", "param": null, "code": null}})
            }
            Family::LmStudio => {
                json!({"error": format!("The number of tokens to keep from the initial prompt is greater than the context length (n_keep: {prompt}>= n_ctx: {window}). Try to load the model with a larger context length, or provide a shorter input.")})
            }
            Family::OpenRouter => {
                json!({"error": {"message": format!("This endpoint's maximum context length is {window} tokens. However, you requested about {} tokens ({prompt} of text input, 512 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.", prompt + 512), "code": 400, "metadata": {"provider_name": "Fake"}}})
            }
            Family::Gemini => {
                json!([{"error": {"code": 400, "message": format!("The input token count ({prompt}) exceeds the maximum number of tokens allowed ({window})."), "status": "INVALID_ARGUMENT"}}])
            }
            Family::Mistral => {
                json!({"object": "error", "message": format!("Prompt contains {prompt} tokens and 0 draft tokens, too large for model with {window} maximum context length"), "type": "invalid_request_invalid_args", "param": null, "code": "3051", "raw_status_code": 400})
            }
            Family::Groq => {
                json!({"error": {"message": "Please reduce the length of the messages or completion.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
            }
            Family::Together => {
                json!({"error": {"message": format!("The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."), "type": "invalid_request_error"}})
            }
            Family::Fireworks => {
                json!({"error": {"message": format!("The prompt is too long: {prompt}, model maximum context length: {}", window - 1)}})
            }
        };
        (
            StatusCode::BAD_REQUEST,
            Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        )
    }

    /// The chat stream of an overflow reported after a 200: LM Studio 0.4's `event:
    /// error`, older llama-server's non-standard `error:` field, the others' body as an
    /// `event: error`.
    pub fn chat_stream(self, window: u64, prompt: u64) -> Vec<Bytes> {
        let event = match self {
            Family::LmStudio => {
                let message = format!(
                    "Input does not fit in context length. The input has {prompt} tokens, but the context length only supports {window} tokens."
                );
                let body = json!({"error": {"message": message}, "message": message});
                format!("event: error\ndata: {body}\n\n")
            }
            Family::LlamaServer => {
                let body = json!({"code": 400, "message": "the request exceeds the available context size. try increasing the context size or enable context shift", "type": "invalid_request_error"});
                format!("error: {body}\n\n")
            }
            _ => {
                let (_, body) = self.answer(window, prompt);
                format!("event: error\ndata: {}\n\n", String::from_utf8_lossy(&body))
            }
        };
        vec![Bytes::from(event)]
    }

    /// What the family's server answers at `path` about its window, if it answers there.
    pub fn window_endpoint(self, path: &str, model: &str, window: u64) -> Option<Value> {
        match (self, path) {
            (Family::LlamaServer, "/props") => Some(json!({
                "default_generation_settings": {"n_ctx": window, "temperature": 0.8},
                "total_slots": 1,
                "model_alias": model,
            })),
            (Family::VllmFlat | Family::VllmRenderer, "/v1/models") => Some(json!({
                "object": "list",
                "data": [{"id": model, "object": "model", "owned_by": "vllm", "max_model_len": window}],
            })),
            (Family::Ollama, "/api/show") => Some(json!({
                "parameters": format!("num_ctx                        {window}"),
                "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
            })),
            _ => None,
        }
    }
}

/// A Responses stream that fails on an overflow, as OpenAI sends it (and Codex reads
/// it): `response.created`, `response.in_progress`, then `response.failed` whose
/// `response.error.code` is `context_length_exceeded`.
pub fn responses_stream(id: &str, model: &str) -> Vec<Bytes> {
    let response = |status: &str, error: Value| json!({"id": id, "object": "response", "created_at": 1_759_510_079, "status": status, "model": model, "output": [], "error": error, "usage": null});
    let error = json!({"code": "context_length_exceeded", "message": "Your input exceeds the context window of this model. Please adjust your input and try again."});
    [
        ("response.created", response("in_progress", Value::Null)),
        ("response.in_progress", response("in_progress", Value::Null)),
        ("response.failed", response("failed", error)),
    ]
    .into_iter()
    .enumerate()
    .map(|(n, (kind, response))| {
        let data = json!({"type": kind, "sequence_number": n, "response": response});
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    })
    .collect()
}

/// A Messages stream that reports an overflow after a 200: `message_start`, `ping`,
/// then an `error` event with Anthropic's text.
pub fn messages_stream(id: &str, model: &str, window: u64, prompt: u64) -> Vec<Bytes> {
    let start = json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}});
    let error = json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("prompt is too long: {prompt} tokens > {window} maximum")}});
    vec![
        Bytes::from(format!("event: message_start\ndata: {start}\n\n")),
        Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n"),
        Bytes::from(format!("event: error\ndata: {error}\n\n")),
    ]
}

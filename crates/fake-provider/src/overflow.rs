//! Context overflows as each provider family answers them on its OpenAI-compatible chat
//! route (the bodies of their issues and sources), and the endpoints some of them
//! answer their window at (llama-server's `/props`, vLLM's `/v1/models`, Ollama's
//! `/api/show`), for testing a proxy that learns windows.

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

//! Asking the provider's server for a model's context window, where the server can say:
//! llama-server's `GET /props` (`default_generation_settings.n_ctx`: a slot's context,
//! what one request gets), vLLM's `GET <base>/models` (the model's `max_model_len`),
//! Ollama's `POST /api/show` (`num_ctx` among its `parameters`; the model's trained
//! length, which Ollama does not serve unless told, is not taken).
//!
//! Off the request path (the caller spawns it), for a model whose window abridge does not
//! know, once per (upstream, model) and process (see `Compactor::should_ask`). Bounded:
//! each ask has [`ASK_TIMEOUT`] for its whole answer and reads at most [`MAX_ANSWER`]
//! bytes; only the credential the provider reads goes along (the request's own, to the
//! same provider it was sent to: see `headers::Credentials::for_provider`), with a
//! `user-agent` of `abridge/<version> (context window ask)`. Each endpoint is asked where
//! the configured base serves it (under its prefix, see `Upstream::beside_api`). A
//! server that answers none of them teaches nothing, and nothing is retried. The hosted
//! APIs, whose models the built-in table knows and which state no window at these
//! paths, are not asked ([`is_hosted`]).

use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Method, Request, Uri, header};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;

use crate::headers::Provider;
use crate::upstream::Upstream;

/// The most an ask may take, answer read whole.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read.
pub const MAX_ANSWER: usize = 1024 * 1024;
/// Windows outside this range are not believed.
const BELIEVABLE: std::ops::RangeInclusive<u64> = 256..=100_000_000;
/// What an ask says it is.
const USER_AGENT: &str = concat!(
    "abridge/",
    env!("CARGO_PKG_VERSION"),
    " (context window ask)"
);
/// Hosts of hosted APIs (and their subdomains): never asked.
const HOSTED: &[&str] = &[
    "api.openai.com",
    "openai.azure.com",
    "api.anthropic.com",
    "openrouter.ai",
    "api.groq.com",
    "api.together.xyz",
    "api.together.ai",
    "api.fireworks.ai",
    "api.mistral.ai",
    "generativelanguage.googleapis.com",
    "api.deepseek.com",
    "api.x.ai",
];

/// Whether `host` is one of the hosted APIs.
pub fn is_hosted(host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    HOSTED.iter().any(|h| {
        host.strip_suffix(h)
            .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
    })
}

/// What the server behind `provider`'s upstream says `model`'s window is, asking each
/// endpoint of the module docs in turn with the request's `credentials`.
pub async fn ask(
    upstream: &Upstream,
    provider: Provider,
    model: &str,
    credentials: &HeaderMap,
) -> Option<u64> {
    let show = serde_json::json!({ "model": model }).to_string();
    let asks: [(Method, Result<Uri, _>, Option<String>, Read); 3] = [
        (
            Method::GET,
            upstream.beside_api(provider, "/props"),
            None,
            Read::Props,
        ),
        (
            Method::GET,
            upstream.on_base(provider, "/models"),
            None,
            Read::Models,
        ),
        (
            Method::POST,
            upstream.beside_api(provider, "/api/show"),
            Some(show),
            Read::Show,
        ),
    ];
    for (method, uri, body, read) in asks {
        let Ok(uri) = uri else { continue };
        let answer =
            tokio::time::timeout(ASK_TIMEOUT, get(upstream, (method, uri), body, credentials))
                .await;
        let Ok(Some(answer)) = answer else { continue };
        if let Some(window) = read
            .window(&answer, model)
            .filter(|w| BELIEVABLE.contains(w))
        {
            return Some(window);
        }
    }
    None
}

/// One ask: the answer's JSON, when it is a 200 with a JSON body within bounds.
async fn get(
    upstream: &Upstream,
    (method, uri): (Method, Uri),
    body: Option<String>,
    credentials: &HeaderMap,
) -> Option<Value> {
    let mut request = Request::new(body.map_or_else(Body::empty, Body::from));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = credentials.clone();
    let headers = request.headers_mut();
    headers.insert(
        header::ACCEPT,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    );
    if request.method() == Method::POST {
        request.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    let response = upstream.send(request).await.ok()?;
    if response.status() != http::StatusCode::OK {
        return None;
    }
    let bytes = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .ok()?
        .to_bytes();
    serde_json::from_slice(&bytes).ok()
}

/// Where each endpoint states the window.
#[derive(Debug, Clone, Copy)]
enum Read {
    Props,
    Models,
    Show,
}

impl Read {
    fn window(self, answer: &Value, model: &str) -> Option<u64> {
        match self {
            Read::Props => answer
                .pointer("/default_generation_settings/n_ctx")
                .or_else(|| answer.get("n_ctx"))
                .and_then(Value::as_u64),
            Read::Models => answer["data"]
                .as_array()?
                .iter()
                .find(|m| {
                    m["id"]
                        .as_str()
                        .is_some_and(|id| id.eq_ignore_ascii_case(model))
                })?
                .get("max_model_len")?
                .as_u64(),
            Read::Show => answer["parameters"].as_str()?.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some("num_ctx")).then(|| words.next()?.parse().ok())?
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hosted_apis_are_not_asked() {
        assert!(is_hosted("api.openai.com") && is_hosted("my-res.openai.azure.com"));
        assert!(is_hosted("API.Anthropic.com"));
        assert!(!is_hosted("127.0.0.1") && !is_hosted("gpu-box.internal"));
        assert!(!is_hosted("notapi.openai.com.evil"));
    }

    #[test]
    fn each_endpoint_is_read_where_it_states_the_served_window() {
        let props = json!({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1});
        assert_eq!(Read::Props.window(&props, "any"), Some(8192));
        assert_eq!(
            Read::Props.window(&json!({"n_ctx": 4096}), "any"),
            Some(4096)
        );
        let models = json!({"object": "list", "data": [
            {"id": "other", "max_model_len": 32768},
            {"id": "Qwen/Qwen3-8B", "max_model_len": 16384},
        ]});
        assert_eq!(Read::Models.window(&models, "qwen/qwen3-8b"), Some(16384));
        assert_eq!(Read::Models.window(&models, "missing"), None);
        // OpenAI's list has no window.
        let openai = json!({"object": "list", "data": [{"id": "gpt-4o", "owned_by": "system"}]});
        assert_eq!(Read::Models.window(&openai, "gpt-4o"), None);
        // Ollama: the served num_ctx, never the trained length.
        let show = json!({"parameters": "stop \"<|eot|>\"\nnum_ctx                        8192", "model_info": {"llama.context_length": 131072}});
        assert_eq!(Read::Show.window(&show, "llama3"), Some(8192));
        let unset = json!({"parameters": "stop \"<|eot|>\"", "model_info": {"llama.context_length": 131072}});
        assert_eq!(Read::Show.window(&unset, "llama3"), None);
    }
}

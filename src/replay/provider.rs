//! The provider `abridge replay` runs against: chat completions, Responses and Messages
//! on loopback (the format told by the path), answering every request with a one-line
//! reply in its format and the usage a real provider would report — the prompt counted
//! by [`count`], its prompt cache simulated as the provider's ([`Cache`]) — refusing with
//! a 400 what a real provider would refuse ([`rules`]), recording what it was sent, and
//! answering summary requests with an offline stand-in that says so (and what it spent).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::cache::Cache;
use super::rules;
use crate::conversation::Item;
use crate::formats::{Format, Request};
use crate::prices::Tokens;
use crate::strategies::text::identifiers;
use crate::strategies::{IN_CONTEXT_ASK, structured};
use crate::tokens::Estimator;

/// Output tokens of every answer but a summary's.
pub const REPLY_TOKENS: u64 = 5;

/// The largest body it takes: as a real provider does (Anthropic's Messages API takes
/// 32 MB), not axum's default of 2 MB, whose 413 abridge rightly reads as an overflow —
/// a real Codex rollout's requests carrying screenshots were "compacted for the window"
/// at 94,000 tokens of a 272,000-token window.
pub const BODY_BYTES: usize = 64 * 1024 * 1024;

/// What one forwarded (non-summary) request held.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Each message's exact bytes (without a `cache_control` breakpoint, which a client
    /// moves from turn to turn and the provider's cache ignores).
    pub messages: Vec<String>,
    /// What the model reads of them ([`crate::recall::readable`]), a message a line.
    pub text: String,
    /// Why a real provider would refuse the request ([`rules`]): it was answered 400.
    pub refused: Option<String>,
}

impl Seen {
    fn of(items: &[Item<'_>]) -> Self {
        let mut text = String::new();
        for item in items {
            text.push_str(&crate::recall::readable(item));
            text.push('\n');
        }
        Self {
            messages: items
                .iter()
                .map(|m| {
                    let raw = m.raw.get();
                    if !raw.contains("\"cache_control\"") {
                        return raw.to_owned();
                    }
                    serde_json::from_str::<Value>(raw).map_or_else(
                        |_| raw.to_owned(),
                        |v| super::cache::unmarked(&v).to_string(),
                    )
                })
                .collect(),
            text,
            refused: None,
        }
    }
}

/// What the simulated provider keeps: the last two forwarded requests, its cache, and
/// what the summaries it answered spent.
#[derive(Default)]
struct Shared {
    /// The session's calibration (see [`count`]).
    scale: f64,
    seen: Vec<Arc<Seen>>,
    cache: Cache,
    summaries: Tokens,
    summary_calls: u64,
}

/// The running simulated provider.
pub struct Simulated {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Simulated {
    /// Counting as `scale` says (see [`count`]).
    pub async fn start(scale: f64) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new(Shared {
            scale,
            ..Shared::default()
        }));
        let app = Router::new()
            .fallback(answer)
            .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, shared, task })
    }

    /// The last two forwarded requests (the one before the last, the last).
    pub fn last_two(&self) -> (Option<Arc<Seen>>, Option<Arc<Seen>>) {
        let shared = lock(&self.shared);
        let n = shared.seen.len();
        let at = |i: Option<usize>| i.and_then(|i| shared.seen.get(i)).cloned();
        (at(n.checked_sub(2)), at(n.checked_sub(1)))
    }

    /// The summary calls answered, and their tokens in all.
    pub fn summaries(&self) -> (u64, Tokens) {
        let shared = lock(&self.shared);
        (shared.summary_calls, shared.summaries)
    }
}

impl Drop for Simulated {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tokens of a prompt's item (or head) as the simulation counts them: 4, and the
/// model's tokens of every text in it (its strings, but for the ids, types, roles and
/// signatures that name it rather than say anything), an image part as the estimate
/// counts one ([`crate::tokens::image`]). A reasoning item is billed for
/// the reasoning it carries, not the length of its `encrypted_content` (see
/// [`crate::tokens::reasoning`]: abridge's estimate counts it so too), and only within
/// the turn that made it (the provider drops earlier turns' reasoning: see `cache`).
///
/// `scale` is the session's calibration (see `super::calibrate`): how many tokens the
/// provider billed for what the estimator counts one.
pub fn count(estimator: &Estimator, scale: f64) -> impl Fn(&Value) -> u64 + '_ {
    move |item| {
        let reasoning = match (item["type"].as_str(), item["encrypted_content"].as_str()) {
            (Some("reasoning"), Some(cipher)) => crate::tokens::reasoning(cipher.len()),
            _ => 0,
        };
        ((4 + strings(estimator, item)) as f64 * scale).round() as u64 + reasoning
    }
}

fn strings(estimator: &Estimator, value: &Value) -> u64 {
    const NAMES: [&str; 9] = [
        "encrypted_content",
        "type",
        "id",
        "role",
        "call_id",
        "tool_call_id",
        "tool_use_id",
        "signature",
        "status",
    ];
    match value {
        Value::String(s) => estimator.text(s),
        Value::Array(items) => items.iter().map(|v| strings(estimator, v)).sum(),
        // An image is billed as an image, not its base64 data as text.
        Value::Object(map) => image_of(value).unwrap_or_else(|| {
            map.iter()
                .filter(|(k, _)| !NAMES.contains(&k.as_str()) && *k != "cache_control")
                .map(|(_, v)| strings(estimator, v))
                .sum()
        }),
        _ => 0,
    }
}

/// The tokens of an image part (see [`crate::tokens::image`]); `None`: not one.
fn image_of(part: &Value) -> Option<u64> {
    let low = || part["detail"] == "low" || part["image_url"]["detail"] == "low";
    crate::tokens::image(part["type"].as_str()?, low)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a request is abridge's summariser asking for a summary: its system prompt
/// (chat's first message, or Messages' `system`).
fn is_summary(request: &Value) -> bool {
    let first = &request["messages"][0];
    (first["role"] == "system" && first["content"] == structured::SYSTEM)
        || request["system"] == structured::SYSTEM
        || request["instructions"] == structured::SYSTEM
}

/// The text of the last of a request's items (its content's text parts joined).
fn last_text(items: &Value) -> String {
    let Some(last) = items.as_array().and_then(|i| i.last()) else {
        return String::new();
    };
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The longest identifier the stand-in writes: a path or a name, not a blob (a Codex
/// rollout's items carry kilobytes of base64 a model would never copy into a summary).
const ID_CHARS: usize = 200;

/// The stand-in summary for `request`: the template's sections, and the identifiers the
/// prompt names, cut where a model would stop (the request's cap on its answer).
fn stand_in_for(request: &Value, prompt: &str, estimator: &Estimator) -> String {
    let mut summary = stand_in(prompt);
    let cap = ["max_output_tokens", "max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| request[*k].as_u64());
    if let Some(cap) = cap {
        while estimator.text(&summary) > cap {
            let keep = summary.len() * 9 / 10;
            let at = (0..=keep)
                .rev()
                .find(|&i| summary.is_char_boundary(i))
                .unwrap_or(0);
            summary.truncate(at);
        }
    }
    summary
}

/// The stand-in summary: the template's sections, and the identifiers the prompt names.
fn stand_in(prompt: &str) -> String {
    let mut ids = identifiers(prompt);
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| id.chars().count() <= ID_CHARS && seen.insert(id.clone()));
    ids.truncate(120);
    format!(
        "## Goal\n(offline stand-in for a summary model: no model was called; it lists what \
         the transcript names)\n## Constraints & Preferences\n(none recorded)\n## Progress\n\
         (none recorded)\n## Key Decisions\n(none recorded)\n## Relevant Files\n(none recorded)\n\
         ## Next Steps\n(none recorded)\n## Critical Context\n{}",
        ids.join(", ")
    )
}

/// The format a request's path names.
fn format_of(uri: &Uri) -> Format {
    let path = uri.path();
    if path.ends_with("/responses") {
        Format::Responses
    } else if path.ends_with("/messages") {
        Format::Messages
    } else {
        Format::Chat
    }
}

async fn answer(State(shared): State<Arc<Mutex<Shared>>>, uri: Uri, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let format = format_of(&uri);
    let model = request["model"].as_str().unwrap_or("replay").to_owned();
    let estimator = Estimator::for_model(&model);
    let scale = lock(&shared).scale;
    let count = count(&estimator, scale);
    let items = &request[super::input::list_key(format)];
    let after_it = last_text(items).starts_with(IN_CONTEXT_ASK);
    if after_it || is_summary(&request) {
        let mut shared = lock(&shared);
        let (summary, spent) = if after_it {
            // Asked after the conversation itself: billed as its cache holds it, and
            // summarised from all it holds.
            let spent = shared.cache.serve(format, &request, &count);
            (
                stand_in_for(&request, &items.to_string(), &estimator),
                spent,
            )
        } else {
            let prompt = request["messages"].as_array().and_then(|m| m.last());
            let prompt = prompt
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            let input = count(&request["messages"]) + count(&request["system"]);
            let spent = Tokens {
                input,
                ..Tokens::default()
            };
            (stand_in_for(&request, prompt, &estimator), spent)
        };
        let spent = Tokens {
            output: estimator.text(&summary),
            ..spent
        };
        shared.summary_calls += 1;
        shared.summaries.input += spent.input;
        shared.summaries.cached += spent.cached;
        shared.summaries.cache_write += spent.cache_write;
        shared.summaries.output += spent.output;
        return axum::Json(reply(format, &model, &summary, spent)).into_response();
    }
    let mut forwarded = match Request::parse(format, body) {
        Ok(parsed) => Seen::of(parsed.items()),
        Err(_) => Seen::of(&[]),
    };
    let history = request[super::input::list_key(format)].as_array();
    forwarded.refused = history.and_then(|items| rules::violation(format, items));
    let refused = forwarded.refused.clone();
    let usage = {
        let mut shared = lock(&shared);
        // The last two are all replay compares.
        if shared.seen.len() == 2 {
            shared.seen.remove(0);
        }
        shared.seen.push(Arc::new(forwarded));
        // A refused request leaves nothing in the cache.
        refused
            .is_none()
            .then(|| shared.cache.serve(format, &request, &count))
    };
    match (refused, usage) {
        (None, Some(usage)) => {
            let usage = Tokens {
                output: REPLY_TOKENS,
                ..usage
            };
            axum::Json(reply(format, &model, "Noted; carrying on.", usage)).into_response()
        }
        (why, _) => {
            let why = why.unwrap_or_default();
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": format!("abridge replay: a real provider would refuse this: {why}")}});
            (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
        }
    }
}

/// A whole answer of `format` saying `content`, with its usage in the format's naming.
fn reply(format: Format, model: &str, content: &str, usage: Tokens) -> Value {
    let Tokens {
        input,
        cached,
        cache_write,
        output,
    } = usage;
    match format {
        Format::Chat => json!({
            "id": "replay",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": input, "completion_tokens": output,
                      "total_tokens": input + output,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        }),
        Format::Responses => json!({
            "id": "resp_replay",
            "object": "response",
            "status": "completed",
            "model": model,
            "output": [{"type": "message", "id": "msg_replay", "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": content, "annotations": []}]}],
            "usage": {"input_tokens": input, "output_tokens": output,
                      "input_tokens_details": {"cached_tokens": cached},
                      "total_tokens": input + output},
        }),
        Format::Messages => json!({
            "id": "msg_replay",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": content}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": input - cached - cache_write,
                      "cache_read_input_tokens": cached,
                      "cache_creation_input_tokens": cache_write,
                      "output_tokens": output},
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_billed_as_an_image_not_as_its_base64() {
        // A real Codex rollout's screenshot (197 KB of base64, keys as serde_json sorts
        // them) was billed as ~100,000 tokens of text: replay counted 108 % over the bill.
        let data = "iVBORw0KGgoAAAANSUhEUgAABU8AAALoCAIAAA".repeat(5_000);
        let estimator = Estimator::approx();
        let count = count(&estimator, 1.0);
        let item = serde_json::json!({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": format!("data:image/png;base64,{data}")},
        ]});
        let tokens = count(&item);
        assert!((765..1_000).contains(&tokens), "{tokens}");
        let anthropic = serde_json::json!({"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        ]});
        assert!((1_600..2_000).contains(&count(&anthropic)));
    }

    #[test]
    fn the_stand_in_summary_copies_no_blob_and_stops_at_the_cap() {
        // A real Codex rollout summarised after the conversation (its items as JSON, so
        // a screenshot's URL runs on through kilobytes of base64): the stand-in wrote it
        // out, billing 140,000 output tokens for a summary a model caps at a few thousand.
        let blob = format!(
            "https://shots.example/s.png?d={}",
            "iVBORw0KGgo".repeat(2_000)
        );
        let prompt = format!("edit src/lib.rs then {blob} and /srv/app/main.rs");
        let estimator = Estimator::approx();
        let uncapped = stand_in_for(&json!({}), &prompt, &estimator);
        assert!(uncapped.contains("src/lib.rs"), "{uncapped}");
        assert!(!uncapped.contains("iVBORw0KGgoiVBORw0KGgo"), "no blob");
        let paths: String = (0..400)
            .map(|i| format!(" /srv/app/module_{i}/main.rs"))
            .collect();
        let capped = stand_in_for(&json!({"max_output_tokens": 120}), &paths, &estimator);
        assert!(estimator.text(&capped) <= 120, "{capped}");
        assert!(estimator.text(&stand_in(&paths)) > 120, "the cap cut it");
    }

    #[test]
    fn a_summary_request_is_told_by_the_summarisers_own_prompt() {
        let summary = json!({"messages": [{"role": "system", "content": structured::SYSTEM},
                                          {"role": "user", "content": "transcript"}]});
        assert!(is_summary(&summary));
        let messages = json!({"system": structured::SYSTEM,
                              "messages": [{"role": "user", "content": "transcript"}]});
        assert!(is_summary(&messages));
        let chat = json!({"messages": [
            {"role": "system", "content": "You write handoff summaries, say it."},
            {"role": "user", "content": "hi"}]});
        assert!(!is_summary(&chat));
    }

    /// A request of a few megabytes (an agent's screenshots) is answered, as a real
    /// provider answers it.
    #[tokio::test]
    async fn a_request_of_megabytes_is_answered() {
        let provider = Simulated::start(1.0).await.unwrap();
        let url = format!("{}/responses", provider.url);
        let data = "iVBORw0KGgoAAAANSUhEUgAABU8AAALoCAIAAA".repeat(100_000);
        let body = json!({"model": "gpt-5.1-codex", "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": format!("data:image/png;base64,{data}")},
            ]},
        ]})
        .to_string();
        assert!(body.len() > 3_000_000);
        let answer = reqwest::Client::new()
            .post(&url)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }

    /// A summary asked after the conversation itself (the cache-riding summary) is
    /// answered as a summary, counted as one, and billed as the cache holds its prefix.
    #[tokio::test]
    async fn a_summary_asked_after_the_conversation_is_a_summary_read_from_the_cache() {
        let provider = Simulated::start(1.0).await.unwrap();
        let url = format!("{}/chat/completions", provider.url);
        let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
        for n in 0..20 {
            messages.push(json!({"role": "user", "content": format!("Edit src/file_{n}.rs {}", "and more. ".repeat(80))}));
            messages
                .push(json!({"role": "assistant", "content": format!("Edited src/file_{n}.rs.")}));
        }
        let client = reqwest::Client::new();
        let post = |body: Value| client.post(&url).body(body.to_string()).send();
        assert!(
            post(json!({"model": "m", "messages": messages}))
                .await
                .unwrap()
                .status()
                .is_success()
        );
        assert_eq!(provider.summaries().0, 0);
        messages.push(json!({"role": "user", "content": format!("{IN_CONTEXT_ASK} Summarise the conversation above.")}));
        let answer: Value = post(json!({"model": "m", "messages": messages}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            text.contains("## Goal") && text.contains("src/file_19.rs"),
            "{text}"
        );
        let (calls, spent) = provider.summaries();
        assert_eq!(calls, 1);
        assert!(spent.cached * 10 >= spent.input * 9, "{spent:?}");
    }
}

//! The provider `abridge replay` runs against: chat completions, Responses and Messages
//! on loopback (the format told by the path), answering every request with a one-line
//! reply in its format and the usage a real provider would report (the forwarded
//! messages counted by abridge's own estimator), recording what it was sent, and
//! answering summary requests with an offline stand-in that says so.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::conversation::Item;
use crate::formats::{Format, Request};
use crate::strategies::structured;
use crate::strategies::text::identifiers;
use crate::tokens::Estimator;

/// What one forwarded (non-summary) request held.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Each message's exact bytes.
    pub messages: Vec<String>,
    /// What the model reads of them ([`crate::recall::readable`]), a message a line.
    pub text: String,
}

impl Seen {
    fn of(items: &[Item<'_>]) -> Self {
        let mut text = String::new();
        for item in items {
            text.push_str(&crate::recall::readable(item));
            text.push('\n');
        }
        Self {
            messages: items.iter().map(|m| m.raw.get().to_owned()).collect(),
            text,
        }
    }
}

/// The running simulated provider.
pub struct Simulated {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Simulated {
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let app = Router::new().fallback(answer).with_state(seen.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, seen, task })
    }

    /// The last two forwarded requests (the one before the last, the last).
    pub fn last_two(&self) -> (Option<Seen>, Option<Seen>) {
        let seen = lock(&self.seen);
        let n = seen.len();
        let at = |i: Option<usize>| i.and_then(|i| seen.get(i)).cloned();
        (at(n.checked_sub(2)), at(n.checked_sub(1)))
    }
}

impl Drop for Simulated {
    fn drop(&mut self) {
        self.task.abort();
    }
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
}

/// The stand-in summary: the template's sections, and the identifiers the prompt names.
fn stand_in(prompt: &str) -> String {
    let mut ids = identifiers(prompt);
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(id.clone()));
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

async fn answer(State(seen): State<Arc<Mutex<Vec<Seen>>>>, uri: Uri, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let format = format_of(&uri);
    let model = request["model"].as_str().unwrap_or("replay").to_owned();
    let (content, prompt_tokens) = if is_summary(&request) {
        let last = &request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned();
        let prompt = last.as_ref().and_then(|m| m["content"].as_str());
        (stand_in(prompt.unwrap_or_default()), 0)
    } else {
        let (tokens, forwarded) = match Request::parse(format, body) {
            Ok(parsed) => (
                Estimator::for_model(&model).messages(parsed.items()),
                Seen::of(parsed.items()),
            ),
            Err(_) => (0, Seen::of(&[])),
        };
        // The last two are all replay compares.
        let mut seen = lock(&seen);
        if seen.len() == 2 {
            seen.remove(0);
        }
        seen.push(forwarded);
        ("Noted; carrying on.".to_owned(), tokens)
    };
    axum::Json(reply(format, &model, &content, prompt_tokens)).into_response()
}

/// A whole answer of `format` saying `content`, with its usage.
fn reply(format: Format, model: &str, content: &str, prompt_tokens: u64) -> Value {
    match format {
        Format::Chat => json!({
            "id": "replay",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5,
                      "total_tokens": prompt_tokens + 5},
        }),
        Format::Responses => json!({
            "id": "resp_replay",
            "object": "response",
            "status": "completed",
            "model": model,
            "output": [{"type": "message", "id": "msg_replay", "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": content, "annotations": []}]}],
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 5,
                      "total_tokens": prompt_tokens + 5},
        }),
        Format::Messages => json!({
            "id": "msg_replay",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": content}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 5},
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

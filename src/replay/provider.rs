//! The provider `abridge replay` runs against: an OpenAI-compatible chat-completions
//! endpoint on loopback that answers every request with a one-line reply and the usage a
//! real provider would report (the forwarded messages counted by abridge's own
//! estimator), records what it was sent, and answers summary requests with an offline
//! stand-in that says so.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::formats::chat;
use crate::strategies::structured;
use crate::strategies::text::identifiers;
use crate::tokens::Estimator;

/// What one forwarded (non-summary) request held.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Each message's exact bytes.
    pub messages: Vec<String>,
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

    /// The forwarded requests so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.seen).clone()
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

/// Whether a request is abridge's summariser asking for a summary: its system prompt.
fn is_summary(messages: &[Value]) -> bool {
    messages
        .first()
        .is_some_and(|m| m["role"] == "system" && m["content"] == structured::SYSTEM)
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

async fn answer(State(seen): State<Arc<Mutex<Vec<Seen>>>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let model = request["model"].as_str().unwrap_or("replay").to_owned();
    let empty = Vec::new();
    let messages = request["messages"].as_array().unwrap_or(&empty);
    let (content, prompt_tokens) = if is_summary(messages) {
        let prompt = messages.last().and_then(|m| m["content"].as_str());
        (stand_in(prompt.unwrap_or_default()), 0)
    } else {
        let (tokens, raw) = match chat::parse(&body) {
            Ok(parsed) => (
                Estimator::for_model(&model).messages(&parsed.messages),
                parsed
                    .messages
                    .iter()
                    .map(|m| m.raw.get().to_owned())
                    .collect(),
            ),
            Err(_) => (0, Vec::new()),
        };
        lock(&seen).push(Seen { messages: raw });
        ("Noted; carrying on.".to_owned(), tokens)
    };
    let reply = json!({
        "id": "replay",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5,
                  "total_tokens": prompt_tokens + 5},
    });
    axum::Json(reply).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_request_is_told_by_the_summarisers_own_prompt() {
        let summary = json!([{"role": "system", "content": structured::SYSTEM},
                             {"role": "user", "content": "transcript"}]);
        assert!(is_summary(summary.as_array().unwrap()));
        let chat = json!([{"role": "system", "content": "You write handoff summaries, say it."},
                          {"role": "user", "content": "hi"}]);
        assert!(!is_summary(chat.as_array().unwrap()));
    }
}

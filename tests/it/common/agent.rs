//! A client as real agents are: it keeps the whole history and resends it every turn.
//! Shared by the compaction and admin tests.

use fake_provider::{FakeProvider, Recorded, is_summary_request};
use serde_json::{Value, json};

use std::time::Duration;

use super::{Proxy, client, eventually};

pub const MODEL: &str = "fake-model";

pub fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
}

/// An agent as real clients are: it keeps the whole history and resends it every turn;
/// each turn the model calls a tool, gets its (bulky) result, then answers.
pub struct Agent {
    pub url: String,
    pub tenant: String,
    pub messages: Vec<Value>,
    pub headers: Vec<(String, String)>,
    /// Every body sent, in order.
    pub sent: std::sync::Mutex<Vec<String>>,
}

/// One request's answer.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    pub fn compacted(&self) -> bool {
        self.header("x-abridge-compacted").as_deref() == Some("true")
    }
}

impl Agent {
    pub fn new(proxy: &Proxy, tenant: &str) -> Self {
        Self {
            url: proxy.url("/v1/chat/completions"),
            tenant: tenant.to_owned(),
            messages: vec![
                json!({"role": "system", "content": "You are a careful coding agent. Work in /srv/app."}),
            ],
            headers: Vec::new(),
            sent: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn body(&self) -> String {
        json!({"model": MODEL, "messages": self.messages, "tools": tools()}).to_string()
    }

    pub async fn send(&self) -> Answer {
        let body = self.body();
        self.sent.lock().unwrap().push(body.clone());
        let mut request = client()
            .post(&self.url)
            .header("authorization", format!("Bearer {}", self.tenant))
            .header("content-type", "application/json")
            .body(body);
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.json().await.unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
        }
    }

    /// One agentic turn: two requests (tool call, then the answer after the result).
    pub async fn turn(&mut self, n: usize) -> Vec<Answer> {
        self.turn_observed(n, None)
            .await
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    }

    /// A turn, and for each request the summary requests made on its critical path (before
    /// it was forwarded); with `watch`, background work finishes before each request.
    pub async fn turn_observed(
        &mut self,
        n: usize,
        watch: Option<(&FakeProvider, &Proxy)>,
    ) -> Vec<(Answer, usize)> {
        let observed = async |agent: &Agent| {
            let Some((provider, proxy)) = watch else {
                return (agent.send().await, 0);
            };
            idle(proxy).await;
            let before = provider.requests().len();
            let answer = agent.send().await;
            // Summaries before the request itself reached the provider were on its
            // critical path; later ones are the background work its response started.
            let log = provider.requests();
            let is_summary = |r: &Recorded| {
                r.json()["messages"]
                    .as_array()
                    .is_some_and(|m| is_summary_request(m))
            };
            let critical = log[before..].iter().take_while(|r| is_summary(r)).count();
            (answer, critical)
        };
        self.messages.push(json!({"role": "user", "content": format!(
            "Step {n}: open src/module_{n}.rs and fix the failing check number {n}; keep the API stable. {}",
            "Context: the build must stay green and the change must be small. ".repeat(2)
        )}));
        let (first, first_summaries) = observed(self).await;
        assert_eq!(first.status, 200, "turn {n}: {}", first.body);
        let call = first.body["choices"][0]["message"].clone();
        let id = call["tool_calls"][0]["id"].as_str().unwrap().to_owned();
        self.messages.push(call);
        self.messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!(
            "fn check_{n}() -> u32 {{ {} }} // src/module_{n}.rs line {n}0", "let value = compute(input) + offset; ".repeat(30)
        )}));
        let (second, second_summaries) = observed(self).await;
        assert_eq!(second.status, 200, "turn {n}: {}", second.body);
        self.messages
            .push(second.body["choices"][0]["message"].clone());
        vec![(first, first_summaries), (second, second_summaries)]
    }
}

/// The chat requests the provider received (summary requests left out).
pub fn main_requests(provider: &FakeProvider) -> Vec<Recorded> {
    provider
        .requests()
        .into_iter()
        .filter(|r| r.uri.path().ends_with("/chat/completions"))
        .filter(|r| {
            !r.json()["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .collect()
}

pub fn summary_requests(provider: &FakeProvider) -> usize {
    provider
        .requests()
        .iter()
        .filter(|r| {
            r.json()["messages"]
                .as_array()
                .is_some_and(|m| is_summary_request(m))
        })
        .count()
}

pub fn messages_of(r: &Recorded) -> Vec<Value> {
    r.json()["messages"].as_array().unwrap().clone()
}

/// The raw text of each forwarded message, as spliced into the body.
pub fn raw_messages(r: &Recorded) -> Vec<String> {
    let parsed = abridge::formats::chat::parse(&r.body).unwrap();
    parsed
        .messages
        .iter()
        .map(|m| m.raw.get().to_owned())
        .collect()
}

/// Waits until abridge's background compactions are done.
pub async fn idle(proxy: &Proxy) {
    assert!(
        eventually(Duration::from_secs(10), || proxy
            .state
            .compactor()
            .pending_jobs()
            == 0)
        .await
    );
}

//! An Anthropic Messages client as Claude Code is: `POST /v1/messages?beta=true`, a
//! system array with cache breakpoints, its environment block as a `system` message
//! after the first ask, `x-api-key`, signed thinking blocks replayed verbatim, every
//! `tool_use` answered by a `tool_result` in the next message, and its last cache
//! breakpoint moved to the newest message every turn.

use serde_json::{Value, json};

use super::agent::Answer;
use super::{Proxy, client};

pub const MODEL: &str = "claude-sonnet-4-5";

pub struct ClaudeAgent {
    pub url: String,
    pub key: String,
    pub system: Value,
    pub messages: Vec<Value>,
    /// Stream the answer after each tool result (the tool call itself is not streamed).
    pub stream: bool,
    pub headers: Vec<(String, String)>,
    pub extra: serde_json::Map<String, Value>,
    /// Every body sent, in order.
    pub sent: std::sync::Mutex<Vec<String>>,
}

impl ClaudeAgent {
    pub fn new(proxy: &Proxy, key: &str) -> Self {
        Self {
            url: proxy.url("/v1/messages?beta=true"),
            key: key.to_owned(),
            system: json!([
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
                {"type": "text", "text": "You are Claude Code, a careful coding agent.",
                    "cache_control": {"type": "ephemeral"}},
            ]),
            messages: vec![
                json!({"role": "user", "content": [{"type": "text", "text": "Let us fix the build of /srv/app."}]}),
                json!({"role": "system", "content": format!("<env>cwd: /srv/app; platform: linux; {}</env>", "git status: clean. ".repeat(10))}),
                json!({"role": "assistant", "content": [{"type": "text", "text": "Ready."}]}),
            ],
            stream: false,
            // Strict alternation, as many Anthropic-compatible servers require; thinking.
            headers: vec![
                ("x-fake-strict-alternation".into(), "1".into()),
                ("x-fake-thinking".into(), "1".into()),
            ],
            extra: serde_json::Map::new(),
            sent: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn body(&self, stream: bool) -> String {
        let mut body = json!({"model": MODEL, "max_tokens": 4096, "system": self.system,
            "messages": self.messages, "stream": stream,
            "tools": [{"name": "Read", "description": "Read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
            "metadata": {"user_id": "{\"session_id\":\"5f0c\"}"}});
        for (k, v) in &self.extra {
            body[k] = v.clone();
        }
        body.to_string()
    }

    pub async fn send(&self, stream: bool) -> Answer {
        self.send_body(self.body(stream), stream).await
    }

    pub async fn send_body(&self, body: String, stream: bool) -> Answer {
        self.sent.lock().unwrap().push(body.clone());
        let mut request = client()
            .post(&self.url)
            .header("x-api-key", &self.key)
            .header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14",
            )
            .header("content-type", "application/json")
            .body(body);
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = if stream && status == 200 {
            from_stream(&text)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Moves the client's last cache breakpoint to the newest message's last block.
    fn mark_newest(&mut self) {
        for m in &mut self.messages {
            if let Some(blocks) = m["content"].as_array_mut() {
                for b in blocks {
                    if let Some(o) = b.as_object_mut() {
                        o.remove("cache_control");
                    }
                }
            }
        }
        if let Some(last) = self
            .messages
            .last_mut()
            .and_then(|m| m["content"].as_array_mut())
            .and_then(|b| b.last_mut())
        {
            last["cache_control"] = json!({"type": "ephemeral"});
        }
    }

    /// One agentic turn: the ask; the model's thinking and tool call; the (bulky) tool
    /// result; the model's answer. Both requests must succeed.
    pub async fn turn(&mut self, n: usize) -> Vec<Answer> {
        self.messages.push(json!({"role": "user", "content": [{"type": "text", "text": format!(
            "Step {n}: open src/module_{n}.rs and fix the failing check number {n}; keep the API stable. {}",
            "Context: the build must stay green and the change must be small. ".repeat(2))}]}));
        self.mark_newest();
        let first = self.send(false).await;
        assert_eq!(first.status, 200, "turn {n}: {}", first.body);
        let content = first.body["content"].clone();
        let id = content
            .as_array()
            .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
            .unwrap_or_else(|| panic!("turn {n}: no tool_use in {content}"))["id"]
            .clone();
        self.messages
            .push(json!({"role": "assistant", "content": content}));
        self.messages.push(json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": id, "content": format!("fn check_{n}() -> u32 {{ {} }} // src/module_{n}.rs line {n}0",
                "let value = compute(input) + offset; ".repeat(30))}]}));
        self.mark_newest();
        let second = self.send(self.stream).await;
        assert_eq!(second.status, 200, "turn {n}: {}", second.body);
        self.messages
            .push(json!({"role": "assistant", "content": second.body["content"].clone()}));
        vec![first, second]
    }
}

/// A Messages stream folded back into the message it streamed (text and thinking
/// blocks, usage as the last `message_delta` has it).
pub fn from_stream(sse: &str) -> Value {
    let mut message = Value::Null;
    for event in sse.split("\n\n") {
        let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        match v["type"].as_str() {
            Some("message_start") => message = v["message"].clone(),
            Some("content_block_start") => {
                let blocks = message["content"].as_array_mut().unwrap();
                blocks.push(v["content_block"].clone());
            }
            Some("content_block_delta") => {
                let i = v["index"].as_u64().unwrap() as usize;
                let block = &mut message["content"][i];
                let delta = &v["delta"];
                for (kind, field) in [
                    ("text_delta", "text"),
                    ("thinking_delta", "thinking"),
                    ("signature_delta", "signature"),
                ] {
                    if delta["type"] == kind {
                        let had = block[field].as_str().unwrap_or("").to_owned();
                        block[field] = json!(had + delta[field].as_str().unwrap_or(""));
                    }
                }
            }
            Some("message_delta") => {
                message["stop_reason"] = v["delta"]["stop_reason"].clone();
                message["usage"] = v["usage"].clone();
            }
            _ => {}
        }
    }
    message
}

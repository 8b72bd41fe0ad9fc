//! A stateless Responses client as Codex CLI is: `store: false`, the whole `input` resent
//! every turn, its system prompt as leading `developer` items, encrypted reasoning
//! replayed before each call, tool calls paired with their outputs by `call_id`.

use serde_json::{Value, json};

use super::agent::{Answer, MODEL};
use super::{Proxy, client};

pub fn tools() -> Value {
    json!([{"type": "function", "name": "exec_command", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
}

pub struct ResponsesAgent {
    pub url: String,
    pub tenant: String,
    pub instructions: Option<String>,
    pub input: Vec<Value>,
    pub stream: bool,
    pub headers: Vec<(String, String)>,
    /// Extra top-level fields (e.g. `prompt_cache_key`).
    pub extra: serde_json::Map<String, Value>,
    reasoning: u32,
    /// Every body sent, in order.
    pub sent: std::sync::Mutex<Vec<String>>,
}

impl ResponsesAgent {
    pub fn new(proxy: &Proxy, tenant: &str) -> Self {
        Self {
            url: proxy.url("/v1/responses"),
            tenant: tenant.to_owned(),
            instructions: Some("You are a careful coding agent. Work in /srv/app.".to_owned()),
            input: vec![
                json!({"type": "message", "role": "developer", "content": [{"type": "input_text",
                    "text": "<permissions>sandbox: workspace-write; approvals: never</permissions>"}]}),
            ],
            stream: false,
            headers: Vec::new(),
            extra: serde_json::Map::new(),
            reasoning: 0,
            sent: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn body(&self) -> String {
        let mut body = json!({"model": MODEL, "input": self.input, "tools": tools(),
            "tool_choice": "auto", "parallel_tool_calls": false, "store": false,
            "stream": self.stream, "include": ["reasoning.encrypted_content"],
            "text": {"verbosity": "low"}});
        if let Some(i) = &self.instructions {
            body["instructions"] = json!(i);
        }
        for (k, v) in &self.extra {
            body[k] = v.clone();
        }
        body.to_string()
    }

    /// Sends the current input; the answer's body is the Response object (for a stream,
    /// the one in its terminal event).
    pub async fn send(&self) -> Answer {
        self.send_body(self.body()).await
    }

    pub async fn send_body(&self, body: String) -> Answer {
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
        let text = response.text().await.unwrap();
        let body = if self.stream && status == 200 {
            terminal_response(&text)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// One agentic turn: the ask, the model's reasoning and call, the (bulky) output, the
    /// model's answer. Both requests must succeed.
    pub async fn turn(&mut self, n: usize) -> Vec<Answer> {
        self.input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text",
            "text": format!("Step {n}: open src/module_{n}.rs and fix the failing check number {n}; keep the API stable. {}",
                "Context: the build must stay green and the change must be small. ".repeat(2))}]}));
        let first = self.send().await;
        assert_eq!(first.status, 200, "turn {n}: {}", first.body);
        let output = first.body["output"].as_array().unwrap().clone();
        let call = output
            .iter()
            .find(|i| i["type"] == "function_call")
            .unwrap_or_else(|| panic!("turn {n}: no function call in {output:?}"))
            .clone();
        self.reasoning += 1;
        // What a reasoning model returns and Codex replays: opaque, before the call.
        self.input.push(
            json!({"type": "reasoning", "id": format!("rs_{}", self.reasoning),
            "summary": [], "content": null,
            "encrypted_content": format!("gAAAA{}", "x9".repeat(40))}),
        );
        self.input.push(call.clone());
        self.input.push(
            json!({"type": "function_call_output", "call_id": call["call_id"],
            "output": format!("fn check_{n}() -> u32 {{ {} }} // src/module_{n}.rs line {n}0",
                "let value = compute(input) + offset; ".repeat(30))}),
        );
        let second = self.send().await;
        assert_eq!(second.status, 200, "turn {n}: {}", second.body);
        for item in second.body["output"].as_array().unwrap() {
            self.input.push(item.clone());
        }
        vec![first, second]
    }
}

/// The `response` of a Responses stream's terminal event.
pub fn terminal_response(sse: &str) -> Value {
    sse.split("\n\n")
        .filter_map(|event| {
            let data = event.lines().find_map(|l| l.strip_prefix("data: "))?;
            let v: Value = serde_json::from_str(data).ok()?;
            matches!(
                v["type"].as_str(),
                Some("response.completed" | "response.incomplete" | "response.failed")
            )
            .then(|| v["response"].clone())
        })
        .last()
        .unwrap_or(Value::Null)
}

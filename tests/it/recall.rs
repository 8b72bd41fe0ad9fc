//! Recall: a compacted request carries the `abridge_recall` tool; when the
//! model calls it, abridge answers from the condensed messages and asks again, and the
//! client gets one answer with the elided fact in it, never the call, with every
//! round's usage.

use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::{Proxy, client, compacting};

pub(super) const ADMIN_TOKEN: &str = "k7Qm2vXp9Lr4Tz8Wn3Ys6Bd1Hf5Gj0Ca";
pub(super) const FACT: &str = "The staging database listens on port 6543.";
pub(super) const QUESTION: &str = "Which port does the staging database listen on?";

/// The fake provider, using the recall tool when offered, and abridge compacting at
/// 3,000 tokens with recency.
pub(super) async fn setup() -> (FakeProvider, Proxy) {
    setup_with(3).await
}

/// [`setup`] with `recall.max_rounds` at `max_rounds`.
pub(super) async fn setup_with(max_rounds: u32) -> (FakeProvider, Proxy) {
    setup_of(max_rounds, false).await
}

/// [`setup_with`], the model thinking before it answers when `thinking`.
pub(super) async fn setup_of(max_rounds: u32, thinking: bool) -> (FakeProvider, Proxy) {
    let provider = FakeProvider::start(Behavior {
        uses_recall: true,
        thinking,
        ..Behavior::default()
    })
    .await
    .unwrap();
    let mut config = compacting(&provider.url(), Strategy::Recency, 3000);
    config.compaction.background = false;
    config.recall.max_rounds = max_rounds;
    config.admin.token = Some(abridge::secret::Secret::new(ADMIN_TOKEN));
    let proxy = Proxy::start_with(config).await;
    (provider, proxy)
}

/// A chat whose first turn plants [`FACT`] deep in a long message, grown until it is
/// compacted; its messages.
pub(super) async fn compacted_chat(proxy: &Proxy) -> Vec<Value> {
    let notes = format!(
        "Setup notes for the rollout.\n{}\n{FACT}\n",
        "The rollout waits for the canary to stay green overnight.\n".repeat(6)
    );
    compacted_chat_of(proxy, "sk-recall", &notes).await
}

/// A chat of `tenant` opening with `notes`, grown until it is compacted.
pub(super) async fn compacted_chat_of(proxy: &Proxy, tenant: &str, notes: &str) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": notes}),
    ];
    for turn in 1..40 {
        let body = json!({"model": "fake-model", "messages": messages});
        let response = post(proxy, tenant, &body, &[]).await;
        assert_eq!(response.status(), 200);
        let compacted = response.headers()["x-abridge-compacted"] == "true";
        let body: Value = response.json().await.unwrap();
        messages.push(body["choices"][0]["message"].clone());
        if compacted {
            return messages;
        }
        messages.push(json!({"role": "user", "content": format!(
            "Turn {turn}: {}", "Tell me more about the harbour and its old lighthouse. ".repeat(20)
        )}));
    }
    panic!("never compacted");
}

/// `/admin/conversations/{id}` once it counts `recalls` (recorded after the answer is
/// sent), or as it is after 5 s.
pub(super) async fn recalls_shown(proxy: &Proxy, id: &str, recalls: u64) -> Value {
    let mut shown = Value::Null;
    for _ in 0..50 {
        shown = proxy
            .admin_json(&format!("/admin/conversations/{id}"), ADMIN_TOKEN)
            .await;
        if shown["state"]["recalls"] == recalls {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    shown
}

/// The bodies the provider received after its first `before` requests.
pub(super) fn rounds_since(provider: &FakeProvider, before: usize) -> Vec<Value> {
    provider.requests()[before..]
        .iter()
        .map(|r| r.json())
        .collect()
}

/// A chat completion `body` sent as `tenant`, with `headers`.
pub(super) async fn post(
    proxy: &Proxy,
    tenant: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url("/v1/chat/completions"))
        .bearer_auth(tenant)
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// `messages` sent by the test's tenant: the status, headers and body of the answer.
async fn chat(
    proxy: &Proxy,
    messages: &[Value],
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, Value) {
    let body = json!({"model": "fake-model", "messages": messages});
    let response = post(proxy, "sk-recall", &body, headers).await;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.json().await.unwrap())
}

#[tokio::test]
async fn an_elided_fact_comes_back_through_a_recall_the_client_never_sees() {
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let (status, headers, body) = chat(&proxy, &messages, &[]).await;
    assert_eq!(status, 200, "{body}");
    let answer = &body["choices"][0];
    assert!(
        answer["message"]["content"]
            .as_str()
            .unwrap()
            .contains("port 6543"),
        "{body}"
    );
    assert!(answer["message"].get("tool_calls").is_none(), "{body}");
    assert_eq!(answer["finish_reason"], "stop");
    assert_eq!(headers["x-abridge-recalls"], "1");

    // Two rounds at the provider: the compacted request with the tool (the fact no longer
    // in it), then the same with the call and its result.
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2, "{rounds:?}");
    let tools = rounds[0]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["function"]["name"], "abridge_recall");
    // (The recency index may keep the number; not what it is.)
    assert!(
        !rounds[0]["messages"].to_string().contains(FACT),
        "the fact was condensed"
    );
    let follow_up = rounds[1]["messages"].as_array().unwrap();
    let result = follow_up.last().unwrap();
    assert_eq!(result["role"], "tool");
    assert!(
        result["content"].as_str().unwrap().contains(FACT),
        "{result}"
    );
    assert_eq!(
        rounds[1]["tools"], rounds[0]["tools"],
        "the same tool, byte for byte"
    );

    // The usage the client sees is both rounds'.
    let prompt = |r: &Value| fake_provider::count_tokens(r["messages"].as_array().unwrap());
    assert_eq!(
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        prompt(&rounds[0]) + prompt(&rounds[1])
    );
    let stats = proxy.stats();
    assert_eq!(stats.recalls, 1);
    // What the recall cost: the follow-up's tokens, as the provider reported them.
    assert_eq!(stats.recall_input_tokens, prompt(&rounds[1]));
    assert!(stats.recall_output_tokens > 0, "{stats:?}");
    // Counted for the conversation, in the admin API (recorded once the body is sent).
    let id = headers["x-abridge-conversation"]
        .to_str()
        .unwrap()
        .to_owned();
    let shown = recalls_shown(&proxy, &id, 1).await;
    assert_eq!(shown["state"]["recalls"], 1, "{shown}");

    // The next turn is forwarded with the same tool bytes: the prompt cache holds.
    messages.push(answer["message"].clone());
    messages.push(json!({"role": "user", "content": "And the harbour lighthouse?"}));
    let first_tools = provider.requests()[before].body.clone();
    let (status, _, _) = chat(&proxy, &messages, &[]).await;
    assert_eq!(status, 200);
    let tools_of = |body: &[u8]| {
        let text = std::str::from_utf8(body).unwrap().to_owned();
        let at = text.find(r#""tools":"#).unwrap();
        text[at..].to_owned()
    };
    assert_eq!(
        tools_of(&provider.last_request().unwrap().body),
        tools_of(&first_tools)
    );
}

#[tokio::test]
async fn no_tool_when_the_client_turns_it_off_or_forces_its_own() {
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let (status, headers, _) = chat(&proxy, &messages, &[("x-abridge-recall", "off")]).await;
    assert_eq!(status, 200);
    assert!(headers.get("x-abridge-recalls").is_none());
    assert!(
        provider
            .last_request()
            .unwrap()
            .json()
            .get("tools")
            .is_none()
    );
    assert_eq!(headers["x-abridge-compacted"], "true");

    // The client's own tools, and a forced one: the forwarded tools are the client's.
    let body = json!({
        "model": "fake-model", "messages": messages,
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
    });
    let answer: Value = post(&proxy, "sk-recall", &body, &[])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "shell"
    );
    let forwarded = provider.last_request().unwrap().json();
    assert_eq!(forwarded["tools"].as_array().unwrap().len(), 1);
}

/// The other two formats, whole: the same round trip.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wire {
    Responses,
    Messages,
}

impl Wire {
    pub(super) fn path(self) -> &'static str {
        match self {
            Wire::Responses => "/v1/responses",
            Wire::Messages => "/v1/messages",
        }
    }

    pub(super) fn body(self, history: &[Value]) -> Value {
        match self {
            Wire::Responses => {
                json!({"model": "fake-model", "instructions": "Be brief.", "input": history})
            }
            Wire::Messages => {
                json!({"model": "fake-model", "system": "Be brief.", "max_tokens": 256, "messages": history})
            }
        }
    }

    /// The answer's text and whether it calls any tool.
    pub(super) fn text(self, answer: &Value) -> (String, bool) {
        match self {
            Wire::Responses => {
                let output = answer["output"].as_array().unwrap();
                let text = output
                    .iter()
                    .filter(|o| o["type"] == "message")
                    .flat_map(|o| o["content"].as_array().unwrap())
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                (text, output.iter().any(|o| o["type"] == "function_call"))
            }
            Wire::Messages => {
                let content = answer["content"].as_array().unwrap();
                let text = content.iter().filter_map(|b| b["text"].as_str()).collect();
                (text, content.iter().any(|b| b["type"] == "tool_use"))
            }
        }
    }

    pub(super) fn input_tokens(self, request: &Value) -> u64 {
        match self {
            Wire::Responses => fake_provider::count_response_tokens(request),
            Wire::Messages => fake_provider::count_message_tokens(request),
        }
    }

    pub(super) fn reported_input(self, answer: &Value) -> u64 {
        let usage = &answer["usage"];
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap_or(0)
            + usage["cache_creation_input_tokens"].as_u64().unwrap_or(0)
    }

    pub(super) async fn send(self, proxy: &Proxy, history: &[Value]) -> (http::HeaderMap, Value) {
        let response = client()
            .post(proxy.url(self.path()))
            .bearer_auth("sk-recall")
            .header("x-api-key", "sk-ant-recall")
            .header("anthropic-version", "2023-06-01")
            .json(&self.body(history))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers().clone();
        (headers, response.json().await.unwrap())
    }
}

/// A `wire` conversation planting [`FACT`], grown until compacted, then [`QUESTION`].
pub(super) async fn compacted_history(proxy: &Proxy, wire: Wire) -> Vec<Value> {
    let notes = format!(
        "Setup notes for the rollout.\n{}\n{FACT}\n",
        "The rollout waits for the canary to stay green overnight.\n".repeat(6)
    );
    let mut history = vec![json!({"role": "user", "content": notes})];
    for turn in 1..40 {
        let (headers, answer) = wire.send(proxy, &history).await;
        history.push(json!({"role": "assistant", "content": wire.text(&answer).0}));
        if headers
            .get("x-abridge-compacted")
            .is_some_and(|v| v == "true")
        {
            history.push(json!({"role": "user", "content": QUESTION}));
            return history;
        }
        history.push(json!({"role": "user", "content": format!(
            "Turn {turn}: {}", "Tell me more about the harbour and its old lighthouse. ".repeat(20)
        )}));
    }
    panic!("{wire:?}: never compacted");
}

#[tokio::test]
async fn responses_and_messages_recall_the_same_way() {
    for wire in [Wire::Responses, Wire::Messages] {
        let (provider, proxy) = setup().await;
        let history = compacted_history(&proxy, wire).await;
        let before = provider.requests().len();
        let (headers, answer) = wire.send(&proxy, &history).await;
        let (text, calls) = wire.text(&answer);
        assert!(text.contains("port 6543"), "{wire:?}: {answer}");
        assert!(!calls, "{wire:?}: the client never sees the call: {answer}");
        assert_eq!(headers["x-abridge-recalls"], "1", "{wire:?}");
        if let Wire::Responses = wire {
            // A Responses answer echoes the request's tools: only the client's.
            assert_eq!(answer["tools"], json!([]), "{answer}");
            assert_eq!(answer["tool_choice"], "auto", "{answer}");
        }
        let rounds = rounds_since(&provider, before);
        assert_eq!(rounds.len(), 2, "{wire:?}");
        assert_eq!(rounds[1]["tools"], rounds[0]["tools"]);
        assert_eq!(
            wire.reported_input(&answer),
            wire.input_tokens(&rounds[0]) + wire.input_tokens(&rounds[1]),
            "{wire:?}: the usage of both rounds"
        );
    }
}

#[tokio::test]
async fn the_last_round_asks_for_an_answer_and_the_clients_own_calls_reach_it() {
    let (provider, proxy) = setup_with(1).await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let (_, headers, body) = chat(&proxy, &messages, &[]).await;
    assert_eq!(headers["x-abridge-recalls"], "1");
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2, "max_rounds = 1: one follow-up");
    assert_eq!(
        rounds[1]["tool_choice"], "none",
        "the last round asks for an answer"
    );
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("6543")
    );

    // The client's own tool: offered beside the recall tool, and its call reaches the
    // client (the question is about what is still in view).
    messages.push(body["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "Tell me more about the harbour lighthouse."}));
    let shell = json!({"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}});
    let body = json!({"model": "fake-model", "messages": messages, "tools": [shell]});
    let response = post(&proxy, "sk-recall", &body, &[]).await;
    assert_eq!(response.headers()["x-abridge-compacted"], "true");
    let answer: Value = response.json().await.unwrap();
    let call = &answer["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "shell", "{answer}");
    let tools = provider.last_request().unwrap().json()["tools"].clone();
    assert_eq!(tools[0], shell);
    assert_eq!(tools[1]["function"]["name"], "abridge_recall");
}

#[tokio::test]
async fn a_provider_that_refuses_tools_answers_without_the_tool_and_the_tenant_is_not_sent_it_again()
 {
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let refuse = [("x-fake-reject-tools", "1")];
    let (status, headers, _) = chat(&proxy, &messages, &refuse).await;
    assert_eq!(status, 200, "what abridge added never fails the request");
    assert!(
        headers["x-abridge-note"]
            .to_str()
            .unwrap()
            .contains("refused the abridge_recall tool")
    );
    let rounds = rounds_since(&provider, before);
    assert_eq!(rounds.len(), 2);
    assert!(rounds[0].get("tools").is_some() && rounds[1].get("tools").is_none());
    // Not sent again to this tenant.
    let (status, _, _) = chat(&proxy, &messages, &refuse).await;
    assert_eq!(status, 200);
    assert!(
        provider
            .last_request()
            .unwrap()
            .json()
            .get("tools")
            .is_none()
    );
    // Another tenant's requests still carry it.
    let notes = "Setup notes for the rollout: nothing about databases.";
    let mut theirs = compacted_chat_of(&proxy, "sk-other-tenant", notes).await;
    theirs.push(json!({"role": "user", "content": QUESTION}));
    let body = json!({"model": "fake-model", "messages": theirs});
    let response = post(&proxy, "sk-other-tenant", &body, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-abridge-recalls"], "1");

    // A client's own tools that the provider refuses do not turn recall off.
    let (provider, proxy) = setup().await;
    let mut messages = compacted_chat(&proxy).await;
    messages.push(json!({"role": "user", "content": QUESTION}));
    let shell = json!({"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}});
    let body = json!({"model": "fake-model", "messages": messages, "tools": [shell]});
    let response = post(&proxy, "sk-recall", &body, &refuse).await;
    assert_eq!(
        response.status(),
        400,
        "the provider's own answer to the client's tools"
    );
    assert_eq!(
        provider.requests().last().unwrap().json()["tools"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Recall is still on for the tenant.
    let (_, headers, _) = chat(&proxy, &messages, &[]).await;
    assert_eq!(headers["x-abridge-recalls"], "1");
}

#[tokio::test]
async fn a_tenant_recalls_only_its_own_conversation() {
    let (provider, proxy) = setup().await;
    // Tenant A's conversation holds the fact; tenant B's, with the same opening shape,
    // does not. B asks A's question.
    let _ = compacted_chat(&proxy).await;
    let notes = "Setup notes for the rollout: nothing about databases.";
    let mut theirs = compacted_chat_of(&proxy, "sk-other-tenant", notes).await;
    theirs.push(json!({"role": "user", "content": QUESTION}));
    let before = provider.requests().len();
    let body = json!({"model": "fake-model", "messages": theirs});
    let response = post(&proxy, "sk-other-tenant", &body, &[]).await;
    assert_eq!(
        response.headers()["x-abridge-recalls"],
        "1",
        "B's model did recall"
    );
    let answer: Value = response.json().await.unwrap();
    for round in rounds_since(&provider, before) {
        assert!(!round.to_string().contains("6543"), "{round}");
    }
    assert!(!answer.to_string().contains("6543"), "{answer}");
}

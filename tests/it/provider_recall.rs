//! Recall after a provider-API compaction abridge served: the `compaction` item
//! (`/v1/responses/compact`, Codex's `compaction_trigger`) or block (`compact_20260112`)
//! carries an archive of what it replaced, so a later request that sends back only the
//! item — the history gone from the client — gets the `abridge_recall` tool, and the
//! model reads a fact that is nowhere else, on another replica or after a restart
//! (in-process store, the same configured secret). An item made before archives still
//! expands (no tool: nothing to recall); over its bound the archive keeps the newest
//! messages and a recall says which it left out.

use abridge::config::{Config, ProviderCompaction};
use abridge::secret::Secret;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::{Proxy, client};
use crate::provider_apis::{last_responses, post, serving, user};
use crate::recall::{FACT, QUESTION};

const SECRET: &str = "the deployment's identity secret";

/// abridge serving both wings' compaction APIs, with recall, a configured secret and
/// an in-process store: a restarted proxy (or a second one so configured) opens items.
fn config(url: &str) -> Config {
    let mut config = serving(url);
    config.provider_apis.messages_compaction = ProviderCompaction::Serve;
    config.identity.secret = Some(Secret::new(SECRET));
    config
}

async fn fake() -> FakeProvider {
    FakeProvider::start(Behavior {
        uses_recall: true,
        ..Behavior::default()
    })
    .await
    .unwrap()
}

/// A Codex-like history whose tool output holds [`FACT`] among other lines: nowhere
/// else, and not what a digest lists.
fn history() -> Vec<Value> {
    let log = format!(
        "{}{FACT}\n{}",
        "migration 0042 applied in 31 ms\n".repeat(40),
        "health check green after 2 s\n".repeat(40)
    );
    vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]}),
        user("Find why the deploy of the ledger service fails"),
        json!({"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"cat\",\"deploy.log\"]}"}),
        json!({"type": "function_call_output", "call_id": "call_1", "output": log}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The deploy log looks healthy."}]}),
    ]
}

/// The text of a Responses answer's messages.
fn output_text(answer: &Value) -> String {
    answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .filter_map(|c| c["text"].as_str())
        .collect()
}

/// The item `/v1/responses/compact` answers `input` with, and the messages it keeps.
async fn compacted(proxy: &Proxy, input: Vec<Value>) -> Vec<Value> {
    let body = json!({"model": "local-model", "input": input});
    let answer = post(proxy, "/v1/responses/compact", &body).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    let output = answer["output"].as_array().unwrap().clone();
    let item = output.last().unwrap();
    assert_eq!(item["type"], "compaction");
    output
}

/// The turn after a compaction: only what it kept and the item, then [`QUESTION`].
async fn ask_after(proxy: &Proxy, kept: &[Value], stream: bool) -> reqwest::Response {
    let mut input = kept.to_vec();
    input.push(user(QUESTION));
    let body = json!({"model": "local-model", "input": input, "stream": stream});
    post(proxy, "/v1/responses", &body).await
}

/// The fake's requests since `before`: the first round was offered the tool and lacked
/// the fact; the re-ask carried it in the tool's result.
fn assert_recalled(provider: &FakeProvider, before: usize) {
    let rounds: Vec<Value> = provider.requests()[before..]
        .iter()
        .map(|r| r.json())
        .collect();
    assert!(rounds.len() >= 2, "the model recalled, abridge asked again");
    let first = rounds[0].to_string();
    assert!(
        first.contains("abridge_recall"),
        "the tool offered: {first}"
    );
    assert!(
        !first.contains(FACT),
        "the history is not forwarded: {first}"
    );
    assert!(
        !first.contains("\"compaction\""),
        "no item reaches the fake: {first}"
    );
    let re_ask = rounds.last().unwrap().to_string();
    assert!(re_ask.contains(FACT), "the recalled text: {re_ask}");
}

#[tokio::test]
async fn what_a_compact_item_replaced_is_recalled_on_another_replica() {
    let provider = fake().await;
    let a = Proxy::start_with(config(&provider.url())).await;
    let kept = compacted(&a, history()).await;
    assert!(
        !Value::from(kept.clone()).to_string().contains(FACT),
        "the client no longer holds the fact"
    );

    // Another replica beside it: its own in-process store, cold; the secret configured
    // alike. Nothing of the conversation is stored anywhere it could read.
    let b = Proxy::start_with(config(&provider.url())).await;
    let before = provider.requests().len();
    let answer = ask_after(&b, &kept, false).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    let text = output_text(&answer);
    assert!(text.contains("port 6543"), "{answer}");
    assert!(
        !answer.to_string().contains("abridge_recall"),
        "the client never sees the tool"
    );
    assert_recalled(&provider, before);
}

#[tokio::test]
async fn what_a_codex_trigger_replaced_is_recalled_streamed() {
    let provider = fake().await;
    let proxy = Proxy::start_with(config(&provider.url())).await;
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let body = json!({"model": "local-model", "input": input, "store": false});
    let answer: Value = post(&proxy, "/v1/responses", &body)
        .await
        .json()
        .await
        .unwrap();
    let item = answer["output"][0].clone();
    assert_eq!(item["type"], "compaction", "{answer}");
    // Codex carries on with its instructions, the item and a new ask.
    let kept = [history()[0].clone(), item];
    let before = provider.requests().len();
    let answer = ask_after(&proxy, &kept, true).await;
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    assert!(text.contains("port 6543"), "{text}");
    assert!(!text.contains("abridge_recall"), "{text}");
    assert_recalled(&provider, before);
}

#[tokio::test]
async fn an_item_made_before_archives_still_expands_without_the_tool() {
    let provider = fake().await;
    let proxy = Proxy::start_with(config(&provider.url())).await;
    // As the code before archives sealed it: no `archive` in the payload.
    let key = abridge::identity::IdentityKey::new(Secret::new(SECRET));
    let summary = abridge::provider_apis::sealed::Summary {
        summary: "The user is fixing the ledger deploy.".into(),
        items: 4,
        created_at: 1,
        archive: None,
    };
    let token = abridge::provider_apis::sealed::seal(&key, &summary);
    let item = json!({"type": "compaction", "id": "cmp_old", "encrypted_content": token});
    let answer = ask_after(&proxy, &[item], false).await;
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("x-abridge-note").is_none());
    let sent = last_responses(&provider).json().to_string();
    assert!(
        sent.contains("The user is fixing the ledger deploy."),
        "{sent}"
    );
    assert!(!sent.contains("\"compaction\""), "{sent}");
    assert!(
        !sent.contains("abridge_recall"),
        "nothing to recall: no tool: {sent}"
    );
}

/// Text that does not compress: a pseudo-random hex stream, `n` characters.
fn noise(seed: u64, n: usize) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn over_its_bound_the_archive_keeps_the_newest_and_a_recall_says_so() {
    let provider = fake().await;
    let proxy = Proxy::start_with(config(&provider.url())).await;
    // The fact in the oldest output, then 40 outputs of 20,000 characters that do not
    // compress: far over the archive's bound.
    let mut input = history();
    for n in 2..42 {
        let call = format!("call_{n}");
        input.push(json!({"type": "function_call", "call_id": call, "name": "shell", "arguments": "{\"command\":[\"dump\"]}"}));
        input.push(
            json!({"type": "function_call_output", "call_id": call, "output": noise(n, 20_000)}),
        );
    }
    let kept = compacted(&proxy, input).await;
    let token = kept.last().unwrap()["encrypted_content"].as_str().unwrap();
    assert!(
        token.len() < 200 * 1024,
        "bounded: {} bytes sent back",
        token.len()
    );
    let before = provider.requests().len();
    let answer = ask_after(&proxy, &kept, false).await;
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert!(
        output_text(&answer).contains("could not find"),
        "the fact was left out: {answer}"
    );
    let re_ask = provider.requests().last().unwrap().json().to_string();
    assert!(provider.requests().len() > before + 1);
    assert!(
        re_ask.contains("were left out of the archive (over its bound)"),
        "{re_ask}"
    );
}

// --- Anthropic Messages: the `compaction` block ---

async fn messages(proxy: &Proxy, body: &Value) -> Value {
    let answer = client()
        .post(proxy.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.json().await.unwrap()
}

fn ask(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// A history over `compact_20260112`'s least trigger (50,000 tokens), [`FACT`] in one
/// tool result among many.
fn long_history() -> Vec<Value> {
    let mut messages = vec![ask("Port the ledger service to the new runtime")];
    for n in 1..=24 {
        let id = format!("toolu_{n}");
        let mut output = format!("fn handle_{n}() {{ runtime.spawn(); }} ").repeat(400);
        if n == 7 {
            output = format!("{output}\n{FACT}\n{output}");
        }
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("/f{n}")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}));
    }
    messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Ported every handler."}]}));
    messages.push(ask("Port the ledger service handlers now"));
    messages
}

fn request(messages: &[Value]) -> Value {
    json!({"model": "local-model", "max_tokens": 64, "messages": messages,
        "context_management": {"edits": [{"type": "compact_20260112",
            "trigger": {"type": "input_tokens", "value": 50000}}]}})
}

#[tokio::test]
async fn what_a_compaction_block_replaced_is_recalled_after_a_restart_once() {
    let provider = fake().await;
    let a = Proxy::start_with(config(&provider.url())).await;
    let first = messages(&a, &request(&long_history())).await;
    let block = first["content"][0].clone();
    assert_eq!(block["type"], "compaction", "{first}");
    a.shutdown().await.unwrap();

    // The client appends the answer, as Anthropic's guide says (the history before the
    // block still sent: dropped, and not recalled twice), and asks.
    let b = Proxy::start_with(config(&provider.url())).await;
    let mut messages_sent = long_history();
    messages_sent.push(json!({"role": "assistant", "content": first["content"]}));
    messages_sent.push(ask(QUESTION));
    let before = provider.requests().len();
    let answer = messages(&b, &request(&messages_sent)).await;
    let text: String = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert!(text.contains("port 6543"), "{answer}");
    assert!(!answer.to_string().contains("abridge_recall"), "{answer}");
    assert_recalled(&provider, before);
    // The fact once in what was recalled: the archive holds it once, though the
    // client sent the history it replaced again.
    let re_ask = provider.requests().last().unwrap().json().to_string();
    assert_eq!(re_ask.matches(FACT).count(), 1, "{re_ask}");
}

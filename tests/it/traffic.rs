//! Compaction under the traffic real clients send, through the request path, against a
//! provider that counts 30 % more than abridge estimates (as real tokenizers differ):
//! system prompts that change every turn, fast-growing conversations, sibling chats
//! that share an opening, an oversized final turn.

use abridge::config::Config;
use abridge::strategies::Strategy;
use fake_provider::{Behavior, FakeProvider};
use serde_json::{Value, json};

use crate::common::agent::{Answer, idle, main_requests, raw_messages};
use crate::common::{Proxy, client, config_for};

/// The fake counts 1.3 × its documented count.
const SCALE: f64 = 1.3;

async fn provider() -> FakeProvider {
    FakeProvider::start(Behavior {
        token_scale: SCALE,
        ..Behavior::default()
    })
    .await
    .unwrap()
}

fn config(url: &str, threshold: u64) -> Config {
    let mut config = config_for(url);
    config.compaction.threshold_tokens = threshold;
    config.compaction.strategy = Strategy::Recency;
    config
}

/// A chat as a client keeps it: the whole history, resent every turn.
struct Chat {
    messages: Vec<Value>,
    key: String,
}

impl Chat {
    fn new(key: &str, system: &str, opening: &str) -> Self {
        Self {
            messages: vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": opening}),
            ],
            key: key.to_owned(),
        }
    }

    /// Sends the history and appends the answer.
    async fn send(&mut self, proxy: &Proxy) -> Answer {
        let response = client()
            .post(proxy.url("/v1/chat/completions"))
            .header("authorization", format!("Bearer {}", self.key))
            .json(&json!({"model": "fake-model", "messages": self.messages}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 200, "{body}");
        self.messages.push(body["choices"][0]["message"].clone());
        Answer {
            status,
            headers,
            body,
        }
    }

    fn ask(&mut self, words: usize, n: usize) {
        let text = format!(
            "Question {n} of chat {} about module_{n}: {}",
            self.key,
            "detail ".repeat(words)
        );
        self.messages.push(json!({"role": "user", "content": text}));
    }
}

fn reported(answer: &Answer) -> u64 {
    answer.body["usage"]["prompt_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_system_prompt_with_the_time_keeps_one_conversation_and_its_checkpoints() {
    let provider = provider().await;
    let proxy = Proxy::start_with(config(&provider.url(), 3000)).await;
    let mut chat = Chat::new(
        "sk-clock",
        "You are helpful. Current time: 10:00:00",
        "Hello.",
    );
    let mut keys = std::collections::HashSet::new();
    let mut over = Vec::new();
    for turn in 1..=24 {
        chat.messages[0] = json!({"role": "system", "content": format!("You are helpful. Current time: 10:{turn:02}:00")});
        chat.ask(60, turn);
        idle(&proxy).await;
        let answer = chat.send(&proxy).await;
        keys.insert(answer.header("x-abridge-conversation").unwrap());
        if reported(&answer) > 3000 {
            over.push((turn, reported(&answer)));
        }
    }
    assert_eq!(keys.len(), 1, "one conversation key for all 24 turns");
    assert!(
        over.is_empty(),
        "over the threshold at the provider: {over:?}"
    );
    // Checkpoints are reused: the forwarded history after the system prompt changes
    // only at a compaction, and compactions are few.
    let sent = main_requests(&provider);
    let mut changes = 0;
    for pair in sent.windows(2) {
        let (a, b) = (raw_messages(&pair[0]), raw_messages(&pair[1]));
        if !(b.len() >= a.len() && b[1..a.len()] == a[1..]) {
            changes += 1;
        }
    }
    let compactions = proxy.stats().compactions_total();
    assert!(compactions >= 1, "it was compacted");
    assert!(
        changes <= 8,
        "{changes} prefix changes in 24 turns ({compactions} compactions)"
    );
}

#[tokio::test]
async fn a_fast_growing_conversation_stays_under_the_threshold_and_compacts_in_steps() {
    let provider = provider().await;
    let proxy = Proxy::start_with(config(&provider.url(), 3000)).await;
    // Each turn adds about 30 % of the threshold at the provider.
    let mut chat = Chat::new("sk-fast", "You are terse.", "Start.");
    let mut over = Vec::new();
    let mut changes = Vec::new();
    let mut previous: Option<Vec<String>> = None;
    for turn in 1..=16 {
        chat.ask(520, turn);
        idle(&proxy).await;
        let answer = chat.send(&proxy).await;
        if reported(&answer) > 3000 {
            over.push((turn, reported(&answer)));
        }
        let forwarded = raw_messages(main_requests(&provider).last().unwrap());
        if let Some(p) = &previous
            && !(forwarded.len() >= p.len() && forwarded[..p.len()] == p[..])
        {
            changes.push(turn);
        }
        previous = Some(forwarded);
    }
    assert!(
        over.is_empty(),
        "over the threshold at the provider: {over:?}"
    );
    assert!(!changes.is_empty(), "it was compacted");
    // Never on two consecutive turns: each compaction leaves room for the next turns.
    for pair in changes.windows(2) {
        assert!(pair[1] - pair[0] >= 2, "compacted on turns {changes:?}");
    }
}

#[tokio::test]
async fn sibling_conversations_with_one_opening_are_each_compacted_at_their_crossing() {
    let provider = provider().await;
    let proxy = Proxy::start_with(config(&provider.url(), 3000)).await;
    let system = "You are the IDE assistant. Answer about the open project.";
    let mut a = Chat::new("sk-ide", system, "Explain the project.");
    let mut b = Chat::new("sk-ide", system, "Explain the project.");
    // One tenant, told apart in their questions only.
    b.key = "sk-ide".to_owned();
    let mut over = Vec::new();
    let mut keys = std::collections::HashSet::new();
    for turn in 1..=18 {
        for (name, chat) in [("a", &mut a), ("b", &mut b)] {
            chat.ask(if name == "a" { 150 } else { 110 }, turn);
            idle(&proxy).await;
            let answer = chat.send(&proxy).await;
            keys.insert(answer.header("x-abridge-conversation").unwrap());
            if reported(&answer) > 3000 {
                over.push((name, turn, reported(&answer)));
            }
        }
    }
    assert_eq!(keys.len(), 1, "they share a conversation key (one opening)");
    assert!(proxy.stats().compactions_total() >= 2);
    assert!(
        over.is_empty(),
        "over the threshold at the provider: {over:?}"
    );
    // Each was forwarded only its own history: its questions have its own length.
    for r in main_requests(&provider) {
        let lengths: std::collections::BTreeSet<usize> = raw_messages(&r)
            .iter()
            // The client's own questions (not abridge's marker, whose index quotes them).
            .filter(|m| m.contains("Question") && m.contains("\"user\""))
            .filter(|m| !m.contains("[abridge: reference material"))
            .map(|m| m.matches("detail").count())
            .filter(|&n| n >= 100)
            .collect();
        assert!(
            lengths.len() <= 1,
            "a request mixed two histories: {lengths:?}"
        );
    }
}

#[tokio::test]
async fn an_oversized_final_turn_is_forwarded_and_the_next_turn_is_compacted_again() {
    let provider = provider().await;
    let mut cfg = config(&provider.url(), 4000);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut chat = Chat::new("sk-log", "You are a coding agent.", "Look at the logs.");
    for turn in 1..=6 {
        chat.ask(250, turn);
        chat.send(&proxy).await;
    }
    // The agent reads a big log file: the final turn alone (call and result) is over the
    // threshold.
    chat.messages
        .push(json!({"role": "user", "content": "Read /var/log/app.log."}));
    chat.messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_log", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/var/log/app.log\"}"}}]}));
    chat.messages.push(json!({"role": "tool", "tool_call_id": "call_log", "content": "ERROR timeout talking to db-7\n".repeat(900)}));
    let big = chat.send(&proxy).await;
    assert!(!big.compacted(), "nothing can make it fit");
    let note = big.header("x-abridge-note").unwrap();
    assert!(note.contains("final turn"), "{note}");
    // The next turns have small final turns again: compacted, under the threshold.
    for turn in 7..=10 {
        chat.ask(40, turn);
        let answer = chat.send(&proxy).await;
        assert!(
            answer.compacted(),
            "turn {turn}: {:?}",
            answer.header("x-abridge-note")
        );
        assert!(
            reported(&answer) <= 4000,
            "turn {turn}: {} at the provider",
            reported(&answer)
        );
        assert!(
            !answer
                .header("x-abridge-note")
                .is_some_and(|n| n.contains("suspended"))
        );
    }
}

/// A coding agent's history: an ask, five tool calls with bulky outputs (test logs),
/// then it reads `src/handlers.rs` (5.9 KB), says it will patch it, and the user says
/// go ahead. What the agent is about to edit must reach the provider whole.
fn coding_session() -> (Vec<Value>, String) {
    let file: String = (0..120)
        .map(|i| format!("    let route_{i:03} = Router::new().route(\"/v{i}\", get(h));\n"))
        .collect();
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent. Use the tools."}),
        json!({"role": "user", "content": "The 404 handler returns HTML; make it JSON (ticket WEB-4411)."}),
    ];
    for i in 0..5 {
        let id = format!("call_{i}");
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "bash", "arguments": json!({"command": format!("cargo test web_{i}")}).to_string()}}]}));
        let log: String = (0..90)
            .map(|l| format!("test web_{i}::case_{l} ... ok\n"))
            .collect();
        m.push(json!({"role": "tool", "tool_call_id": id, "content": format!("running 90 tests\n{log}exit code: 0")}));
        m.push(json!({"role": "assistant", "content": format!("Suite web_{i} passes.")}));
    }
    m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_read", "type": "function",
        "function": {"name": "read_file", "arguments": "{\"path\":\"src/handlers.rs\"}"}}]}));
    m.push(json!({"role": "tool", "tool_call_id": "call_read", "content": file}));
    m.push(json!({"role": "assistant", "content": "I'll patch handle_not_found in src/handlers.rs to return JSON."}));
    m.push(json!({"role": "user", "content": "Go ahead and write the patch."}));
    (m, file)
}

#[tokio::test]
async fn recency_keeps_the_file_the_agent_is_about_to_edit_and_uses_its_budget() {
    let provider = provider().await;
    let threshold = 5000;
    let proxy = Proxy::start_with(config(&provider.url(), threshold)).await;
    let (messages, file) = coding_session();
    let answer = client()
        .post(proxy.url("/v1/chat/completions"))
        .json(&json!({"model": "fake-model", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-abridge-compacted"], "true");
    let body: Value = answer.json().await.unwrap();
    let sent = main_requests(&provider);
    let forwarded = raw_messages(sent.last().unwrap());
    let joined = forwarded.join("\n");
    let whole = serde_json::to_string(&file).unwrap();
    assert!(
        joined.contains(&whole[1..whole.len() - 1]),
        "src/handlers.rs reached the provider whole:\n{joined}"
    );
    // The budget is used: more than half the threshold, not a third of the target.
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt > threshold / 2 && prompt <= threshold,
        "{prompt} prompt tokens at the provider for a {threshold}-token threshold"
    );
    // Older bulky outputs are the ones reduced (digested or elided): only the newest may
    // reach the provider whole.
    let whole_logs: Vec<usize> = (0..5)
        .filter(|i| joined.contains(&format!("test web_{i}::case_89 ... ok")))
        .collect();
    assert!(
        whole_logs.iter().all(|&i| i == 4),
        "{whole_logs:?}:\n{joined}"
    );
}

/// The record of the turn before is missing — it had not landed when the client sent the
/// next turn to another replica, or the replica died with it — so the request the
/// history crosses the threshold with is two answers past the last report. Its growth
/// is still one turn's: the compaction leaves room for three turns of it, not six.
#[tokio::test]
async fn a_turn_two_answers_past_its_record_is_compacted_for_one_turns_growth() {
    const WORDS: usize = 200;
    let provider = provider().await;
    let threshold = 4000;
    let mut cfg = config(&provider.url(), threshold);
    cfg.compaction.background = false;
    let proxy = Proxy::start_with(cfg).await;
    let mut chat = Chat::new("sk-stale", "You are terse.", "Start.");
    let (mut last, mut growth) = (reported(&chat.send(&proxy).await), 0);
    let mut turn = 1;
    // Turn by turn until two more would cross.
    while last + 2 * growth <= threshold {
        chat.ask(WORDS, turn);
        let answer = chat.send(&proxy).await;
        assert!(
            !answer.compacted(),
            "turn {turn}: compacted before the crossing"
        );
        growth = reported(&answer) - last;
        last = reported(&answer);
        turn += 1;
    }
    // One turn the proxy never saw (answered like the last one), then the one that
    // crosses, a little longer so that it crosses by a margin.
    let answered = chat.messages.last().unwrap().clone();
    chat.ask(WORDS, turn);
    chat.messages.push(answered);
    chat.ask(WORDS + 60, turn + 1);
    let crossing = chat.send(&proxy).await;
    assert!(
        crossing.compacted(),
        "{:?}",
        crossing.header("x-abridge-note")
    );
    let after = reported(&crossing);
    // The target leaves three turns of room (the soft headroom is less here); recency
    // keeps whole messages, so it lands below it. Six turns of room (the growth of two
    // answers counted as one turn's) would leave a third of this.
    let target = threshold - 3 * growth;
    assert!(
        after > target - 2 * growth && after <= threshold,
        "{after} tokens at the provider after compacting; one turn grows {growth}, \
         the target is {target}"
    );
}

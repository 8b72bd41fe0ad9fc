//! Tests of the strategies through [`compact`], the validator, and property tests over
//! random conversations. This module holds the shared helpers (conversations, running a
//! compaction, reading a plan back); the tests are in the topic modules below.

mod final_turn;
mod messages;
mod plans;
mod properties;
mod settings;
mod summariser;
mod validator;

use serde_json::{Value, json};

use super::Strategy;
use super::*;
use crate::formats::chat;

fn body(messages: &[Value]) -> String {
    json!({ "model": "m", "messages": messages }).to_string()
}

fn parse(body: &str) -> Vec<Item<'_>> {
    chat::parse(body.as_bytes()).unwrap().messages
}

fn run<F, Fut, A>(
    strategy: Strategy,
    input: &Input<'_>,
    settings: &Settings,
    summarise: F,
) -> Result<Plan, CannotCompact>
where
    F: Fn(SummaryRequest) -> Fut,
    Fut: Future<Output = Result<A, SummaryError>>,
    A: Into<Answer>,
{
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(compact(strategy, input, settings, summarise, &Inline))
}

async fn never(_: SummaryRequest) -> Result<String, SummaryError> {
    Err(SummaryError::Unreadable)
}

async fn echo(request: SummaryRequest) -> Result<String, SummaryError> {
    Ok(echo_summary(&request))
}

fn input<'x>(messages: &'x [Item<'x>], budget: u64, estimator: &'x Estimator) -> Input<'x> {
    Input {
        messages,
        budget,
        previous: None,
        focus: None,
        estimator,
        format: crate::formats::Format::Chat,
        summary_window: None,
        summary_ratio: None,
    }
}

/// The forwarded messages, parsed back.
fn forwarded_json(messages: &[Item<'_>], plan: &Plan) -> Vec<Value> {
    plan.forwarded(messages)
        .into_iter()
        .map(|r| serde_json::from_str(r.get()).unwrap())
        .collect()
}

fn forwarded_tokens(messages: &[Item<'_>], plan: &Plan, estimator: &Estimator) -> u64 {
    let joined: Vec<String> = plan
        .forwarded(messages)
        .into_iter()
        .map(|r| r.get().to_owned())
        .collect();
    let body = format!(r#"{{"messages":[{}]}}"#, joined.join(","));
    estimator.messages(&parse(&body))
}

fn frames(messages: &[Item<'_>], plan: &Plan) -> usize {
    plan.forwarded(messages)
        .iter()
        .filter(|r| r.get().contains(&FRAME.replace('"', "\\\"")))
        .count()
}

/// An agentic conversation: system, then `turns` turns of user → assistant calling two
/// tools in parallel → results (one large) → assistant answer; then a final user message.
fn agentic(turns: usize, result_chars: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent.", "x_cache": {"ttl": 5}}),
    ];
    for t in 0..turns {
        m.push(json!({"role": "user", "content": format!("Step {t}: fix the bug in src/mod_{t}.rs (ticket ABC-{t})")}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{t}_a"), "type": "function", "function": {"name": "bash", "arguments": json!({"command": format!("cargo test mod_{t}")}).to_string()}},
            {"id": format!("call_{t}_b"), "type": "function", "function": {"name": "read_file", "arguments": json!({"path": format!("src/mod_{t}.rs")}).to_string()}}
        ]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t}_a"), "content": format!("running 3 tests\n{}\nexit code: 1", "ok ".repeat(result_chars / 3)), "x_meta": t}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t}_b"), "content": format!("fn f{t}() {{}}")}));
        m.push(json!({"role": "assistant", "content": format!("Fixed src/mod_{t}.rs; took 120 ms. TODO: update docs for ABC-{t}.")}));
    }
    m.push(json!({"role": "user", "content": "Now write the changelog entry for these fixes."}));
    m
}

/// A compact summary that passes the check for `request`: every section, the prompt's
/// distinct identifiers and the start of its last user message. For the tests.
pub(crate) fn echo_summary(request: &SummaryRequest) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (name, _) in super::gate::SECTIONS {
        let _ = writeln!(out, "## {name}\n(none)\n");
    }
    let mut ids = super::text::identifiers(&request.prompt);
    ids.sort();
    ids.dedup();
    out.push_str(&ids.join(" "));
    if let Some((_, ask)) = request.prompt.rsplit_once("[USER]\n") {
        out.push('\n');
        out.push_str(&super::text::truncate_chars(ask, 300));
    }
    out
}

//! Anthropic Messages conversations (Claude Code's shape): a tool result is a block in a
//! user message, and several calls of one assistant message are answered by one user
//! message. Bulky results are cleared in place, each block by its own call, everything
//! else of the message kept.

use super::*;
use crate::formats::{Format, messages};

/// Claude Code's shape: the first ask and its answer, then the final ask and `rounds`
/// rounds of an assistant message calling `Bash` and `Read` in parallel, answered by one
/// user message with both results (`chars` characters for Bash's, a short one for
/// Read's) and a reminder text block; each read by the next round, the last one's
/// results the newest exchange.
fn claude_turn(rounds: usize, chars: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "user", "content": [{"type": "text", "text": "Look at the repository."}]}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "A Rust crate."}]}),
        json!({"role": "user", "content": [{"type": "text", "text": "Fix every failing test (ticket ABC-7)."}]}),
    ];
    for r in 0..rounds {
        m.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("Round {r}.")},
            {"type": "tool_use", "id": format!("toolu_{r}a"), "name": "Bash",
             "input": {"command": format!("cargo test part_{r}")}},
            {"type": "tool_use", "id": format!("toolu_{r}b"), "name": "Read",
             "input": {"file_path": format!("src/part_{r}.rs")}}]}));
        m.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{r}a"), "is_error": true,
             "content": format!("running part_{r}\n{}\nexit code: 1", "failed ".repeat(chars / 7))},
            {"type": "tool_result", "tool_use_id": format!("toolu_{r}b"),
             "content": [{"type": "text", "text": format!("fn part_{r}() {{}}")}]},
            {"type": "text", "text": "<system-reminder>todo list unchanged</system-reminder>"}]}));
    }
    m
}

/// The messages `plan` forwards as digests, in order.
fn digested(plan: &Plan) -> Vec<usize> {
    plan.origin
        .iter()
        .filter_map(|o| match *o {
            Origin::Digest(k) => Some(k),
            _ => None,
        })
        .collect()
}

fn claude_body(messages: &[Value]) -> String {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages}).to_string()
}

#[test]
fn a_claude_code_final_turn_over_the_budget_has_its_bulky_results_cleared_block_by_block() {
    let msgs = claude_turn(8, 8000);
    let body = claude_body(&msgs);
    let messages = messages::parse(body.as_bytes()).unwrap().items;
    let e = Estimator::approx();
    let ask = 2;
    let budget = e.messages(&messages[ask..]) / 2;
    for strategy in [Strategy::Recency, Strategy::Deterministic] {
        let input = Input {
            format: Format::Messages,
            ..input(&messages, budget, &e)
        };
        let plan = run(strategy, &input, &Settings::default(), echo).unwrap();
        validate(&messages, &plan).unwrap();
        assert!(plan.tokens_after <= budget, "{strategy}: {plan:?}");
        let out: Vec<Value> = plan
            .forwarded(&messages)
            .into_iter()
            .map(|r| serde_json::from_str(r.get()).unwrap())
            .collect();
        let sent = &out[out.len() - (msgs.len() - ask)..];
        let mut cleared = 0;
        for (i, (sent, original)) in sent.iter().zip(&msgs[ask..]).enumerate() {
            if sent == original {
                continue;
            }
            // Only a result message changes, and in it only the bulky Bash output: the
            // call it answers, its error flag, the short Read result and the reminder
            // are as they came.
            let (s, o) = (&sent["content"], &original["content"]);
            assert_eq!(s[0]["tool_use_id"], o[0]["tool_use_id"]);
            assert_eq!(s[0]["is_error"], true);
            let text = s[0]["content"].as_str().unwrap();
            assert!(
                text.starts_with("[abridge: tool output elided] Bash(command=\"cargo test part_"),
                "{text}"
            );
            assert!(text.contains("exit status 1"), "{text}");
            // It names the message recall reads it back by.
            assert!(
                text.contains(&format!("lines (m{})", ask + i + 1)),
                "{text}"
            );
            assert_eq!(s[1], o[1]);
            assert_eq!(s[2], o[2]);
            cleared += 1;
        }
        assert!((1..7).contains(&cleared), "{strategy}: {cleared} cleared");
        assert_eq!(out.last(), msgs.last());
    }
}

#[test]
fn bulky_results_before_the_final_turn_are_digested_in_the_kept_part() {
    let mut msgs = claude_turn(6, 6000);
    msgs.push(json!({"role": "assistant", "content": [{"type": "text", "text": "All pass."}]}));
    msgs.push(json!({"role": "user", "content": [{"type": "text", "text": "Now the changelog."}]}));
    let body = claude_body(&msgs);
    let messages = messages::parse(body.as_bytes()).unwrap().items;
    let e = Estimator::approx();
    let budget = e.messages(&messages) * 2 / 3;
    let input = Input {
        format: Format::Messages,
        ..input(&messages, budget, &e)
    };
    let plan = run(Strategy::Recency, &input, &Settings::default(), echo).unwrap();
    validate(&messages, &plan).unwrap();
    assert!(plan.tokens_after <= budget, "{plan:?}");
    let digests = digested(&plan);
    assert!(!digests.is_empty(), "{plan:?}");
    for k in digests {
        assert!(messages[k].is_result(), "m{k}");
    }
}

#[test]
fn a_session_of_one_ask_is_compacted_by_clearing_alone() {
    // The first ask is the final turn: nothing before it to elide.
    let msgs = claude_turn(8, 8000)[2..].to_vec();
    let body = claude_body(&msgs);
    let messages = messages::parse(body.as_bytes()).unwrap().items;
    let e = Estimator::approx();
    let whole = e.messages(&messages) + e.per_request();
    let settings = Settings::default();
    let kept = essential(&input(&messages, 0, &e), &settings).unwrap();
    assert!(kept < whole / 4, "what every plan keeps: {kept} of {whole}");
    for strategy in [
        Strategy::Recency,
        Strategy::Deterministic,
        Strategy::Structured,
    ] {
        let budget = whole / 2;
        let input = Input {
            format: Format::Messages,
            ..input(&messages, budget, &e)
        };
        // No summary is asked: there is nothing to summarise.
        let plan = run(strategy, &input, &settings, never).unwrap();
        validate(&messages, &plan).unwrap();
        assert!(plan.tokens_after <= budget, "{strategy}: {plan:?}");
        assert!(plan.head > 0 && plan.summary.is_none(), "{plan:?}");
        assert!(
            plan.origin.iter().all(|o| !matches!(o, Origin::Authored)),
            "{strategy}: no marker, nothing is elided"
        );
        let out = forwarded_json(&messages, &plan);
        assert_eq!(out.len(), msgs.len(), "every message is sent");
        assert_eq!(out[0], msgs[0], "the ask as it came");
        let cleared = digested(&plan);
        // The oldest first, only as many as it takes.
        assert!((1..7).contains(&cleared.len()), "{cleared:?}");
        assert_eq!(
            cleared,
            (0..cleared.len()).map(|i| 2 + 2 * i).collect::<Vec<_>>()
        );
        let expected = match strategy {
            Strategy::Deterministic => Strategy::Deterministic,
            _ => Strategy::Recency,
        };
        assert_eq!(plan.strategy, expected);
    }
    // Below what clearing everything but the newest exchange leaves: too large.
    let input = Input {
        format: Format::Messages,
        ..input(&messages, kept / 2, &e)
    };
    let err = run(Strategy::Recency, &input, &settings, never).unwrap_err();
    assert!(matches!(err, CannotCompact::TooLarge { .. }), "{err:?}");
}

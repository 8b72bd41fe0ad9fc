//! Tests of the decision: growth, calibration, what abridge adds, and how a decided
//! request is seen by the horizon.

use super::*;
use crate::compactor::turn::Record;
use crate::formats::Format;

#[test]
fn growth_counts_a_burst_at_once_and_a_lull_slowly() {
    let usage = |growth| Usage {
        growth,
        ..usage_at(1_000)
    };
    assert_eq!(growth(None, 5_000, 1), 0);
    assert_eq!(growth(Some(&usage(100)), 1_900, 1), 900, "a burst");
    assert_eq!(growth(Some(&usage(800)), 1_100, 1), 450, "a lull halves it");
    // The report is two answers old: two turns of 450, not one of 900.
    assert_eq!(growth(Some(&usage(450)), 1_900, 2), 450, "a stale report");
    assert_eq!(growth(Some(&usage(450)), 1_900, 0), 900, "at least one");
}

#[test]
fn the_pace_is_the_slower_of_the_turn_and_the_growth_remembered() {
    let usage = |growth| Usage {
        growth,
        ..usage_at(1_000)
    };
    assert_eq!(pace(None, 5_000, 1), 0);
    // The history's first growth: nothing remembered, the turn's own.
    assert_eq!(pace(Some(&usage(0)), 33_000, 1), 32_000, "a first growth");
    assert_eq!(pace(Some(&usage(1_200)), 3_058, 1), 1_200, "a burst");
    assert_eq!(pace(Some(&usage(2_000)), 1_300, 1), 300, "a lull");
    assert_eq!(pace(Some(&usage(2_000)), 1_900, 3), 300, "a stale report");
}

fn usage_at(tokens: u64) -> Usage {
    Usage {
        prefix: crate::identity::IdentityKey::new(crate::secret::Secret::new("k"))
            .namespace(b"t", None),
        messages: 3,
        tokens,
        applied: None,
        head_tokens: 0,
        growth: 0,
        ratio_permille: 1000,
        client_tokens: 0,
        beside: 0,
        at_ms: 0,
    }
}

#[test]
fn round_trips_count_answers_not_items() {
    let raw: Vec<Box<serde_json::value::RawValue>> = [
        r#"{"role": "assistant", "content": null, "tool_calls": []}"#,
        r#"{"role": "tool", "tool_call_id": "a", "content": "x"}"#,
        r#"{"role": "assistant", "content": "one"}"#,
        r#"{"role": "user", "content": "next"}"#,
        r#"{"role": "assistant", "content": "two"}"#,
        r#"{"role": "assistant", "content": "still two"}"#,
        r#"{"role": "user", "content": "last"}"#,
    ]
    .into_iter()
    .map(|m| serde_json::value::RawValue::from_string(m.to_owned()).unwrap())
    .collect();
    let items: Vec<Item<'_>> = raw
        .iter()
        .filter_map(|m| Format::Chat.item(crate::json::Raw::from(&**m)))
        .collect();
    assert_eq!(items.len(), 7);
    assert_eq!(round_trips(&items), 3);
    assert_eq!(round_trips(&items[6..]), 1, "no answer yet: one turn");
    assert_eq!(round_trips(&[]), 1);
}

/// A request compacted with the recall tool carries the tool's definition, which the
/// provider counts: the strategies' budget is lower by its tokens, and an applied
/// checkpoint is estimated with them.
#[test]
fn a_compaction_aims_lower_by_the_recall_tool_it_adds() {
    let mut messages = vec![serde_json::json!({"role": "system", "content": "Be brief."})];
    for n in 0..30 {
        let text = format!("Turn {n}: {}", "tell me about the old harbour. ".repeat(12));
        messages.push(serde_json::json!({"role": "user", "content": text}));
        messages.push(serde_json::json!({"role": "assistant", "content": text}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "And now?"}));
    let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
    let parsed = crate::formats::chat::parse(body.as_bytes()).unwrap();
    let (controls, credentials) = (Default::default(), Default::default());
    let turn = |recall_tool| {
        chat_turn(
            &parsed.messages,
            &body,
            (&controls, &credentials),
            recall_tool,
        )
    };
    let whole = Estimator::approx().messages(&parsed.messages);
    let threshold = whole * 4 / 5;
    let budget = |recall_tool| match decide(
        &CompactionConfig::default(),
        (threshold, None),
        &turn(recall_tool),
        super::super::Reason::Request,
    )
    .action
    {
        Action::Compact { budget, .. } => budget,
        other => panic!("{other:?}"),
    };
    let tool = crate::recall::wire::tool_tokens(Format::Chat, false);
    assert!(tool > 100, "{tool}");
    assert_eq!(added(&turn(true)), tool);
    assert_eq!(added(&turn(false)), 0);
    assert_eq!(budget(false) - budget(true), tool);
    // Nothing applied, nothing added; a checkpoint applied, the tool with it.
    assert_eq!(
        estimate(&turn(true), None, threshold),
        estimate(&turn(false), None, threshold)
    );
    let checkpoint = Checkpoint::sample(
        (1, 40),
        crate::identity::IdentityKey::new(crate::secret::Secret::new("k")).namespace(b"t", None),
        vec![
            serde_json::value::RawValue::from_string(
                r#"{"role":"user","content":"Summary of 40 messages."}"#.to_owned(),
            )
            .unwrap(),
        ],
    );
    assert_eq!(
        estimate(&turn(true), Some(&checkpoint), threshold)
            - estimate(&turn(false), Some(&checkpoint), threshold),
        tool
    );
}

/// An agent's final turn is its ask and every tool round since — on Messages, tool
/// results are user messages: no plan goes below it, so the cost policy must not aim
/// below it (it did, counting from the last tool result, and judged compactions to pay
/// that could cut only a sliver of a Claude Code session).
#[test]
fn what_every_plan_keeps_is_the_final_turn_from_the_last_ask() {
    let bulky = "fn main() { println!(\"the harbour\"); }\n".repeat(40);
    let mut messages = Vec::new();
    for n in 0..10 {
        messages.push(serde_json::json!({"role": "user", "content": format!("Question {n}?")}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("Answer {n}.")}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "Fix the build."}));
    for n in 0..8 {
        let id = format!("toolu_{n}");
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "read", "input": {}}]}));
        messages.push(serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": bulky}]}));
    }
    let body = serde_json::json!({"model": "m", "max_tokens": 100, "system": "Be brief.",
        "messages": messages})
    .to_string();
    let parsed = crate::formats::messages::parse(body.as_bytes()).unwrap();
    let (controls, credentials) = (Default::default(), Default::default());
    let turn = Turn {
        format: Format::Messages,
        ..chat_turn(&parsed.items, &body, (&controls, &credentials), false)
    };
    let estimator = Estimator::for_model_ready("m");
    let ask = parsed.items.iter().rposition(|m| m.is_ask()).unwrap();
    let final_turn: u64 = parsed.items[ask..]
        .iter()
        .map(|m| estimator.message(m))
        .sum();
    let head: u64 = parsed.items[..ask]
        .iter()
        .take_while(|m| m.is_instruction())
        .map(|m| estimator.message(m))
        .sum();
    let kept = essential(&turn);
    assert!(kept > final_turn, "{kept} ≤ {final_turn}");
    assert!(
        kept <= final_turn + head + 50,
        "{kept}: the head and the final turn, no more"
    );
}

#[test]
fn the_ratio_follows_what_the_provider_counts_for_appended_turns() {
    let record = |tokens, ratio_permille, growth| {
        Some(Record {
            tokens,
            ratio_permille,
            applied: None,
            growth,
        })
    };
    assert_eq!(next_ratio(None, None, 100, 1_000), 1000);
    // The provider counted 130 for an estimate of 100, a turn as large as the history's
    // usual one (130): half way from 1000 to 1300.
    assert_eq!(next_ratio(record(1_000, 1000, 130), None, 100, 1_130), 1150);
    // A turn of a third of the usual size moves it a quarter of the way.
    assert_eq!(next_ratio(record(1_000, 1000, 390), None, 100, 1_130), 1075);
    // Another checkpoint applied: not comparable, the old ratio stands.
    let other = Some(Record {
        applied: Some(3),
        ..record(1_000, 1200, 100).unwrap()
    });
    assert_eq!(next_ratio(other, None, 100, 1_500), 1200);
    // Clamped.
    assert_eq!(next_ratio(record(0, 4000, 100), None, 100, 100_000), 4000);
    // The history's first measure (no pace yet): half way, however large the turn, so
    // an odd first turn does not alone set the ratio later budgets are scaled by (the
    // research conversation's first turn, 1,558 ‰ where its others are ~1,290 ‰, left
    // a structured summary no room at a 4,000-token threshold).
    assert_eq!(next_ratio(record(1_000, 1000, 0), None, 1_935, 4_015), 1279);
}

/// Turns of two kinds, alternating (an agent's short prose and long tool output, which
/// the provider counts at different rates against abridge's estimate): the ratio after
/// a short turn is nearer the long turns' rate than the short ones', as their share of
/// the tokens is, so a long turn's appended tokens are scaled nearly right.
#[test]
fn alternating_turns_are_weighed_by_their_tokens() {
    let (long, short) = ((400u64, 1300u64), (100u64, 1000u64)); // (estimate, rate ‰)
    let (mut ratio, mut tokens) = (1000u32, 0u64);
    let growth = 400;
    for (estimate, rate) in [long, short].repeat(10) {
        let counted = estimate * rate / 1000;
        let record = Record {
            tokens,
            ratio_permille: ratio,
            applied: None,
            growth,
        };
        ratio = next_ratio(Some(record), None, estimate, tokens + counted);
        tokens += counted;
    }
    // After a short turn: the long turns carry 520 of every 620 tokens.
    let long_error = (i64::from(ratio) - 1300).abs();
    let short_error = (i64::from(ratio) - 1000).abs();
    assert!(long_error < short_error, "{ratio}");
}

/// What a request carries besides its items (an agent's tools and system prompt, ~20 K
/// tokens) is no part of what the strategies can condense: the calibration does not
/// count it as the items' density, and a compaction's budget for the items is what the
/// target leaves beside it.
#[test]
fn the_tools_and_system_prompt_stay_beside_the_items_budget() {
    let tools: Vec<serde_json::Value> = (0..40)
        .map(|n| {
            serde_json::json!({"type": "function", "function": {"name": format!("tool_{n}"),
            "description": "Reads the named file and returns its lines with numbers. ".repeat(8),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
        })
        .collect();
    let messages = vec![
        serde_json::json!({"role": "system", "content": "Be brief."}),
        serde_json::json!({"role": "user", "content": "Fix the build."}),
    ];
    let body = serde_json::json!({"model": "m", "messages": messages, "tools": tools}).to_string();
    let parsed = crate::formats::chat::parse(body.as_bytes()).unwrap();
    let (controls, credentials) = (Default::default(), Default::default());
    let turn = chat_turn(&parsed.messages, &body, (&controls, &credentials), false);
    let beside = beside(&turn);
    let tools_alone = crate::tokens::approx_text(&serde_json::to_string(&tools).unwrap());
    assert!(
        beside.abs_diff(tools_alone) < 20,
        "{beside} against {tools_alone}"
    );
    // A request aiming at 3,000 tokens more than what it carries besides its items: the
    // items get those (at a provider's count of twice the estimate, half as many).
    assert_eq!(items_budget(&turn, beside + 3_000, 1.0), 3_000);
    assert_eq!(items_budget(&turn, beside + 3_000, 2.0), 1_500);
    // Without a report, the prediction counts it.
    let (usage, active) = (None, None);
    assert!(predict(&turn, usage, active, 100_000).tokens > beside);
}

/// The estimate reads tool schemas lighter than a provider counts them: what the
/// provider's count leaves beside the items, at the rate the history's turns are
/// counted, is what the request carries beside them, and a compaction's floor and the
/// calibration stand on it.
#[test]
fn what_the_tools_come_to_is_learned_from_the_reports() {
    let tools: Vec<serde_json::Value> = (0..40)
        .map(|n| {
            serde_json::json!({"type": "function", "function": {"name": format!("tool_{n}"),
            "description": "Reads the named file and returns its lines. ".repeat(8)}})
        })
        .collect();
    let messages: Vec<serde_json::Value> = (0..6)
        .map(|n| match n % 2 {
            0 => serde_json::json!({"role": "user", "content": format!("Step {n}: fix the build. ").repeat(30)}),
            _ => serde_json::json!({"role": "assistant", "content": "Done; the tests pass. ".repeat(30)}),
        })
        .collect();
    let body = serde_json::json!({"model": "m", "messages": messages, "tools": tools}).to_string();
    let parsed = crate::formats::chat::parse(body.as_bytes()).unwrap();
    let (controls, credentials) = (Default::default(), Default::default());
    let key = crate::identity::IdentityKey::new(crate::secret::Secret::new("k"));
    let prefixes: Vec<_> = (0..6u8).map(|n| key.namespace(&[n], None)).collect();
    let estimated = beside(&chat_turn(
        &parsed.messages,
        &body,
        (&controls, &credentials),
        false,
    ));
    let exact = crate::tokens::Estimator::for_model_ready("m");
    let items = forwarded_estimate(&exact, Format::Chat, &parsed.messages, None);
    // The provider counts the tools at 1.5 times the estimate, the turns at 1.2.
    let record = |growth, beside| Usage {
        prefix: prefixes[5],
        messages: 6,
        tokens: estimated * 3 / 2 + scaled(items, 1.2),
        applied: None,
        head_tokens: 0,
        growth,
        ratio_permille: 1_200,
        client_tokens: 0,
        beside,
        at_ms: 0,
    };
    let beside_with = |usage: Usage| {
        let loaded = crate::store::Loaded {
            checkpoints: Vec::new(),
            usage: vec![usage],
            state: None,
        };
        let turn = Turn {
            prefixes: &prefixes,
            loaded: Some(&loaded),
            ..chat_turn(&parsed.messages, &body, (&controls, &credentials), false)
        };
        (beside(&turn), to_record(&turn))
    };
    let (learned, kept) = beside_with(record(500, 0));
    assert!(
        learned.abs_diff(estimated * 3 / 2) <= 2,
        "{learned} against {estimated}"
    );
    assert_eq!(kept, Some(learned), "what the next record keeps");
    // Averaged with what the history learned before, three to one.
    let (averaged, _) = beside_with(record(500, estimated));
    assert!(
        averaged.abs_diff(estimated * 9 / 8) <= 2,
        "{averaged} against {estimated}"
    );
    // Before the history's rate is measured (its first report), no more than estimated,
    // and nothing learned to keep.
    let (first, kept) = beside_with(record(0, 0));
    assert_eq!((first, kept), (estimated, None));
}

/// A chat request's turn with nothing known of its conversation (model `m`).
fn chat_turn<'t, 'a>(
    messages: &'t [Item<'a>],
    body: &'t str,
    (controls, credentials): (
        &'t crate::controls::Controls,
        &'t crate::headers::Credentials,
    ),
    recall_tool: bool,
) -> Turn<'t, 'a> {
    Turn {
        messages,
        prefixes: &[],
        conversation: None,
        loaded: None,
        controls,
        model: "m",
        deployment: None,
        credentials,
        provider: Default::default(),
        payer: None,
        size: body.len(),
        body: body.as_bytes(),
        request: None,
        format: Format::Chat,
        recall_tool,
        recall_always: false,
        beside: Default::default(),
        tool_prune_chars: crate::strategies::Settings::default().tool_prune_chars,
    }
}

/// OpenAI drops an earlier turn's reasoning from the prompt: a new ask since the report
/// takes the reasoning of the turn the report ended in off the prediction, and what the
/// history grew by is what the next report will count (the ratio is learned from it).
#[test]
fn a_new_ask_takes_the_reasoning_it_drops_off_the_prediction() {
    // 2,000 tokens of reasoning, as its ciphertext's length says.
    let cipher = "g".repeat(crate::tokens::REASONING_OVERHEAD_CHARS + 11_800);
    let reported = [
        serde_json::json!({"role": "user", "content": "Fix the build."}),
        serde_json::json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": cipher}),
        serde_json::json!({"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{}"}),
        serde_json::json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
    ];
    let usage = Usage {
        messages: 4,
        ..usage_at(10_000)
    };
    let exact = Estimator::for_model_ready("m");
    let (controls, credentials) = (Default::default(), Default::default());
    let predicted = |appended: Vec<serde_json::Value>| {
        let input: Vec<_> = reported.iter().cloned().chain(appended).collect();
        let body = serde_json::json!({"model": "m", "input": input}).to_string();
        let parsed = crate::formats::responses::parse(body.as_bytes()).unwrap();
        let turn = Turn {
            format: Format::Responses,
            ..chat_turn(&parsed.items, &body, (&controls, &credentials), false)
        };
        let p = predict(&turn, Some(&usage), None, 100_000);
        let added: u64 = parsed.items[4..].iter().map(|m| exact.message(m)).sum();
        let reasoning = exact.read(&parsed.items[1]);
        (
            p.tokens,
            p.appended,
            added,
            reasoning,
            parsed.items[1].dropped,
        )
    };
    // The tool loop goes on: the reasoning is still read.
    let (tokens, appended, added, reasoning, dropped) = predicted(vec![
        serde_json::json!({"type": "function_call", "call_id": "c2", "name": "exec", "arguments": "{}"}),
        serde_json::json!({"type": "function_call_output", "call_id": "c2", "output": "ok"}),
    ]);
    assert!(!dropped);
    assert!((2_000..2_100).contains(&reasoning), "{reasoning}");
    assert_eq!((tokens, appended), (10_000 + added, added));
    // A new ask: the provider drops it.
    let (tokens, appended, added, _, dropped) = predicted(vec![
        serde_json::json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}),
        serde_json::json!({"role": "user", "content": "Now the docs. ".repeat(1_000)}),
    ]);
    assert!(dropped);
    assert!(
        added > reasoning,
        "{added}: the ask outweighs what was dropped"
    );
    assert_eq!(
        (tokens, appended),
        (10_000 + added - reasoning, added - reasoning)
    );
}

#[test]
fn the_horizon_sees_a_compacted_conversation_as_the_client_sent_it() {
    let forwarded = Decided {
        action: Action::Forward,
        threshold: 60_000,
        soft: 42_000,
        predicted: 50_000,
        head_tokens: 0,
        appended: 0,
        growth: 2_000,
        pace: 2_000,
        ratio: 1.0,
        usage: Some(Usage {
            client_tokens: 150_000,
            ..usage_at(48_000)
        }),
        active: None,
        deepest: None,
        scheduled: None,
        why: None,
        expects: true,
        figures: None,
    };
    // Sent as it came: its size.
    assert_eq!(forwarded.as_the_client_sent(), 50_000);
    // Compacted: the client's last request as its record counted it, grown by a turn.
    let compacted = Decided {
        action: Action::Compact {
            budget: 20_000,
            trigger: crate::outcome::Trigger::Threshold,
        },
        ..forwarded
    };
    assert_eq!(compacted.as_the_client_sent(), 152_000);
    // Not known: past every bound.
    let unknown = Decided {
        usage: Some(usage_at(48_000)),
        ..compacted
    };
    assert_eq!(unknown.as_the_client_sent(), crate::compactor::horizon::FAR);
    let unrecorded = Decided {
        usage: None,
        ..compacted
    };
    assert_eq!(
        unrecorded.as_the_client_sent(),
        crate::compactor::horizon::FAR
    );
}

//! Plans of the strategies that need no summariser (recency, deterministic), why a
//! conversation cannot be compacted, the summary role, and plans with an exact tokenizer.

use super::*;

#[test]
fn recency_keeps_head_and_tail_and_digests_bulky_results() {
    let msgs = agentic(12, 6000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let total = e.messages(&messages);
    let budget = total / 3;
    let plan = run(
        Strategy::Recency,
        &input(&messages, budget, &e),
        &Settings::default(),
        never,
    )
    .unwrap();
    validate(&messages, &plan).unwrap();
    assert_eq!(plan.strategy, Strategy::Recency);
    assert_eq!(plan.fallback, None);
    assert!(
        plan.tokens_after <= budget && plan.tokens_after * 10 >= budget * 8,
        "{} of a {budget}-token budget: the end is kept newest first up to it",
        plan.tokens_after
    );
    assert_eq!(plan.tokens_after, forwarded_tokens(&messages, &plan, &e));
    // The latest turn's tool outputs are whole, older bulky ones digested.
    let last_big = messages.len() - 4;
    assert!(plan.through < last_big, "{plan:?}");
    assert_eq!(plan.tokens_before, total);
    // Head: the system message and the first ask. protect_head would keep the first tool
    // exchange too; the latest turns, kept whole, come first.
    assert_eq!(plan.head, 2, "{plan:?}");
    let out = forwarded_json(&messages, &plan);
    assert_eq!(out[0], msgs[0]);
    assert_eq!(out[1], msgs[1]);
    assert_eq!(out.last().unwrap(), msgs.last().unwrap());
    let marker = out[plan.head]["content"].as_str().unwrap();
    assert!(marker.starts_with(FRAME), "{marker}");
    assert!(marker.contains("earlier messages"), "{marker}");
    // The marker indexes what it elided: the latest elided ask, with its file and ticket.
    let kept_from = plan
        .origin
        .iter()
        .find_map(|o| match o {
            Origin::Verbatim(k) | Origin::Digest(k) => Some(*k),
            Origin::Authored => None,
        })
        .unwrap_or(plan.through + 1);
    let latest_elided_ask = (plan.head..kept_from)
        .rev()
        .find(|&k| msgs[k]["role"] == "user")
        .map(|k| msgs[k]["content"].as_str().unwrap())
        .unwrap();
    assert!(marker.contains(latest_elided_ask), "{marker}");
    assert_eq!(out[plan.head]["role"], "user");
    // The kept part starts with an assistant message (roles alternate around the marker).
    assert_eq!(out[plan.head + 1]["role"], "assistant", "{out:#?}");
    // Bulky tool results in the kept part are digests; unknown fields kept.
    let digests: Vec<&Value> = out
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[abridge: tool output elided]"))
        })
        .collect();
    assert!(!digests.is_empty(), "{out:#?}");
    for d in &digests {
        let c = d["content"].as_str().unwrap();
        assert!(c.contains("bash(command=\"cargo test"), "{c}");
        assert!(c.contains("exit status 1"), "{c}");
        assert!(c.contains("first line: \"running 3 tests\""), "{c}");
        assert!(d.get("x_meta").is_some());
    }
}

#[test]
fn cannot_compact_says_why() {
    let e = Estimator::approx();
    let settings = Settings::default();
    // No user message.
    let b = body(&[json!({"role": "system", "content": "s"})]);
    let m = parse(&b);
    let err = run(Strategy::Recency, &input(&m, 10, &e), &settings, never).unwrap_err();
    assert_eq!(err, CannotCompact::NoFinalTurn);
    // Nothing between head and final turn.
    let b = body(&[
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "hi"}),
    ]);
    let m = parse(&b);
    let err = run(Strategy::Recency, &input(&m, 10, &e), &settings, never).unwrap_err();
    assert_eq!(err, CannotCompact::NothingToReplace);
    // Final turn alone over the budget.
    let b = body(&[
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
        json!({"role": "user", "content": "x ".repeat(5000)}),
    ]);
    let m = parse(&b);
    for strategy in Strategy::ALL {
        match run(strategy, &input(&m, 100, &e), &settings, echo).unwrap_err() {
            CannotCompact::TooLarge { estimate, budget } => {
                assert_eq!(budget, 100);
                assert!(estimate > 1000, "{estimate}");
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn deterministic_summary_lists_what_happened() {
    let msgs = agentic(10, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let settings = Settings::default();
    let plan = run(
        Strategy::Deterministic,
        &input(&messages, budget, &e),
        &settings,
        never,
    )
    .unwrap();
    assert_eq!(
        plan.strategy,
        Strategy::Deterministic,
        "{:?}",
        plan.fallback
    );
    validate(&messages, &plan).unwrap();
    assert!(plan.tokens_after <= budget);
    let text: Value = serde_json::from_str(plan.replacement[0].get()).unwrap();
    let text = text["content"].as_str().unwrap();
    assert!(text.starts_with(FRAME));
    for want in [
        "user,",
        "Tools used: bash ×",
        "read_file ×",
        "Index of the elided messages",
        "Files and paths:",
        "src/mod_",
        "Asks, latest first:",
        "Step 9: fix the bug in src/mod_9.rs (ticket ABC-9)",
        "Identifiers, URLs, quantities:",
        "120 ms",
        "Pending work mentioned:",
        "TODO: update docs",
        "Timeline:",
        "more messages",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
    let again = run(
        Strategy::Deterministic,
        &input(&messages, budget, &e),
        &settings,
        never,
    )
    .unwrap();
    assert_eq!(again.replacement[0].get(), plan.replacement[0].get());
}

#[test]
fn summary_role_system_is_honoured() {
    let msgs = agentic(8, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let settings = Settings {
        summary_role: SummaryRole::System,
        ..Settings::default()
    };
    let plan = run(
        Strategy::Recency,
        &input(&messages, e.messages(&messages) / 2, &e),
        &settings,
        never,
    )
    .unwrap();
    let out = forwarded_json(&messages, &plan);
    assert_eq!(out[plan.head]["role"], "system");
}

#[test]
fn exact_estimator_plans_fit_too() {
    let msgs = agentic(10, 2000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::for_model("gpt-4o");
    let budget = e.messages(&messages) / 3;
    for strategy in Strategy::ALL {
        let plan = run(
            strategy,
            &input(&messages, budget, &e),
            &Settings::default(),
            echo,
        )
        .unwrap();
        validate(&messages, &plan).unwrap();
        assert_eq!(plan.strategy, strategy, "{:?}", plan.fallback);
        assert!(plan.tokens_after <= budget);
        assert_eq!(plan.tokens_after, forwarded_tokens(&messages, &plan, &e));
    }
}

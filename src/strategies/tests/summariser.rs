//! The summarising strategies (structured, llm_replace): what the summariser is asked,
//! iterative updates, and the fallbacks to recency when its answer cannot be used.

use std::cell::RefCell;

use super::*;

/// A summary a good summariser would write for `agentic`.
fn good_summary(request: &SummaryRequest) -> String {
    let ids: Vec<String> = crate::strategies::text::identifiers(&request.prompt);
    format!(
        "## Goal\nFix bugs, then write the changelog entry.\n## Constraints & Preferences\n(none)\n\
         ## Progress\n### Done\nFixed modules.\n## Key Decisions\n(none)\n## Relevant Files\n{}\n\
         ## Next Steps\nUpdate docs; changelog.\n## Critical Context\nfix the bug, tickets\n",
        ids.join(", ")
    )
}

#[test]
fn structured_summarises_the_middle_and_updates_iteratively() {
    let msgs = agentic(16, 300);
    let e = Estimator::approx();
    let settings = Settings::default();
    // First compaction on the conversation up to turn 10.
    let first_len = 1 + 5 * 10;
    let mut first = msgs[..first_len].to_vec();
    first.push(json!({"role": "user", "content": "Continue with the next module please."}));
    let b1 = body(&first);
    let m1 = parse(&b1);
    let budget = e.messages(&m1) / 2;
    let seen = RefCell::new(Vec::new());
    let summarise = |r: SummaryRequest| {
        seen.borrow_mut().push(r.clone());
        let answer = good_summary(&r);
        async move { Ok(answer) }
    };
    let plan1 = run(
        Strategy::Structured,
        &input(&m1, budget, &e),
        &settings,
        summarise,
    )
    .unwrap();
    assert_eq!(plan1.strategy, Strategy::Structured, "{:?}", plan1.fallback);
    validate(&m1, &plan1).unwrap();
    assert!(plan1.tokens_after <= budget);
    let req = seen.borrow()[0].clone();
    assert!(
        req.prompt.contains("[USER]\nStep 1: fix the bug"),
        "{}",
        req.prompt
    );
    assert!(req.prompt.contains("[TOOL CALL bash call_1_a]"));
    assert!(req.prompt.contains("[TOOL RESULT call_1_a (bash)]"));
    assert!(req.prompt.contains("## Critical Context"));
    assert!(!req.prompt.contains("PREVIOUS SUMMARY"));
    assert!(req.system.contains("never instructions"));
    let summary1 = plan1.summary.clone().unwrap();

    // The conversation goes on; the next compaction updates the summary.
    let b2 = body(&msgs);
    let m2 = parse(&b2);
    let mut inp = input(&m2, budget, &e);
    inp.previous = Some(Previous {
        head: plan1.head,
        through: plan1.through,
        replacement: &plan1.replacement,
        summary: plan1.summary.as_deref(),
    });
    let plan2 = run(Strategy::Structured, &inp, &settings, summarise).unwrap();
    assert_eq!(plan2.strategy, Strategy::Structured, "{:?}", plan2.fallback);
    validate(&m2, &plan2).unwrap();
    assert!(plan2.through >= plan1.through);
    assert_eq!(plan2.head, plan1.head);
    let req = seen.borrow()[1].clone();
    assert!(req.prompt.contains("PREVIOUS SUMMARY"));
    assert!(req.prompt.contains(summary1.trim()));
    // Only the new messages are in the transcript, and no framed summary.
    let new_part = req.prompt.split("<new-messages>").nth(1).unwrap();
    assert!(!new_part.contains("Step 1: fix"), "old messages resent");
    assert!(new_part.contains("Step 11: fix") || new_part.contains("Step 12: fix"));
    assert!(!req.prompt.contains(FRAME));
    assert_eq!(frames(&m2, &plan2), 1);
}

#[test]
fn summariser_failures_fall_back_to_recency() {
    let msgs = agentic(12, 300);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let settings = Settings::default();
    let inp = input(&messages, budget, &e);
    let sections_only = |_: SummaryRequest| async {
        Ok(
            "## Goal\nx\n## Constraints\n## Progress\n## Key Decisions\n## Relevant Files\n\
            ## Next Steps\n## Critical Context\nnothing specific"
                .to_owned(),
        )
    };
    let missing =
        |_: SummaryRequest| async { Ok("Goal: fix things. Next steps: more.".to_owned()) };
    for strategy in [Strategy::Structured, Strategy::LlmReplace] {
        type Expected = fn(&Fallback) -> bool;
        let cases: Vec<(Plan, Expected)> = vec![
            (
                run(strategy, &inp, &settings, |_| async {
                    Err(SummaryError::Status(500))
                })
                .unwrap(),
                |f| matches!(f, Fallback::Summariser(SummaryError::Status(500))),
            ),
            (
                run(strategy, &inp, &settings, |_| async {
                    Err(SummaryError::TimedOut)
                })
                .unwrap(),
                |f| matches!(f, Fallback::Summariser(SummaryError::TimedOut)),
            ),
            (
                run(strategy, &inp, &settings, |_| async {
                    Ok("  \n".to_owned())
                })
                .unwrap(),
                |f| matches!(f, Fallback::EmptySummary),
            ),
            (run(strategy, &inp, &settings, missing).unwrap(), |f| {
                matches!(f, Fallback::Fidelity(Fidelity::MissingSections(_)))
            }),
            (
                run(strategy, &inp, &settings, sections_only).unwrap(),
                |f| matches!(f, Fallback::Fidelity(Fidelity::Identifiers { .. })),
            ),
        ];
        for (plan, expected) in cases {
            let fallback = plan.fallback.as_ref().expect("a fallback");
            assert!(expected(fallback), "{strategy}: {fallback}");
            assert!(!fallback.to_string().is_empty());
            assert_eq!(plan.requested, strategy);
            assert_eq!(plan.strategy, Strategy::Recency);
            validate(&messages, &plan).unwrap();
            assert!(plan.tokens_after <= budget);
        }
        let ok = run(strategy, &inp, &settings, |r| {
            let s = good_summary(&r);
            async move { Ok(s) }
        })
        .unwrap();
        assert_eq!(ok.strategy, strategy, "{:?}", ok.fallback);
    }
}

#[test]
fn latest_ask_must_be_reflected() {
    let mut msgs = agentic(8, 100);
    // The latest request before the final turn.
    msgs[1 + 5 * 7] =
        json!({"role": "user", "content": "Please migrate the database schema to PostgreSQL"});
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let inp = input(&messages, budget, &e);
    // Sections and identifiers, but nothing of the latest request.
    let plan = run(Strategy::LlmReplace, &inp, &Settings::default(), |r| {
        let s = good_summary(&r);
        async move { Ok(s) }
    })
    .unwrap();
    assert_eq!(
        plan.fallback,
        Some(Fallback::Fidelity(Fidelity::LatestAsk)),
        "{:?}",
        plan.fallback
    );
}

#[test]
fn llm_replace_keeps_only_the_final_turn_and_the_answer_before_it() {
    let msgs = agentic(8, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages);
    let plan = run(
        Strategy::LlmReplace,
        &input(&messages, budget, &e),
        &Settings::default(),
        |r| {
            let s = good_summary(&r);
            async move { Ok(s) }
        },
    )
    .unwrap();
    assert_eq!(plan.strategy, Strategy::LlmReplace, "{:?}", plan.fallback);
    let out = forwarded_json(&messages, &plan);
    let n = out.len();
    assert_eq!(out[n - 1], *msgs.last().unwrap());
    assert_eq!(out[n - 2], msgs[msgs.len() - 2]);
    assert_eq!(out[n - 2]["role"], "assistant");
    assert_eq!(out[n - 3]["role"], "user");
    assert!(out[n - 3]["content"].as_str().unwrap().starts_with(FRAME));
    assert_eq!(plan.head, 5);
}

#[test]
fn transcript_truncates_and_redacts() {
    let secret = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX";
    let mut msgs = agentic(6, 100);
    msgs[7] = json!({"role": "user", "content": format!("my key is {secret}; {}END", "y".repeat(20_000))});
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let seen = RefCell::new(None);
    let _ = run(
        Strategy::Structured,
        &input(&messages, budget, &e),
        &Settings::default(),
        |r: SummaryRequest| {
            *seen.borrow_mut() = Some(r);
            async { Err(SummaryError::TimedOut) }
        },
    )
    .unwrap();
    let prompt = seen.borrow().clone().unwrap().prompt;
    assert!(!prompt.contains(secret));
    assert!(prompt.contains("my key is [REDACTED]"));
    assert!(prompt.contains("characters omitted"));
    assert!(prompt.contains("yyyEND"));
    assert!(!prompt.contains(&"y".repeat(7_600)));
}

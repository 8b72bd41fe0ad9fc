//! A final turn that does not fit whole: recency digests the results in it the model
//! has acted on since (the ask, every call and the newest exchange stay as they came),
//! the smallest plan says so, and the validator holds plans to exactly that.

use super::*;

/// An agent's single long turn: system, the first ask and its answer, then the final
/// ask and `rounds` tool rounds of `chars`-character results, each read by the next.
fn one_long_turn(rounds: usize, chars: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Look at the repository."}),
        json!({"role": "assistant", "content": "It is a Rust crate with a CLI in src/main.rs."}),
        json!({"role": "user", "content": "Fix every failing test (ticket ABC-7)."}),
    ];
    for r in 0..rounds {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{r}"), "type": "function", "function": {"name": "bash",
             "arguments": json!({"command": format!("cargo test part_{r}")}).to_string()}}]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{r}"),
            "content": format!("running part_{r}\n{}\nexit code: 1", "failed ".repeat(chars / 7))}));
    }
    m
}

/// `messages` compacted by `strategy` to `budget` (approximate estimates, default
/// settings; the summariser echoes).
fn compacted(
    strategy: Strategy,
    messages: &[Item<'_>],
    budget: u64,
) -> Result<Plan, CannotCompact> {
    let e = Estimator::approx();
    run(
        strategy,
        &input(messages, budget, &e),
        &Settings::default(),
        echo,
    )
}

#[test]
fn a_final_turn_over_the_budget_keeps_its_ask_calls_and_newest_exchange_and_digests_the_rest() {
    let msgs = one_long_turn(8, 8000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let ask = 3;
    let final_turn = e.messages(&messages[ask..]);
    // Room for the head, the ask, the calls, a few results whole and the rest digested.
    let budget = final_turn / 2;
    let plan = compacted(Strategy::Recency, &messages, budget).unwrap();
    validate(&messages, &plan).unwrap();
    assert!(
        plan.tokens_after <= budget,
        "{} > {budget}",
        plan.tokens_after
    );
    assert_eq!(plan.tokens_after, forwarded_tokens(&messages, &plan, &e));
    let out = forwarded_json(&messages, &plan);
    // Everything of the final turn is there, in order: the ask and the calls as they
    // came, the oldest results digested, the newest whole.
    let sent = &out[out.len() - (msgs.len() - ask)..];
    assert_eq!(sent[0], msgs[ask]);
    let mut digested = Vec::new();
    for (k, (sent, original)) in sent.iter().zip(&msgs[ask..]).enumerate() {
        if original["role"] == "tool" {
            assert_eq!(sent["tool_call_id"], original["tool_call_id"]);
            if sent != original {
                let text = sent["content"].as_str().unwrap();
                assert!(
                    text.starts_with("[abridge: tool output elided] bash("),
                    "{text}"
                );
                digested.push(k);
            }
        } else {
            assert_eq!(sent, original);
        }
    }
    assert!(!digested.is_empty(), "nothing was cleared: {plan:?}");
    let results = msgs.len() - ask - 1;
    assert!(
        digested.len() < results / 2,
        "{digested:?}: more than needed"
    );
    // The oldest first, and never the newest exchange.
    assert_eq!(
        digested,
        (0..digested.len()).map(|i| 2 + 2 * i).collect::<Vec<_>>()
    );
    assert_eq!(out.last().unwrap(), msgs.last().unwrap());
    assert!(plan.through < messages.len() - 2, "{plan:?}");
}

#[test]
fn a_final_turn_that_fits_whole_is_not_touched() {
    let msgs = one_long_turn(8, 8000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let final_turn = e.messages(&messages[3..]);
    let plan = compacted(Strategy::Recency, &messages, final_turn + 200).unwrap();
    assert!(plan.through < 3, "{plan:?}");
    let out = forwarded_json(&messages, &plan);
    assert_eq!(out[out.len() - (msgs.len() - 3)..], msgs[3..]);
}

#[test]
fn the_smallest_plan_clears_all_but_the_newest_exchange() {
    let msgs = one_long_turn(8, 8000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let settings = Settings::default();
    let kept = essential(&input(&messages, 0, &e), &settings).unwrap();
    let newest = e.messages(&messages[messages.len() - 2..]);
    let whole = e.messages(&messages[3..]);
    assert!(
        kept > newest && kept < whole / 4,
        "{kept}: {newest} .. {whole}"
    );
    // Below it, nothing can be made, and the error says what the smallest plan takes.
    let err = compacted(Strategy::Recency, &messages, kept / 2).unwrap_err();
    let CannotCompact::TooLarge { estimate, .. } = err else {
        panic!("{err:?}");
    };
    assert!(
        estimate >= kept && estimate < kept + 200,
        "{estimate} against {kept}"
    );
    let plan = compacted(Strategy::Recency, &messages, estimate).unwrap();
    let digests = plan
        .origin
        .iter()
        .filter(|o| matches!(o, Origin::Digest(_)))
        .count();
    assert_eq!(digests, 7, "{plan:?}");
}

#[test]
fn a_digest_beside_a_final_turn_that_does_not_fit_whole_clears_only_what_it_must() {
    let msgs = one_long_turn(8, 8000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let whole = e.messages(&messages[3..]);
    for (strategy, budget) in [
        (Strategy::Deterministic, whole / 2),
        (Strategy::Deterministic, whole * 9 / 10),
    ] {
        let plan = compacted(strategy, &messages, budget).unwrap();
        validate(&messages, &plan).unwrap();
        assert_eq!(
            (plan.strategy, &plan.fallback),
            (strategy, &None),
            "{plan:?}"
        );
        assert!(plan.tokens_after <= budget, "{strategy}: {plan:?}");
        let cleared: Vec<usize> = plan
            .origin
            .iter()
            .filter_map(|o| match *o {
                Origin::Digest(k) if k > 3 => Some(k),
                _ => None,
            })
            .collect();
        // The oldest results first, and no more than the budget needs: one result fewer
        // cleared would not fit.
        assert!(!cleared.is_empty() && cleared.len() < 7, "{cleared:?}");
        assert_eq!(
            cleared,
            (0..cleared.len()).map(|i| 5 + 2 * i).collect::<Vec<_>>()
        );
        let last = *cleared.last().unwrap();
        let saved_by_last = e.message(&messages[last])
            - plan
                .origin
                .iter()
                .position(|o| *o == Origin::Digest(last))
                .map(|at| e.message(&plan.format.item(Raw::from(&*plan.replacement[at])).unwrap()))
                .unwrap();
        assert!(
            plan.tokens_after + saved_by_last > budget,
            "{strategy}: cleared more than needed"
        );
    }
    // A summary does not clear: it falls back to recency, which does (and pays for no
    // summary that would stop short of its range).
    let plan = compacted(Strategy::Structured, &messages, whole / 2).unwrap();
    assert_eq!(plan.strategy, Strategy::Recency);
    assert!(
        matches!(plan.fallback, Some(Fallback::OverBudget { .. })),
        "{plan:?}"
    );
    assert!(
        plan.origin
            .iter()
            .any(|o| matches!(o, Origin::Digest(k) if *k > 3))
    );
}

#[test]
fn the_validator_holds_a_range_into_the_final_turn_to_copies_and_earlier_digests() {
    let msgs = one_long_turn(8, 8000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages[3..]) / 2;
    let good = compacted(Strategy::Recency, &messages, budget).unwrap();
    validate(&messages, &good).unwrap();
    let at = |p: &Plan, k: usize| p.origin.iter().position(|o| *o == Origin::Verbatim(k));
    // A message of the final turn left out.
    let mut dropped = good.clone();
    let call = at(&dropped, 4).unwrap();
    dropped.replacement.remove(call);
    dropped.origin.remove(call);
    assert!(matches!(
        validate(&messages, &dropped),
        Err(Violation::FinalTurn { .. } | Violation::ToolPair { .. })
    ));
    // The ask written over by abridge.
    let mut authored_ask = good.clone();
    let ask = at(&authored_ask, 3).unwrap();
    authored_ask.origin.remove(ask);
    authored_ask.replacement.remove(ask);
    assert!(matches!(
        validate(&messages, &authored_ask),
        Err(Violation::FinalTurn { .. })
    ));
    // The newest exchange in the range.
    let mut newest = good.clone();
    let n = messages.len();
    for (k, message) in messages.iter().enumerate().skip(good.through + 1) {
        newest.replacement.push(message.raw.to_boxed().unwrap());
        newest.origin.push(Origin::Verbatim(k));
    }
    newest.through = n - 1;
    assert!(matches!(
        validate(&messages, &newest),
        Err(Violation::FinalTurn { .. })
    ));
}

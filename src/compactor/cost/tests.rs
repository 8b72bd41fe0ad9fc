//! The cost model on cases worked out by hand (prices: list prices in dollars per
//! million tokens, i.e. millionths of a dollar per token).

use super::*;

/// Claude Sonnet: input 3, cache read 0.3, cache write 3.75, output 15.
const SONNET: Rates = Rates {
    input: 3.0,
    cached: 0.3,
    write: 3.75,
    output: 15.0,
};
/// gpt-5: input 1.25, cached 0.125, writes cost what input costs, output 10.
const GPT5: Rates = Rates {
    input: 1.25,
    cached: 0.125,
    write: 1.25,
    output: 10.0,
};

/// A 100,000-token request (20,000 of it the head), growing 2,000 a request, 20 to
/// come, compacted to 30,000.
fn outlook(remaining: u64, cold: bool) -> Outlook {
    Outlook {
        prompt: 100_000,
        head: 20_000,
        growth: 2_000,
        remaining,
        cold,
    }
}

/// A 75,000-token threshold in a 200,000-token window (compacted whatever it costs over
/// 196,000; the horizon bounded at 180,000).
const BOUNDS: Bounds = Bounds {
    threshold: 75_000,
    chosen: false,
    fits: 196_000,
    must: 180_000,
    early: 52_500,
    deep: true,
};

const NONE: Summary = Summary {
    input: 0,
    output: 0,
};

#[test]
fn a_deep_cut_pays_back_what_its_new_prefix_costs() {
    // Later: 19 requests × 0.3 × 70,000 = 399,000. Now: 0.3 × 80,000 (the old prefix
    // not read) − 3.75 × 10,000 (the new one written) = −13,500.
    assert_eq!(net(&outlook(20, false), &SONNET, 30_000, NONE), 385_500.0);
    // One request to come: only the expense.
    assert_eq!(net(&outlook(1, false), &SONNET, 30_000, NONE), -13_500.0);
    assert_eq!(
        break_even(&outlook(20, false), &SONNET, 30_000, NONE),
        Some(2)
    );
    // OpenAI: 19 × 0.125 × 70,000 + 0.125 × 80,000 − 1.25 × 10,000.
    assert_eq!(net(&outlook(20, false), &GPT5, 30_000, NONE), 163_750.0);
}

#[test]
fn a_summary_is_paid_before_the_saving_and_moves_the_break_even() {
    // 70,000 tokens of transcript at 3, 2,000 of summary at 15: 240,000.
    let summary = Summary {
        input: 70_000,
        output: 2_000,
    };
    assert_eq!(
        net(&outlook(20, false), &SONNET, 30_000, summary),
        145_500.0
    );
    // (n − 1) × 21,000 − 13,500 − 240,000 > 0 from n = 14.
    assert_eq!(
        break_even(&outlook(20, false), &SONNET, 30_000, summary),
        Some(14)
    );
    // A shallow cut (to 90,000) saves 3,000 a request against 0.3 × 80,000 − 3.75 ×
    // 70,000 − 240,000 = −478,500 now: paid back after 161 requests.
    assert_eq!(
        break_even(&outlook(20, false), &SONNET, 90_000, summary),
        Some(161)
    );
}

#[test]
fn a_compaction_that_pays_back_only_on_the_last_expected_request_is_not_made() {
    let bounds = BOUNDS;
    let summary = Summary {
        input: 70_000,
        output: 2_000,
    };
    // It pays back on the 14th request (above): with 14 expected, the last one is all
    // it would save, and a conversation that ends a request early loses; with 15, it
    // pays with one to spare.
    let judged = |remaining| {
        judge(
            &outlook(remaining, false),
            &bounds,
            &SONNET,
            30_000,
            summary,
        )
    };
    assert_eq!(judged(14), Some(Why::NotWorthIt));
    assert_eq!(judged(15), Some(Why::Pays));
    // A compaction that pays in the request it is made on needs no other.
    let near = Outlook {
        prompt: 189_000,
        growth: 30_000,
        ..outlook(1, false)
    };
    assert_eq!(
        judge(&near, &bounds, &SONNET, 30_000, NONE),
        Some(Why::Pays)
    );
}

#[test]
fn on_a_cold_cache_a_compaction_costs_nearly_nothing_more() {
    // The whole prompt is written again either way: 3.75 × 70,000 saved at once.
    assert_eq!(net(&outlook(1, true), &SONNET, 30_000, NONE), 262_500.0);
    assert_eq!(net(&outlook(20, true), &SONNET, 30_000, NONE), 661_500.0);
}

#[test]
fn under_the_threshold_a_deep_cut_is_made_where_it_pays() {
    let bounds = BOUNDS;
    let judge = |o: Outlook, b: &Bounds, r: &Rates| judge(&o, b, r, 30_000, NONE);
    // Under the threshold, past the soft one: compacted when it pays — a cold cache
    // makes it pay at once, a warm one over the requests to come — and else nothing.
    let under = Outlook {
        prompt: 60_000,
        ..outlook(20, false)
    };
    assert_eq!(judge(under, &bounds, &SONNET), Some(Why::Pays));
    let ending = Outlook {
        remaining: 2,
        ..under
    };
    assert_eq!(judge(ending, &bounds, &SONNET), None, "{ending:?}");
    let cold = Outlook {
        cold: true,
        ..ending
    };
    assert_eq!(judge(cold, &bounds, &SONNET), Some(Why::CacheCold));
    let small = Outlook {
        prompt: 40_000,
        ..cold
    };
    assert_eq!(
        judge(small, &bounds, &SONNET),
        None,
        "under the soft threshold"
    );
    // …and only where the cut is deep: a shallow one would be made again a few requests
    // later (a small window: nothing is weighed early).
    let shallow = Bounds {
        deep: false,
        ..bounds
    };
    assert_eq!(judge(cold, &shallow, &SONNET), None, "a shallow cut, early");
    assert_eq!(
        judge(outlook(1, true), &shallow, &SONNET),
        Some(Why::CacheCold)
    );
}

#[test]
fn the_judge_compacts_for_the_window_the_operator_and_the_money_only() {
    let bounds = BOUNDS;
    let judge = |o: Outlook, b: &Bounds, r: &Rates| judge(&o, b, r, 30_000, NONE);
    assert_eq!(judge(outlook(20, false), &bounds, &SONNET), Some(Why::Pays));
    assert_eq!(
        judge(outlook(1, false), &bounds, &SONNET),
        Some(Why::NotWorthIt)
    );
    assert_eq!(
        judge(outlook(1, true), &bounds, &SONNET),
        Some(Why::CacheCold)
    );
    // The window: whatever it costs.
    let full = Outlook {
        prompt: 197_000,
        ..outlook(1, false)
    };
    assert_eq!(judge(full, &bounds, &SONNET), Some(Why::Window));
    // A request the provider takes is judged by what it costs, however fast it grew to
    // it: the agent compacts itself near its window, and one that does not fit is
    // retried compacted. (Here, with a small head kept, it pays in one request.)
    let near = Outlook {
        prompt: 189_000,
        growth: 30_000,
        ..outlook(1, false)
    };
    assert_eq!(judge(near, &bounds, &SONNET), Some(Why::Pays));
    // The operator's threshold: a bound they chose.
    let chosen = Bounds {
        chosen: true,
        ..bounds
    };
    assert_eq!(
        judge(outlook(1, false), &chosen, &SONNET),
        Some(Why::Threshold)
    );
    // A local model priced at zero: the window and the operator's bound only.
    let free = Rates {
        input: 0.0,
        cached: 0.0,
        write: 0.0,
        output: 0.0,
    };
    assert_eq!(
        judge(outlook(20, false), &bounds, &free),
        Some(Why::NotWorthIt)
    );
    assert_eq!(judge(full, &bounds, &free), Some(Why::Window));
}

#[test]
fn a_conversation_is_expected_to_go_on_about_as_long_as_it_has() {
    let far = u64::MAX;
    assert_eq!(remaining(0, 100_000, 2_000, far), MIN_REMAINING);
    assert_eq!(remaining(37, 100_000, 2_000, far), 37);
    assert_eq!(remaining(5_000, 100_000, 2_000, far), MAX_REMAINING);
}

#[test]
fn no_further_than_where_it_is_compacted_anyway() {
    // At 150,000 tokens growing 2,000 a request, a bound at 165,000 comes in 7.5
    // requests: this one and 7 more.
    assert_eq!(remaining(37, 150_000, 2_000, 165_000), 8);
    // Past the bound (or at it): this request only.
    assert_eq!(remaining(37, 170_000, 2_000, 165_000), 1);
    assert_eq!(remaining(37, 165_000, 2_000, 165_000), 1);
    // Not growing: the bound never comes, the prior stands.
    assert_eq!(remaining(37, 150_000, 0, 165_000), 37);
    // Below the fewest expected when the bound is that close.
    assert_eq!(remaining(37, 160_000, 2_000, 165_000), 3);
}

#[test]
fn a_compaction_that_pays_over_the_prior_does_not_before_the_bound() {
    // 150,000 tokens, 20,000 of them the head, on Opus 4.5 prices (cached 0.5, write
    // 6.25), the recall tool added (nothing stays cached), to 60,000: it pays back
    // after about 8 requests.
    let o = Outlook {
        prompt: 150_000,
        head: 0,
        growth: 2_000,
        remaining: 0,
        cold: false,
    };
    let opus = Rates {
        input: 5.0,
        cached: 0.5,
        write: 6.25,
        output: 25.0,
    };
    assert_eq!(break_even(&o, &opus, 60_000, NONE), Some(8));
    let at = |remaining| Outlook { remaining, ..o };
    // Thirty requests made: thirty expected, it pays.
    assert!(
        net(
            &at(remaining(30, 150_000, 2_000, u64::MAX)),
            &opus,
            60_000,
            NONE
        ) > 0.0
    );
    // But the tenant's conversations end near 158,000: five more, it does not.
    assert!(
        net(
            &at(remaining(30, 150_000, 2_000, 158_000)),
            &opus,
            60_000,
            NONE
        ) < 0.0
    );
}

#[test]
fn the_two_totals_differ_by_what_a_compaction_nets() {
    for (n, cold) in [(1, false), (20, false), (1, true), (20, true)] {
        let o = outlook(n, cold);
        let (as_is, compacted) = totals(&o, &SONNET, 30_000, NONE);
        let net = net(&o, &SONNET, 30_000, NONE);
        assert!((as_is - compacted - net).abs() < 1e-6 * as_is, "{n} {cold}");
        assert!(as_is > 0.0 && compacted > 0.0);
    }
    // One request ahead, warm: compacting costs more (the rewrite) — the compacted
    // total is the larger.
    // As it is: 0.3 × 100,000 + 3.75 × 2,000; compacted: 0.3 × 20,000 (the head) +
    // 3.75 × (10,000 + 2,000).
    let (as_is, compacted) = totals(&outlook(1, false), &SONNET, 30_000, NONE);
    assert_eq!((as_is, compacted), (37_500.0, 51_000.0));
}

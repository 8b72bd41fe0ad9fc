//! Tests of the cost policy's weighing: what is built ahead, and when.

use super::*;

/// What a build ahead is weighed with: Claude Opus 4.5's prices a token (millionths of
/// a dollar), a 200,000-token window, a summarising strategy, nothing learned.
fn opus() -> Economics {
    Economics {
        rates: cost::Rates {
            input: 5.0,
            cached: 0.5,
            write: 6.25,
            output: 25.0,
        },
        window: 200_000,
        summarises: true,
        now_ms: 0,
        ends: Vec::new(),
    }
}

/// The default threshold of a 200,000-token window, and where the window compacts.
const OPUS_BOUNDS: cost::Bounds = cost::Bounds {
    threshold: 150_000,
    chosen: false,
    fits: 196_000,
    must: 180_000,
    early: 105_000,
    deep: true,
};

#[test]
fn a_burst_does_not_make_a_threshold_look_near() {
    // Where the tenant's conversations went on past the window's bound (abridge
    // compacted them), a summary at the threshold pays at 500 tokens a request, in a
    // conversation of 60 requests: 60 expected there, and it pays back within half
    // of them (at 1,000 a request, 30, it would pay back only after 20: no build ahead).
    let b = OPUS_BOUNDS;
    let e = Economics {
        ends: vec![crate::compactor::horizon::FAR],
        ..opus()
    };
    // 110,000 tokens, 32,000 of them the latest turn's (a pasted log).
    let outlook = cost::Outlook {
        prompt: 110_000,
        head: 0,
        growth: 500,
        remaining: 20,
        cold: false,
    };
    assert!(
        expects(&e, (&outlook, &b), (60, 32_000, false), 60_000),
        "at the burst's pace the threshold is two requests away"
    );
    // Its pace is 1,200 a request: the threshold is 34 requests away.
    assert!(!expects(&e, (&outlook, &b), (60, 1_200, false), 60_000));
    let near = cost::Outlook {
        prompt: 145_000,
        ..outlook
    };
    assert!(expects(&e, (&near, &b), (60, 1_200, false), 60_000));
    // A history's first growth is trusted for two requests: 64,000 tokens.
    let first = cost::Outlook {
        prompt: 80_000,
        ..outlook
    };
    assert!(!expects(&e, (&first, &b), (60, 32_000, true), 60_000));
    assert!(expects(&e, (&first, &b), (60, 32_000, false), 60_000));
}

#[test]
fn over_the_threshold_where_compacting_does_not_pay_nothing_is_built_for_later() {
    let (e, b) = (opus(), OPUS_BOUNDS);
    // 162,000 tokens at 600 a request, 80 made: 5 requests left before the horizon.
    let outlook = cost::Outlook {
        prompt: 162_000,
        head: 0,
        growth: 600,
        remaining: cost::remaining(80, 162_000, 600, 165_000),
        cold: false,
    };
    let target = 60_000;
    let now = summary(&e, target, outlook.prompt);
    assert_eq!(
        cost::judge(&outlook, &b, &e.rates, target, now),
        Some(Why::NotWorthIt)
    );
    assert!(!expects(&e, (&outlook, &b), (80, 600, false), target));
    // Just under the threshold, slower, with more of the conversation ahead (50
    // requests there), it would pay back within half of them.
    let under = cost::Outlook {
        prompt: 149_000,
        growth: 300,
        remaining: cost::remaining(80, 149_000, 300, 165_000),
        ..outlook
    };
    assert!(expects(&e, (&under, &b), (80, 300, false), target));
    // At 600 a request, 25 there: it would not pay back within half of them, so
    // nothing is built ahead (the crossing request is weighed on its own).
    let faster = cost::Outlook {
        prompt: 149_000,
        remaining: cost::remaining(80, 149_000, 600, 165_000),
        ..outlook
    };
    assert!(!expects(&e, (&faster, &b), (80, 600, false), target));
}

//! Every strategy's plan for a client's conversation, at a budget the input chooses,
//! with a summariser that answers what the input says (a good summary, a cut one, an
//! empty one, a failure): a plan always passes the validator and fits the budget, or
//! compaction says why it cannot; a stored checkpoint of it forwards exactly the plan.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use abridge::formats::Format;
use abridge::strategies::{self, Inline, Input, Settings, Strategy, SummaryError, SummaryRequest};
use abridge::tokens::Estimator;
use libfuzzer_sys::fuzz_target;

/// Runs a future that never waits (the summariser and the CPU bound here are ready at
/// once).
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let Ok(parsed) = abridge::formats::chat::parse(body) else {
        return;
    };
    let messages = &parsed.messages;
    let estimator = Estimator::approx();
    let total = estimator.messages(messages);
    // A budget from a tenth to the whole of the conversation.
    let budget = total * u64::from(control % 10 + 1) / 10;
    let input = Input {
        messages,
        budget,
        previous: None,
        focus: None,
        estimator: &estimator,
        format: Format::Chat,
        summary_window: None,
        summary_ratio: None,
    };
    let answer = control >> 4;
    let summarise = |request: SummaryRequest| {
        let reply = match answer % 4 {
            0 => Ok(format!("## Goal\n{}\n## Next Steps\ncontinue", &request.prompt[..request.prompt.len().min(64)])),
            1 => Ok("## Goal\nthe user wants the parser fixed and the tests to pa".to_owned()),
            2 => Ok(String::new()),
            _ => Err(SummaryError::Status(500)),
        };
        async move { reply }
    };
    for strategy in Strategy::ALL {
        let Ok(plan) = now(strategies::compact(strategy, &input, &Settings::default(), summarise, &Inline)) else {
            continue;
        };
        assert_eq!(strategies::validate(messages, &plan), Ok(()), "{strategy}");
        assert!(plan.tokens_after <= budget, "{strategy}: {} > {budget}", plan.tokens_after);
        assert_eq!(plan.replacement.len(), plan.origin.len());
        let forwarded = plan.forwarded(messages);
        assert_eq!(
            forwarded.len(),
            messages.len() - plan.messages_replaced + plan.replacement.len()
        );
    }
});

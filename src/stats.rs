//! Counters of what abridge did, readable without locks from any request.
//!
//! Plain relaxed atomics: each is an independent tally, nothing is derived from two of
//! them at once. The admin API and metrics (a later issue) read [`Stats::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::compact::Strategy;
use crate::relay::{End, Outcome};

/// What started a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A request predicted over the hard threshold.
    Threshold,
    /// `x-abridge-compact: force`.
    Forced,
    /// The provider answered "context length exceeded"; compacted and retried.
    Retry,
    /// Prepared after a response over the soft threshold.
    Background,
}

impl Trigger {
    pub const ALL: [Trigger; 4] = [
        Trigger::Threshold,
        Trigger::Forced,
        Trigger::Retry,
        Trigger::Background,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Threshold => "threshold",
            Trigger::Forced => "forced",
            Trigger::Retry => "retry",
            Trigger::Background => "background",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

fn strategy_index(s: Strategy) -> usize {
    match s {
        Strategy::Deterministic => 0,
        Strategy::Recency => 1,
        Strategy::Structured => 2,
        Strategy::LlmReplace => 3,
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    chat_requests: AtomicU64,
    unparseable_bodies: AtomicU64,
    identified: AtomicU64,
    store_unavailable: AtomicU64,
    usage_requested: AtomicU64,
    usage_reports: AtomicU64,
    prompt_tokens_reported: AtomicU64,
    completion_tokens_reported: AtomicU64,
    usage_unreadable: AtomicU64,
    stripped_events: AtomicU64,
    upstream_errors: AtomicU64,
    client_gone: AtomicU64,
    idle_timeouts: AtomicU64,
    /// By strategy × trigger.
    compactions: [[AtomicU64; 4]; 4],
    estimated_tokens_before: AtomicU64,
    estimated_tokens_after: AtomicU64,
    checkpoints_applied: AtomicU64,
    summary_calls: AtomicU64,
    summary_failures: AtomicU64,
    fallbacks: AtomicU64,
    retries: AtomicU64,
    anti_thrash: AtomicU64,
    observed: AtomicU64,
    waited_for_peer: AtomicU64,
    background_dropped: AtomicU64,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Requests received on `/v1`.
    pub requests: u64,
    /// Of which chat completions.
    pub chat_requests: u64,
    /// Chat bodies abridge could not parse and forwarded untouched.
    pub unparseable_bodies: u64,
    /// Chat requests recognised as (part of) a conversation.
    pub identified: u64,
    /// Chat requests that went on without conversation state because the store failed.
    pub store_unavailable: u64,
    /// Streaming requests where abridge added `stream_options.include_usage`.
    pub usage_requested: u64,
    /// Responses whose usage abridge read.
    pub usage_reports: u64,
    pub prompt_tokens_reported: u64,
    pub completion_tokens_reported: u64,
    /// Responses whose encoding abridge could not decode to read usage.
    pub usage_unreadable: u64,
    /// Usage-only SSE events removed because the client had not asked for them.
    pub stripped_events: u64,
    /// Upstream unreachable, timed out, or failed mid-body.
    pub upstream_errors: u64,
    /// Responses the client stopped reading before the end (upstream cancelled).
    pub client_gone: u64,
    /// Streams cut after `timeouts.stream_idle_ms` of silence.
    pub idle_timeouts: u64,
    /// Compactions run, by strategy then trigger (see [`Snapshot::compactions_by`]).
    pub compactions: [[u64; 4]; 4],
    /// Estimated prompt tokens before and after, summed over compactions run.
    pub estimated_tokens_before: u64,
    pub estimated_tokens_after: u64,
    /// Requests forwarded with a checkpoint applied.
    pub checkpoints_applied: u64,
    pub summary_calls: u64,
    pub summary_failures: u64,
    /// Summarising strategies that fell back to recency.
    pub fallbacks: u64,
    /// Requests compacted and retried after "context length exceeded".
    pub retries: u64,
    /// Conversations whose compaction was suspended (anti-thrash).
    pub anti_thrash: u64,
    /// Observe mode: requests that would have been compacted.
    pub observed: u64,
    /// Requests that waited for another request's (or replica's) summary.
    pub waited_for_peer: u64,
    /// Background compactions dropped because the queue was full.
    pub background_dropped: u64,
}

impl Snapshot {
    /// Compactions run with `strategy` for `trigger`.
    pub fn compactions_by(&self, strategy: Strategy, trigger: Trigger) -> u64 {
        self.compactions[strategy_index(strategy)][trigger.index()]
    }

    /// Compactions run, all strategies and triggers.
    pub fn compactions_total(&self) -> u64 {
        self.compactions.iter().flatten().sum()
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    pub fn request(&self, chat: bool) {
        add(&self.requests, 1);
        if chat {
            add(&self.chat_requests, 1);
        }
    }

    pub fn unparseable(&self) {
        add(&self.unparseable_bodies, 1);
    }

    pub fn identified(&self) {
        add(&self.identified, 1);
    }

    pub fn store_unavailable(&self) {
        add(&self.store_unavailable, 1);
    }

    pub fn usage_requested(&self) {
        add(&self.usage_requested, 1);
    }

    pub fn upstream_error(&self) {
        add(&self.upstream_errors, 1);
    }

    pub fn compaction(&self, strategy: Strategy, trigger: Trigger, before: u64, after: u64) {
        add(
            &self.compactions[strategy_index(strategy)][trigger.index()],
            1,
        );
        add(&self.estimated_tokens_before, before);
        add(&self.estimated_tokens_after, after);
    }

    pub fn checkpoint_applied(&self) {
        add(&self.checkpoints_applied, 1);
    }

    pub fn summary_call(&self) {
        add(&self.summary_calls, 1);
    }

    pub fn summary_failure(&self) {
        add(&self.summary_failures, 1);
    }

    pub fn fallback(&self) {
        add(&self.fallbacks, 1);
    }

    pub fn retry(&self) {
        add(&self.retries, 1);
    }

    pub fn anti_thrash(&self) {
        add(&self.anti_thrash, 1);
    }

    pub fn observed(&self) {
        add(&self.observed, 1);
    }

    pub fn waited_for_peer(&self) {
        add(&self.waited_for_peer, 1);
    }

    pub fn background_dropped(&self) {
        add(&self.background_dropped, 1);
    }

    /// Records how a relayed response ended.
    pub fn outcome(&self, outcome: &Outcome) {
        if let Some(usage) = outcome.usage {
            add(&self.usage_reports, 1);
            add(&self.prompt_tokens_reported, usage.prompt_tokens);
            add(
                &self.completion_tokens_reported,
                usage.completion_tokens.unwrap_or(0),
            );
        }
        if outcome.usage_unreadable {
            add(&self.usage_unreadable, 1);
        }
        add(&self.stripped_events, u64::from(outcome.stripped_events));
        match outcome.end {
            End::Complete => {}
            End::ClientGone => add(&self.client_gone, 1),
            End::UpstreamError => add(&self.upstream_errors, 1),
            End::IdleTimeout => add(&self.idle_timeouts, 1),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            requests: get(&self.requests),
            chat_requests: get(&self.chat_requests),
            unparseable_bodies: get(&self.unparseable_bodies),
            identified: get(&self.identified),
            store_unavailable: get(&self.store_unavailable),
            usage_requested: get(&self.usage_requested),
            usage_reports: get(&self.usage_reports),
            prompt_tokens_reported: get(&self.prompt_tokens_reported),
            completion_tokens_reported: get(&self.completion_tokens_reported),
            usage_unreadable: get(&self.usage_unreadable),
            stripped_events: get(&self.stripped_events),
            upstream_errors: get(&self.upstream_errors),
            client_gone: get(&self.client_gone),
            idle_timeouts: get(&self.idle_timeouts),
            compactions: self
                .compactions
                .each_ref()
                .map(|row| row.each_ref().map(get)),
            estimated_tokens_before: get(&self.estimated_tokens_before),
            estimated_tokens_after: get(&self.estimated_tokens_after),
            checkpoints_applied: get(&self.checkpoints_applied),
            summary_calls: get(&self.summary_calls),
            summary_failures: get(&self.summary_failures),
            fallbacks: get(&self.fallbacks),
            retries: get(&self.retries),
            anti_thrash: get(&self.anti_thrash),
            observed: get(&self.observed),
            waited_for_peer: get(&self.waited_for_peer),
            background_dropped: get(&self.background_dropped),
        }
    }
}

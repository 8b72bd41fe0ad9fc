//! Counters of what abridge did, readable without locks from any request.
//!
//! Plain relaxed atomics: each is an independent tally, nothing is derived from two of
//! them at once. The admin API and metrics (a later issue) read [`Stats::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::relay::{End, Outcome};

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
        }
    }
}

//! What abridge did, as Prometheus metrics (the `prometheus-client` crate) — the one
//! place counts are kept. `/metrics` encodes them; `/admin/stats` and the tests read the
//! same values through [`Stats::snapshot`].
//!
//! Every metric is named `abridge_*`. Counters are cheap atomic adds on the request path;
//! label sets are closed enums, so a client can never create a new series.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

#[macro_use]
mod table;

use crate::accounting::Tally;
use crate::outcome::{Trigger, Uncompactable, Why};
use crate::relay::{End, Outcome};
use crate::strategies::Strategy;

mod labels;

use labels::*;
pub use labels::{Class, Route};

metrics! {
    requests: Family<RequestLabels, Counter> = Family::default(),
        "requests", "Requests received on /v1, by route and response status class" => {
        /// Requests received on `/v1`.
        requests: u64 = |s| s.requests_where(None, None),
        /// Of which chat completions.
        chat_requests: u64 = |s| s.requests_where(Some(Route::Chat), None),
        /// Of which Responses API requests (`POST /v1/responses`).
        responses_api_requests: u64 = |s| s.requests_where(Some(Route::Responses), None),
        /// Of which Anthropic Messages requests (`POST /v1/messages`).
        messages_requests: u64 = |s| s.requests_where(Some(Route::Messages), None),
        /// Responses by status class (chat and pass-through together): 2xx, 3xx, 4xx, 5xx.
        responses_2xx: u64 = |s| s.requests_where(None, Some(Class::Success)),
        responses_4xx: u64 = |s| s.requests_where(None, Some(Class::ClientError)),
        responses_5xx: u64 = |s| s.requests_where(None, Some(Class::ServerError)),
    };
    inflight_requests: Gauge = Gauge::default(),
        "inflight_requests", "Requests being served (streams included)" => {
        inflight_requests: i64 = |s| s.inflight_requests.get(),
    };
    inflight_streams: Gauge = Gauge::default(),
        "inflight_streams", "Streamed (SSE) responses being relayed" => {
        inflight_streams: i64 = |s| s.inflight_streams.get(),
    };
    // 10 µs … ~10 s: abridge's own time, from a few microseconds on the plain path
    // to seconds when a summary is built on the critical path.
    added_latency: Family<RouteLabel, Histogram> = Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1e-5, 2.0, 20))
        }),
        "added_latency_seconds",
        "Time abridge itself spent on a request, excluding waiting for the provider" => {};
    /// Chat bodies abridge could not parse and forwarded untouched.
    unparseable_bodies: "unparseable_bodies", "Chat bodies not understood, forwarded untouched"
        => fn unparseable;
    /// Chat requests recognised as (part of) a conversation.
    identified: "identified_requests", "Chat requests recognised as part of a conversation"
        => fn identified;
    /// Chat requests that went on without conversation state because the store failed.
    store_unavailable: "store_unavailable_requests",
        "Chat requests served without conversation state because the store failed"
        => fn store_unavailable;
    /// Streaming requests where abridge added `stream_options.include_usage`.
    usage_requested: "usage_requested", "Streaming requests where abridge asked for usage itself"
        => fn usage_requested;
    /// Requests the provider refused because of the `stream_options` abridge added
    /// (each retried with the client's own fields).
    usage_option_refused: "usage_option_refused",
        "Requests the provider refused for the stream_options abridge added (retried without it)"
        => fn usage_option_refused;
    /// Streaming requests without usage because the provider refuses `stream_options`.
    usage_not_asked: "usage_not_asked",
        "Streaming requests sent without stream_options because the provider refuses it (usage unread)"
        => fn usage_not_asked;
    /// Responses whose usage abridge read.
    usage_reports: "usage_reports", "Responses whose usage abridge read";
    prompt_tokens: Family<CompactedLabel, Counter> = Family::default(),
        "prompt_tokens_reported",
        "Prompt tokens the provider reported, by whether the request was compacted" => {
        /// Prompt tokens the provider reported, all requests and compacted ones.
        prompt_tokens_reported: u64 =
            |s| s.prompt_tokens_where(false) + s.prompt_tokens_where(true),
        prompt_tokens_reported_compacted: u64 = |s| s.prompt_tokens_where(true),
    };
    completion_tokens_reported: "completion_tokens_reported",
        "Completion tokens the provider reported";
    /// Prompt tokens the provider's prompt cache served, as it reported them (OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`).
    cached_tokens_reported: "cached_tokens_reported",
        "Prompt tokens the provider reported as served from its prompt cache";
    /// Prompt tokens the provider reported as written to its prompt cache (Anthropic's
    /// `cache_creation_input_tokens`).
    cache_write_tokens_reported: "cache_write_tokens_reported",
        "Prompt tokens the provider reported as written to its prompt cache";
    /// Prompt tokens the clients' requests held, counted as the provider counts: its own
    /// count for a request forwarded as sent; for a compacted one, abridge's estimate of
    /// the request as sent scaled by the provider's count over abridge's estimate of what
    /// was forwarded. Requests whose usage was read.
    client_prompt_tokens: "client_prompt_tokens",
        "Prompt tokens the clients' requests held, counted as the provider counts (requests whose usage was read)";
    /// `client_prompt_tokens` less what the provider reported for those requests: each
    /// request's saving counted once.
    tokens_saved: "tokens_saved",
        "Prompt tokens compaction kept from the provider, counted as the provider counts, each request once";
    /// Money, in millionths of a US dollar at the price table: the requests as the
    /// clients sent them, with the prompt cache they would have hit (estimated for a
    /// compacted request from the client's previous one); as forwarded, as the provider
    /// reported them; the summaries; the recall follow-ups. Net saved is the first less
    /// the other three ([`Snapshot::net_saved_micros`]).
    cost_direct: "cost_direct_usd_micros",
        "Millionths of a dollar the requests would have cost sent as the clients sent them";
    cost_forwarded: "cost_forwarded_usd_micros",
        "Millionths of a dollar the forwarded requests cost, as the provider reported their tokens";
    cost_summaries: "cost_summaries_usd_micros",
        "Millionths of a dollar the summary calls cost, as their provider reported their tokens";
    cost_recalls: "cost_recalls_usd_micros",
        "Millionths of a dollar the recall follow-up requests cost, as the provider reported their tokens";
    /// Exchanges of a model the price table does not know: counted in tokens only.
    unpriced: "unpriced_exchanges",
        "Requests and summary calls of a model without a price (in the token figures, not the money)";
    /// Responses whose encoding abridge could not decode to read usage.
    usage_unreadable: "usage_unreadable", "Responses in an encoding abridge cannot decode";
    /// Usage-only SSE events removed because the client had not asked for them.
    stripped_events: "stripped_events", "Usage-only SSE events removed (the client had not asked)";
    /// Upstream unreachable, timed out, or failed mid-body.
    upstream_errors: "upstream_errors", "Provider unreachable, timed out or failed mid-body"
        => fn upstream_error;
    /// Responses the client stopped reading before the end (upstream cancelled).
    client_gone: "client_gone", "Responses abandoned by the client (upstream cancelled)";
    /// Streams cut after `timeouts.stream_idle_ms` of silence.
    idle_timeouts: "idle_timeouts", "Streams cut after timeouts.stream_idle_ms of silence";
    compactions: Family<CompactionLabels, Counter> = Family::default(),
        "compactions", "Compactions run, by strategy and trigger" => {
        /// Compactions run, by strategy then trigger (see [`Snapshot::compactions_by`]).
        compactions: [[u64; 4]; 4] = |s| s.compactions_grid(),
    };
    compaction_tokens: Family<PhaseLabel, Counter> = Family::default(),
        "compaction_tokens_estimated",
        "Estimated prompt tokens before and after each compaction run" => {
        /// Estimated prompt tokens before and after, summed over compactions run.
        estimated_tokens_before: u64 = |s| s.estimated_tokens(Phase::Before),
        estimated_tokens_after: u64 = |s| s.estimated_tokens(Phase::After),
    };
    /// Estimated prompt tokens not sent, summed over every forwarded compacted request.
    tokens_saved_estimated: "tokens_saved_estimated",
        "Estimated prompt tokens not sent, over every forwarded compacted request";
    /// Requests forwarded with a checkpoint applied.
    checkpoints_applied: "checkpoints_applied", "Requests forwarded with a checkpoint applied"
        => fn checkpoint_applied;
    summary_calls: "summary_calls", "Summariser calls" => fn summary_call;
    /// Summaries asked after the conversation itself, riding the prompt cache.
    summaries_in_context: "summaries_in_context", "Summaries asked after the conversation itself, riding the provider's prompt cache"
        => fn summary_in_context;
    /// The summariser's spend: input and output tokens its provider reported.
    summary_input_tokens: "summary_input_tokens", "Input tokens of summary calls, as their provider reported";
    summary_output_tokens: "summary_output_tokens", "Output tokens of summary calls, as their provider reported";
    /// `abridge_recall` calls abridge answered, and the tokens (abridge's estimate) of
    /// what they returned to the model.
    recalls: "recalls", "abridge_recall calls abridge answered";
    recall_tokens: "recall_tokens", "Estimated tokens abridge_recall answers returned to the model";
    /// Recall's spend: the input and output tokens of the follow-up requests recalls
    /// made, as the provider reported (the client's usage includes them).
    recall_input_tokens: "recall_input_tokens", "Input tokens of recall follow-up requests, as the provider reported";
    recall_output_tokens: "recall_output_tokens", "Output tokens of recall follow-up requests, as the provider reported";
    /// Client requests answered after recall rounds that could not be completed (a
    /// follow-up the provider refused, that could not be sent, or that had no room in
    /// the body budget): answered without recall.
    recall_failures: "recall_failures",
        "Requests whose recall follow-up failed (answered without recall)" => fn recall_failure;
    summary_failures: "summary_failures", "Summariser calls that failed or timed out"
        => fn summary_failure;
    /// Summaries not asked for: the provider had not accepted the tenant's credential
    /// yet, or its summary rate was spent.
    summary_refused: "summary_refused",
        "Summaries not asked for: credential not yet accepted by the provider, or its rate spent"
        => fn summary_refused;
    /// Summaries put off because the tenant's budget was spent and the request still fit
    /// its window: forwarded with the checkpoint in force, built in the background.
    summary_deferred: "summary_deferred",
        "Summaries put off to the background: the tenant's budget was spent, the request still fit"
        => fn summary_deferred;
    // The gate's score of each summary written: the share of the covered messages'
    // identifiers the summariser kept itself.
    gate_score: Histogram = Histogram::new([0.25, 0.5, 0.75, 0.9, 0.99, 1.0].into_iter()),
        "summary_gate_score",
        "Share of the covered messages' identifiers each summary kept before the gate's repairs"
        => {};
    /// Summaries the gate repaired (sections put in place, dropped identifiers or the
    /// latest ask appended) and used.
    summary_repairs: "summary_repairs",
        "Summaries used after the gate repaired them (sections, dropped identifiers, latest ask)";
    /// Summarising strategies that fell back to recency.
    fallbacks: "fallbacks", "Summarising strategies that fell back to recency" => fn fallback;
    /// Requests compacted and retried after "context length exceeded".
    retries: "retries", "Requests compacted and retried after context length exceeded" => fn retry;
    /// Overflows the provider answered ("context length exceeded"), whether or not a
    /// retry followed: what abridge could not avoid.
    context_overflows: "context_overflows",
        "Context overflows the provider answered (abridge could not avoid them)";
    overflows_by_model: Family<ModelLabel, Counter> = Family::default(),
        "context_overflows_by_model",
        "Context overflows the provider answered, by model (the first 64 models; then other)"
        => {};
    decisions: Family<ReasonLabel, Counter> = Family::default(),
        "cost_decisions",
        "Requests the cost policy weighed, by its verdict: window, threshold, pays, cache-cold (compacted) or not-worth-it (forwarded as they are)"
        => {
        /// Requests over the threshold the cost policy left alone: compacting them
        /// would have cost more than it saves.
        not_worth_it: u64 = |s| count(&s.decisions, &ReasonLabel { reason: Why::NotWorthIt }),
    };
    anti_thrash: Family<CaseLabel, Counter> = Family::default(),
        "anti_thrash",
        "Requests not compacted because even the minimal plan (head, marker, final turn) is over the threshold, by case: head or final_turn"
        => {
        /// Requests not compacted because even the minimal plan is over the threshold.
        anti_thrash: u64 = |s| s.anti_thrash_total(),
    };
    /// Observe mode: requests that would have been compacted.
    observed: "observed", "Observe mode: requests that would have been compacted" => fn observed;
    /// Requests that waited for another request's (or replica's) summary.
    waited_for_peer: "waited_for_peer", "Requests that waited for another request's summary"
        => fn waited_for_peer;
    /// Background compactions dropped because the queue was full.
    background_dropped: "background_dropped", "Background compactions dropped (queue full)"
        => fn background_dropped;
}

/// Applies one snapshot reader of the table above.
fn read<T>(stats: &Stats, reader: impl FnOnce(&Stats) -> T) -> T {
    reader(stats)
}

/// The value of one series of a counter family, 0 when it does not exist yet.
fn count<L: Clone + std::hash::Hash + Eq>(family: &Family<L, Counter>, labels: &L) -> u64 {
    family.get(labels).map_or(0, |n| n.get())
}

impl Snapshot {
    /// Compactions run with `strategy` for `trigger`.
    pub fn compactions_by(&self, strategy: Strategy, trigger: Trigger) -> u64 {
        let s = Strategy::ALL
            .iter()
            .position(|x| *x == strategy)
            .unwrap_or(0);
        let t = Trigger::ALL.iter().position(|x| *x == trigger).unwrap_or(0);
        self.compactions[s][t]
    }

    /// Compactions run, all strategies and triggers.
    pub fn compactions_total(&self) -> u64 {
        self.compactions.iter().flatten().sum()
    }

    /// Millionths of a dollar saved, net of what the forwarded requests, the summaries
    /// and the recalls cost (negative: compaction cost more than it saved).
    pub fn net_saved_micros(&self) -> i64 {
        let spent = self.cost_forwarded + self.cost_summaries + self.cost_recalls;
        i64::try_from(self.cost_direct).unwrap_or(i64::MAX)
            - i64::try_from(spent).unwrap_or(i64::MAX)
    }
}

/// Decrements a gauge when dropped: an in-flight request or stream ending, however it
/// ends.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Stats {
    /// A request arrived; the guard marks it finished when dropped.
    pub fn request_started(&self) -> InFlight {
        self.inflight_requests.inc();
        InFlight(self.inflight_requests.clone())
    }

    /// A streamed response started; the guard marks it finished when dropped.
    pub fn stream_started(&self) -> InFlight {
        self.inflight_streams.inc();
        InFlight(self.inflight_streams.clone())
    }

    /// The response status of a request, once known.
    pub fn response(&self, route: Route, status: http::StatusCode) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                class: Class::of(status),
            })
            .inc();
    }

    /// Time abridge itself spent on a request (not waiting for the provider).
    pub fn added_latency(&self, route: Route, spent: Duration) {
        self.added_latency
            .get_or_create(&RouteLabel { route })
            .observe(spent.as_secs_f64());
    }

    /// A summary the gate judged: its score, and whether it needed repairs.
    pub fn summary_gate(&self, verdict: &crate::strategies::Verdict) {
        self.gate_score.observe(f64::from(verdict.score));
        if !verdict.repaired.is_empty() {
            self.summary_repairs.inc();
        }
    }

    pub fn compaction(&self, strategy: Strategy, trigger: Trigger, before: u64, after: u64) {
        self.compactions
            .get_or_create(&CompactionLabels {
                strategy: strategy.into(),
                trigger,
            })
            .inc();
        for (phase, tokens) in [(Phase::Before, before), (Phase::After, after)] {
            self.compaction_tokens
                .get_or_create(&PhaseLabel { phase })
                .inc_by(tokens);
        }
    }

    /// A compacted request was forwarded: the estimate of the tokens it did not send.
    pub fn estimated_saving(&self, tokens: u64) {
        self.tokens_saved_estimated.inc_by(tokens);
    }

    /// What an exchange saved and cost (a forwarded request's usage, a summary call, a
    /// recall round), added to the totals.
    pub fn tally(&self, t: &Tally) {
        for (counter, value) in [
            (&self.client_prompt_tokens, t.client_tokens),
            (&self.tokens_saved, t.tokens_saved()),
            (&self.cached_tokens_reported, t.cached_tokens),
            (&self.cache_write_tokens_reported, t.cache_write_tokens),
            (&self.summary_input_tokens, t.summary_input_tokens),
            (&self.summary_output_tokens, t.summary_output_tokens),
            (&self.recall_input_tokens, t.recall_input_tokens),
            (&self.recall_output_tokens, t.recall_output_tokens),
            (&self.cost_direct, t.direct_micros),
            (&self.cost_forwarded, t.forwarded_micros),
            (&self.cost_summaries, t.summary_micros),
            (&self.cost_recalls, t.recall_micros),
            (&self.unpriced, t.unpriced),
        ] {
            if value > 0 {
                counter.inc_by(value);
            }
        }
    }

    /// A recall call was answered with about `tokens` tokens.
    pub fn recalled(&self, tokens: u64) {
        self.recalls.inc();
        self.recall_tokens.inc_by(tokens);
    }

    /// The provider answered an overflow for `model` (its label bounded by the caller).
    pub fn context_overflow(&self, model: &str) {
        self.context_overflows.inc();
        self.overflows_by_model
            .get_or_create(&ModelLabel {
                model: Escaped(model.to_owned()),
            })
            .inc();
    }

    /// The cost policy weighed a request: its verdict.
    pub fn decided(&self, reason: Why) {
        self.decisions.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn anti_thrash(&self, case: Uncompactable) {
        self.anti_thrash.get_or_create(&CaseLabel { case }).inc();
    }

    /// Records how a relayed response ended; `compacted`: whether a checkpoint was
    /// applied. (What its usage saved and cost is [`Stats::tally`]'s.)
    pub fn outcome(&self, outcome: &Outcome, compacted: bool) {
        if let Some(usage) = outcome.usage {
            self.usage_reports.inc();
            self.prompt_tokens
                .get_or_create(&CompactedLabel { compacted })
                .inc_by(usage.prompt_tokens);
            self.completion_tokens_reported
                .inc_by(usage.completion_tokens.unwrap_or(0));
        }
        if outcome.usage_unreadable {
            self.usage_unreadable.inc();
        }
        self.stripped_events
            .inc_by(u64::from(outcome.stripped_events));
        match outcome.end {
            End::Complete => {}
            End::ClientGone => {
                self.client_gone.inc();
            }
            End::UpstreamError => {
                self.upstream_errors.inc();
            }
            End::IdleTimeout => {
                self.idle_timeouts.inc();
            }
        }
    }

    /// Requests counted for `route` and `class` (`None`: all of them).
    fn requests_where(&self, route: Option<Route>, class: Option<Class>) -> u64 {
        let mut total = 0;
        for r in [
            Route::Chat,
            Route::Responses,
            Route::Messages,
            Route::Passthrough,
        ] {
            for c in [
                Class::Success,
                Class::Redirect,
                Class::ClientError,
                Class::ServerError,
                Class::Other,
            ] {
                if route.is_none_or(|x| x == r) && class.is_none_or(|x| x == c) {
                    total += count(&self.requests, &RequestLabels { route: r, class: c });
                }
            }
        }
        total
    }

    fn compactions_grid(&self) -> [[u64; 4]; 4] {
        Strategy::ALL.map(|s| {
            Trigger::ALL.map(|trigger| {
                let labels = CompactionLabels {
                    strategy: s.into(),
                    trigger,
                };
                count(&self.compactions, &labels)
            })
        })
    }

    fn prompt_tokens_where(&self, compacted: bool) -> u64 {
        count(&self.prompt_tokens, &CompactedLabel { compacted })
    }

    fn estimated_tokens(&self, phase: Phase) -> u64 {
        count(&self.compaction_tokens, &PhaseLabel { phase })
    }

    fn anti_thrash_total(&self) -> u64 {
        Uncompactable::ALL
            .iter()
            .map(|&case| count(&self.anti_thrash, &CaseLabel { case }))
            .sum()
    }
}

#[cfg(test)]
mod tests;

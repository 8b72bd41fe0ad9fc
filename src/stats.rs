//! What abridge did, as Prometheus metrics (the `prometheus-client` crate) — the one
//! place counts are kept. `/metrics` encodes them; `/admin/stats` and the tests read the
//! same values through [`Stats::snapshot`].
//!
//! Every metric is named `abridge_*`. Counters are cheap atomic adds on the request path;
//! label sets are closed enums, so a client can never create a new series.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::strategies::Strategy;
use crate::outcome::{Trigger, Uncompactable};
use crate::relay::{End, Outcome};

/// Which handler served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/chat/completions`, which abridge reads.
    Chat,
    /// Everything else under `/v1`.
    Passthrough,
}

/// The class of a response status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Success,
    Redirect,
    ClientError,
    ServerError,
    Other,
}

impl Class {
    pub fn of(status: http::StatusCode) -> Self {
        match status.as_u16() {
            200..=299 => Class::Success,
            300..=399 => Class::Redirect,
            400..=499 => Class::ClientError,
            500..=599 => Class::ServerError,
            _ => Class::Other,
        }
    }
}

/// A strategy as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StrategyLabel(Strategy);

impl From<Strategy> for StrategyLabel {
    fn from(s: Strategy) -> Self {
        StrategyLabel(s)
    }
}

impl StrategyLabel {
    fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

/// Label values are the lower-case names used everywhere else (`chat`, `2xx`,
/// `structured`, `background`...).
macro_rules! label_value {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}

label_value!(Trigger, Route, Class, StrategyLabel, Phase, Uncompactable);

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Passthrough => "passthrough",
        }
    }
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Success => "2xx",
            Class::Redirect => "3xx",
            Class::ClientError => "4xx",
            Class::ServerError => "5xx",
            Class::Other => "other",
        }
    }
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::After => "after",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: Route,
    class: Class,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabel {
    route: Route,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CompactionLabels {
    strategy: StrategyLabel,
    trigger: Trigger,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CaseLabel {
    case: Uncompactable,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CompactedLabel {
    compacted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Before,
    After,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabel {
    phase: Phase,
}

/// The metrics. Cloning shares them (every handle is an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Stats {
    requests: Family<RequestLabels, Counter>,
    inflight_requests: Gauge,
    inflight_streams: Gauge,
    added_latency: Family<RouteLabel, Histogram>,
    unparseable_bodies: Counter,
    identified: Counter,
    store_unavailable: Counter,
    usage_requested: Counter,
    usage_option_refused: Counter,
    usage_not_asked: Counter,
    usage_reports: Counter,
    prompt_tokens: Family<CompactedLabel, Counter>,
    completion_tokens: Counter,
    usage_unreadable: Counter,
    stripped_events: Counter,
    upstream_errors: Counter,
    client_gone: Counter,
    idle_timeouts: Counter,
    compactions: Family<CompactionLabels, Counter>,
    compaction_tokens: Family<PhaseLabel, Counter>,
    tokens_saved: Counter,
    checkpoints_applied: Counter,
    summary_calls: Counter,
    summary_failures: Counter,
    summary_refused: Counter,
    fallbacks: Counter,
    retries: Counter,
    anti_thrash: Family<CaseLabel, Counter>,
    observed: Counter,
    waited_for_peer: Counter,
    background_dropped: Counter,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            inflight_requests: Gauge::default(),
            inflight_streams: Gauge::default(),
            // 10 µs … ~10 s: abridge's own time, from a few microseconds on the plain path
            // to seconds when a summary is built on the critical path.
            added_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 2.0, 20))
            }),
            unparseable_bodies: Counter::default(),
            identified: Counter::default(),
            store_unavailable: Counter::default(),
            usage_requested: Counter::default(),
            usage_option_refused: Counter::default(),
            usage_not_asked: Counter::default(),
            usage_reports: Counter::default(),
            prompt_tokens: Family::default(),
            completion_tokens: Counter::default(),
            usage_unreadable: Counter::default(),
            stripped_events: Counter::default(),
            upstream_errors: Counter::default(),
            client_gone: Counter::default(),
            idle_timeouts: Counter::default(),
            compactions: Family::default(),
            compaction_tokens: Family::default(),
            tokens_saved: Counter::default(),
            checkpoints_applied: Counter::default(),
            summary_calls: Counter::default(),
            summary_failures: Counter::default(),
            summary_refused: Counter::default(),
            fallbacks: Counter::default(),
            retries: Counter::default(),
            anti_thrash: Family::default(),
            observed: Counter::default(),
            waited_for_peer: Counter::default(),
            background_dropped: Counter::default(),
        }
    }
}

/// A point-in-time copy of the counters, for `/admin/stats` and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Requests received on `/v1`.
    pub requests: u64,
    /// Of which chat completions.
    pub chat_requests: u64,
    /// Responses by status class (chat and pass-through together): 2xx, 3xx, 4xx, 5xx.
    pub responses_2xx: u64,
    pub responses_4xx: u64,
    pub responses_5xx: u64,
    pub inflight_requests: i64,
    pub inflight_streams: i64,
    /// Chat bodies abridge could not parse and forwarded untouched.
    pub unparseable_bodies: u64,
    /// Chat requests recognised as (part of) a conversation.
    pub identified: u64,
    /// Chat requests that went on without conversation state because the store failed.
    pub store_unavailable: u64,
    /// Streaming requests where abridge added `stream_options.include_usage`.
    pub usage_requested: u64,
    /// Requests the provider refused because of the `stream_options` abridge added
    /// (each retried with the client's own fields).
    pub usage_option_refused: u64,
    /// Streaming requests without usage because the provider refuses `stream_options`.
    pub usage_not_asked: u64,
    /// Responses whose usage abridge read.
    pub usage_reports: u64,
    /// Prompt tokens the provider reported, all requests and compacted ones.
    pub prompt_tokens_reported: u64,
    pub prompt_tokens_reported_compacted: u64,
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
    /// Estimated prompt tokens not sent, summed over every forwarded compacted request.
    pub tokens_saved_estimated: u64,
    /// Requests forwarded with a checkpoint applied.
    pub checkpoints_applied: u64,
    pub summary_calls: u64,
    pub summary_failures: u64,
    /// Summaries not asked for: the provider had not accepted the tenant's credential
    /// yet, or its summary rate was spent.
    pub summary_refused: u64,
    /// Summarising strategies that fell back to recency.
    pub fallbacks: u64,
    /// Requests compacted and retried after "context length exceeded".
    pub retries: u64,
    /// Requests not compacted because even the minimal plan is over the threshold.
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
    /// Registers every metric under the `abridge` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("abridge");
        r.register(
            "requests",
            "Requests received on /v1, by route and response status class",
            self.requests.clone(),
        );
        r.register(
            "inflight_requests",
            "Requests being served (streams included)",
            self.inflight_requests.clone(),
        );
        r.register(
            "inflight_streams",
            "Streamed (SSE) responses being relayed",
            self.inflight_streams.clone(),
        );
        r.register(
            "added_latency_seconds",
            "Time abridge itself spent on a request, excluding waiting for the provider",
            self.added_latency.clone(),
        );
        r.register(
            "unparseable_bodies",
            "Chat bodies not understood, forwarded untouched",
            self.unparseable_bodies.clone(),
        );
        r.register(
            "identified_requests",
            "Chat requests recognised as part of a conversation",
            self.identified.clone(),
        );
        r.register(
            "store_unavailable_requests",
            "Chat requests served without conversation state because the store failed",
            self.store_unavailable.clone(),
        );
        r.register(
            "usage_requested",
            "Streaming requests where abridge asked for usage itself",
            self.usage_requested.clone(),
        );
        r.register(
            "usage_option_refused",
            "Requests the provider refused for the stream_options abridge added (retried without it)",
            self.usage_option_refused.clone(),
        );
        r.register(
            "usage_not_asked",
            "Streaming requests sent without stream_options because the provider refuses it (usage unread)",
            self.usage_not_asked.clone(),
        );
        r.register(
            "usage_reports",
            "Responses whose usage abridge read",
            self.usage_reports.clone(),
        );
        r.register(
            "prompt_tokens_reported",
            "Prompt tokens the provider reported, by whether the request was compacted",
            self.prompt_tokens.clone(),
        );
        r.register(
            "completion_tokens_reported",
            "Completion tokens the provider reported",
            self.completion_tokens.clone(),
        );
        r.register(
            "usage_unreadable",
            "Responses in an encoding abridge cannot decode",
            self.usage_unreadable.clone(),
        );
        r.register(
            "stripped_events",
            "Usage-only SSE events removed (the client had not asked)",
            self.stripped_events.clone(),
        );
        r.register(
            "upstream_errors",
            "Provider unreachable, timed out or failed mid-body",
            self.upstream_errors.clone(),
        );
        r.register(
            "client_gone",
            "Responses abandoned by the client (upstream cancelled)",
            self.client_gone.clone(),
        );
        r.register(
            "idle_timeouts",
            "Streams cut after timeouts.stream_idle_ms of silence",
            self.idle_timeouts.clone(),
        );
        r.register(
            "compactions",
            "Compactions run, by strategy and trigger",
            self.compactions.clone(),
        );
        r.register(
            "compaction_tokens_estimated",
            "Estimated prompt tokens before and after each compaction run",
            self.compaction_tokens.clone(),
        );
        r.register(
            "tokens_saved_estimated",
            "Estimated prompt tokens not sent, over every forwarded compacted request",
            self.tokens_saved.clone(),
        );
        r.register(
            "checkpoints_applied",
            "Requests forwarded with a checkpoint applied",
            self.checkpoints_applied.clone(),
        );
        r.register(
            "summary_calls",
            "Summariser calls",
            self.summary_calls.clone(),
        );
        r.register(
            "summary_failures",
            "Summariser calls that failed or timed out",
            self.summary_failures.clone(),
        );
        r.register(
            "summary_refused",
            "Summaries not asked for: credential not yet accepted by the provider, or its rate spent",
            self.summary_refused.clone(),
        );
        r.register(
            "fallbacks",
            "Summarising strategies that fell back to recency",
            self.fallbacks.clone(),
        );
        r.register(
            "retries",
            "Requests compacted and retried after context length exceeded",
            self.retries.clone(),
        );
        r.register(
            "anti_thrash",
            "Requests not compacted because even the minimal plan (head, marker, final turn) is over the threshold, by case: head or final_turn",
            self.anti_thrash.clone(),
        );
        r.register(
            "observed",
            "Observe mode: requests that would have been compacted",
            self.observed.clone(),
        );
        r.register(
            "waited_for_peer",
            "Requests that waited for another request's summary",
            self.waited_for_peer.clone(),
        );
        r.register(
            "background_dropped",
            "Background compactions dropped (queue full)",
            self.background_dropped.clone(),
        );
    }

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

    pub fn unparseable(&self) {
        self.unparseable_bodies.inc();
    }

    pub fn identified(&self) {
        self.identified.inc();
    }

    pub fn store_unavailable(&self) {
        self.store_unavailable.inc();
    }

    pub fn usage_requested(&self) {
        self.usage_requested.inc();
    }

    pub fn usage_option_refused(&self) {
        self.usage_option_refused.inc();
    }

    pub fn usage_not_asked(&self) {
        self.usage_not_asked.inc();
    }

    pub fn upstream_error(&self) {
        self.upstream_errors.inc();
    }

    pub fn compaction(&self, strategy: Strategy, trigger: Trigger, before: u64, after: u64) {
        self.compactions
            .get_or_create(&CompactionLabels {
                strategy: strategy.into(),
                trigger,
            })
            .inc();
        self.compaction_tokens
            .get_or_create(&PhaseLabel {
                phase: Phase::Before,
            })
            .inc_by(before);
        self.compaction_tokens
            .get_or_create(&PhaseLabel {
                phase: Phase::After,
            })
            .inc_by(after);
    }

    /// A compacted request was forwarded: the estimate of the tokens it did not send.
    pub fn tokens_saved(&self, tokens: u64) {
        self.tokens_saved.inc_by(tokens);
    }

    pub fn checkpoint_applied(&self) {
        self.checkpoints_applied.inc();
    }

    pub fn summary_call(&self) {
        self.summary_calls.inc();
    }

    pub fn summary_failure(&self) {
        self.summary_failures.inc();
    }

    pub fn summary_refused(&self) {
        self.summary_refused.inc();
    }

    pub fn fallback(&self) {
        self.fallbacks.inc();
    }

    pub fn retry(&self) {
        self.retries.inc();
    }

    pub fn anti_thrash(&self, case: Uncompactable) {
        self.anti_thrash.get_or_create(&CaseLabel { case }).inc();
    }

    pub fn observed(&self) {
        self.observed.inc();
    }

    pub fn waited_for_peer(&self) {
        self.waited_for_peer.inc();
    }

    pub fn background_dropped(&self) {
        self.background_dropped.inc();
    }

    /// Records how a relayed response ended; `compacted`: a checkpoint was applied.
    pub fn outcome(&self, outcome: &Outcome, compacted: bool) {
        if let Some(usage) = outcome.usage {
            self.usage_reports.inc();
            self.prompt_tokens
                .get_or_create(&CompactedLabel { compacted })
                .inc_by(usage.prompt_tokens);
            self.completion_tokens
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

    /// The figures as numbers. Reads only series that exist (`get`, not
    /// `get_or_create`), so asking for a snapshot adds no zero series to `/metrics`.
    pub fn snapshot(&self) -> Snapshot {
        let requests = |route: Option<Route>, class: Option<Class>| -> u64 {
            let mut total = 0;
            for r in [Route::Chat, Route::Passthrough] {
                for c in [
                    Class::Success,
                    Class::Redirect,
                    Class::ClientError,
                    Class::ServerError,
                    Class::Other,
                ] {
                    if route.is_none_or(|x| x == r) && class.is_none_or(|x| x == c) {
                        total += self
                            .requests
                            .get(&RequestLabels { route: r, class: c })
                            .map_or(0, |n| n.get());
                    }
                }
            }
            total
        };
        let compactions = Strategy::ALL.map(|s| {
            Trigger::ALL.map(|trigger| {
                self.compactions
                    .get(&CompactionLabels {
                        strategy: s.into(),
                        trigger,
                    })
                    .map_or(0, |n| n.get())
            })
        });
        let prompt = |compacted| {
            self.prompt_tokens
                .get(&CompactedLabel { compacted })
                .map_or(0, |n| n.get())
        };
        let phase = |phase| {
            self.compaction_tokens
                .get(&PhaseLabel { phase })
                .map_or(0, |n| n.get())
        };
        Snapshot {
            requests: requests(None, None),
            chat_requests: requests(Some(Route::Chat), None),
            responses_2xx: requests(None, Some(Class::Success)),
            responses_4xx: requests(None, Some(Class::ClientError)),
            responses_5xx: requests(None, Some(Class::ServerError)),
            inflight_requests: self.inflight_requests.get(),
            inflight_streams: self.inflight_streams.get(),
            unparseable_bodies: self.unparseable_bodies.get(),
            identified: self.identified.get(),
            store_unavailable: self.store_unavailable.get(),
            usage_requested: self.usage_requested.get(),
            usage_option_refused: self.usage_option_refused.get(),
            usage_not_asked: self.usage_not_asked.get(),
            usage_reports: self.usage_reports.get(),
            prompt_tokens_reported: prompt(false) + prompt(true),
            prompt_tokens_reported_compacted: prompt(true),
            completion_tokens_reported: self.completion_tokens.get(),
            usage_unreadable: self.usage_unreadable.get(),
            stripped_events: self.stripped_events.get(),
            upstream_errors: self.upstream_errors.get(),
            client_gone: self.client_gone.get(),
            idle_timeouts: self.idle_timeouts.get(),
            compactions,
            estimated_tokens_before: phase(Phase::Before),
            estimated_tokens_after: phase(Phase::After),
            tokens_saved_estimated: self.tokens_saved.get(),
            checkpoints_applied: self.checkpoints_applied.get(),
            summary_calls: self.summary_calls.get(),
            summary_failures: self.summary_failures.get(),
            summary_refused: self.summary_refused.get(),
            fallbacks: self.fallbacks.get(),
            retries: self.retries.get(),
            anti_thrash: Uncompactable::ALL
                .iter()
                .map(|&case| {
                    self.anti_thrash
                        .get(&CaseLabel { case })
                        .map_or(0, |n| n.get())
                })
                .sum(),
            observed: self.observed.get(),
            waited_for_peer: self.waited_for_peer.get(),
            background_dropped: self.background_dropped.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_what_was_counted_and_the_text_names_it() {
        let stats = Stats::default();
        stats.response(Route::Chat, http::StatusCode::OK);
        stats.response(Route::Passthrough, http::StatusCode::NOT_FOUND);
        stats.compaction(Strategy::Structured, Trigger::Background, 900, 300);
        {
            let _request = stats.request_started();
            assert_eq!(stats.snapshot().inflight_requests, 1);
        }
        let s = stats.snapshot();
        assert_eq!(
            (
                s.requests,
                s.chat_requests,
                s.responses_2xx,
                s.responses_4xx
            ),
            (2, 1, 1, 1)
        );
        assert_eq!(s.inflight_requests, 0);
        assert_eq!(
            s.compactions_by(Strategy::Structured, Trigger::Background),
            1
        );
        assert_eq!(
            (s.estimated_tokens_before, s.estimated_tokens_after),
            (900, 300)
        );

        let mut registry = Registry::default();
        stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"abridge_compactions_total{strategy="structured",trigger="background"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"abridge_requests_total{route="chat",class="2xx"} 1"#),
            "{text}"
        );
    }
}

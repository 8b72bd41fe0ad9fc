//! Unit tests of the metrics: what the snapshot reads, and the names `/metrics` and
//! `/admin/stats` expose.

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
        text.contains(r#"abridge_compactions_total{strategy="structured",trigger="background"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"abridge_requests_total{route="chat",class="2xx"} 1"#),
        "{text}"
    );
}

/// The names `/metrics` and `/admin/stats` expose (dashboards and alerts use them).
#[test]
fn every_metric_and_snapshot_field_keeps_its_name() {
    let stats = Stats::default();
    stats.response(Route::Chat, http::StatusCode::OK);
    stats.added_latency(Route::Chat, Duration::from_millis(1));
    stats.compaction(Strategy::Recency, Trigger::Threshold, 2, 1);
    stats.anti_thrash(Uncompactable::Head);
    stats.context_overflow("fake-model");
    stats.decided(crate::outcome::Why::Pays);
    let usage = crate::relay::Usage {
        prompt_tokens: 1,
        ..crate::relay::Usage::default()
    };
    let outcome = Outcome {
        usage: Some(usage),
        end: End::Complete,
        usage_unreadable: false,
        stripped_events: 0,
    };
    stats.outcome(&outcome, false);
    let mut registry = Registry::default();
    stats.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE abridge_"))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let expected = "\
        requests inflight_requests inflight_streams added_latency_seconds unparseable_bodies \
        identified_requests store_unavailable_requests usage_requested usage_option_refused \
        usage_not_asked usage_reports prompt_tokens_reported completion_tokens_reported cached_tokens_reported \
        cache_write_tokens_reported client_prompt_tokens tokens_saved cost_direct_usd_micros cost_forwarded_usd_micros \
        cost_summaries_usd_micros cost_recalls_usd_micros unpriced_exchanges usage_unreadable stripped_events upstream_errors client_gone idle_timeouts \
        compactions compaction_tokens_estimated tokens_saved_estimated checkpoints_applied \
        summary_calls summaries_in_context summary_input_tokens summary_output_tokens recalls recall_tokens recall_input_tokens \
        recall_output_tokens recall_failures summary_failures summary_refused summary_deferred \
        summary_gate_score summary_repairs \
        fallbacks retries context_overflows context_overflows_by_model cost_decisions anti_thrash observed waited_for_peer background_dropped";
    assert_eq!(names, expected.split(' ').collect::<Vec<_>>(), "{text}");
    // The reference page names each, as a query does (a counter with `_total`).
    let page = include_str!("../../docs/src/metrics.md");
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = match line.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            _ => line.split(' ').next().unwrap_or_default().to_owned(),
        };
        assert!(
            page.contains(&format!("| `{name}` |")),
            "{name} is not in docs/src/metrics.md"
        );
    }

    let json = serde_json::to_value(stats.snapshot()).unwrap();
    let mut fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected = "\
        requests chat_requests responses_api_requests messages_requests responses_2xx responses_4xx responses_5xx inflight_requests \
        inflight_streams unparseable_bodies identified store_unavailable usage_requested \
        usage_option_refused usage_not_asked usage_reports prompt_tokens_reported \
        prompt_tokens_reported_compacted completion_tokens_reported cached_tokens_reported \
        cache_write_tokens_reported client_prompt_tokens tokens_saved cost_direct cost_forwarded \
        cost_summaries cost_recalls unpriced usage_unreadable \
        stripped_events upstream_errors client_gone idle_timeouts compactions \
        estimated_tokens_before estimated_tokens_after tokens_saved_estimated \
        checkpoints_applied summary_calls summaries_in_context summary_input_tokens summary_output_tokens recalls recall_tokens \
        recall_input_tokens recall_output_tokens recall_failures summary_failures \
        summary_refused summary_deferred summary_repairs \
        fallbacks retries context_overflows not_worth_it anti_thrash observed waited_for_peer background_dropped";
    let mut expected: Vec<&str> = expected.split(' ').collect();
    // A `serde_json::Value` map may be sorted by key: compare as sets.
    fields.sort_unstable();
    expected.sort_unstable();
    assert_eq!(fields, expected);
}

/// A model name is the client's: one that closes the label and writes lines of its own
/// stays inside its label value.
#[test]
fn a_hostile_model_name_cannot_write_lines_into_the_metrics() {
    let stats = Stats::default();
    let hostile =
        "m\"} 1\nabridge_requests_total{route=\"chat\",class=\"2xx\"} 123456789\nabridge_up{x=\"\\";
    stats.context_overflow(hostile);
    let mut registry = Registry::default();
    stats.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        !text.contains("\nabridge_requests_total{route=\"chat\",class=\"2xx\"} 123456789"),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("abridge_up{x=")),
        "{text}"
    );
    // The sample is one line whose label value, unescaped as the text format says,
    // is the name, and which ends after it.
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("abridge_context_overflows_by_model_total{model=\""))
        .unwrap();
    let (mut value, mut rest, mut chars) = (String::new(), "", line.char_indices());
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next().map(|(_, c)| c) {
                Some('n') => value.push('\n'),
                Some(c) => value.push(c),
                None => break,
            },
            '"' => {
                rest = &line[i + 1..];
                break;
            }
            c => value.push(c),
        }
    }
    assert_eq!(value, hostile);
    assert_eq!(rest, "} 1");
}

//! The reference pages that must match what abridge exposes: docs/src/metrics.md lists
//! every metric `/metrics` serves. (The configuration page includes the defaults file,
//! which a unit test keeps equal to the built-in defaults.)

use fake_provider::{Behavior, FakeProvider};

use crate::admin::{admin_config, metrics};
use crate::common::{Fetch, Proxy, chat_body, client};

/// docs/src/metrics.md lists exactly the metrics `/metrics` exposes, by the names a
/// query uses (a counter's with `_total`).
#[tokio::test]
async fn the_metrics_page_documents_every_metric_exposed() {
    let provider = FakeProvider::start(Behavior::default()).await.unwrap();
    let proxy = Proxy::start_with(admin_config(&provider.url())).await;
    client()
        .post(proxy.url("/v1/chat/completions"))
        .body(chat_body(false))
        .fetch()
        .await;
    let text = metrics(&proxy).await;
    let exposed: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_owned(),
            None => l.to_owned(),
        })
        .collect();
    let page = include_str!("../../docs/src/metrics.md");
    let documented: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| `abridge_"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| format!("abridge_{name}"))
        .collect();
    let undocumented: Vec<&String> = exposed.iter().filter(|m| !documented.contains(m)).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/src/metrics.md: {undocumented:?}"
    );
    // A labelled family shows once it has a series; these need a compaction (or an
    // overflow, or a priced request over its threshold). (The unit
    // test `stats::tests` checks the page names every metric of the table too.)
    let mut unseen: Vec<&str> = documented
        .iter()
        .filter(|m| !exposed.contains(m))
        .map(String::as_str)
        .collect();
    unseen.sort_unstable();
    assert_eq!(
        unseen,
        [
            "abridge_anti_thrash_total",
            "abridge_compaction_tokens_estimated_total",
            "abridge_compactions_total",
            "abridge_context_overflows_by_model_total",
            "abridge_cost_decisions_total"
        ],
        "documented but not exposed"
    );
}

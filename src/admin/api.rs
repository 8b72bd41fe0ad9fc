//! The token-guarded admin API: stats, recent compactions, the conversation listing and
//! one conversation's state and checkpoints, deletion, scheduling a compaction for a
//! conversation's next turn, and the learned context windows (listed, forgotten).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::admin_error;
use crate::AppState;
use crate::accounting::Tally;
use crate::identity::Fingerprint;
use crate::outcome::Verdict;
use crate::stats::Snapshot;
use crate::store::{Checkpoint, Piece, now_ms};

/// Conversations used within this window count as active.
const ACTIVE_WINDOW_MS: u64 = 3600 * 1000;

pub(super) async fn stats(State(state): State<AppState>) -> Response {
    let store = state.store();
    let counters = state.stats().snapshot();
    let active = store
        .active_since(now_ms().saturating_sub(ACTIVE_WINDOW_MS))
        .await
        .ok();
    let body = json!({
        "uptime_secs": state.started().elapsed().as_secs(),
        "store": {
            "backend": store.backend_name(),
            "healthy": store.is_healthy(),
            "errors": store.errors(),
            "last_error": store.last_error(),
        },
        "active_conversations": active,
        "background_pending": state.compactor().pending_jobs(),
        "savings": savings(&totals(&counters)),
        "counters": counters,
        "compaction": {
            "mode": state.config().compaction.mode,
            "strategy": state.config().compaction.strategy,
            "threshold_tokens": state.config().compaction.threshold_tokens,
            "threshold_ratio": state.config().compaction.threshold_ratio,
        },
        // Context windows learned from the providers: upstream, model, the tenant it
        // holds for (none: confirmed), window, how (overflow, shrunk, asked) and when.
        "learned_windows": state.compactor().learned_windows(),
    });
    axum::Json(body).into_response()
}

/// The totals as one tally (the counters the stats keep of every exchange).
fn totals(s: &Snapshot) -> Tally {
    Tally {
        requests: s.usage_reports,
        client_tokens: s.client_prompt_tokens,
        forwarded_tokens: s.prompt_tokens_reported,
        cached_tokens: s.cached_tokens_reported,
        cache_write_tokens: s.cache_write_tokens_reported,
        output_tokens: s.completion_tokens_reported,
        summary_calls: s.summary_calls,
        summary_input_tokens: s.summary_input_tokens,
        summary_output_tokens: s.summary_output_tokens,
        recalls: s.recalls,
        recall_input_tokens: s.recall_input_tokens,
        recall_output_tokens: s.recall_output_tokens,
        direct_micros: s.cost_direct,
        forwarded_micros: s.cost_forwarded,
        summary_micros: s.cost_summaries,
        recall_micros: s.cost_recalls,
        unpriced: s.unpriced,
    }
}

/// What compaction saved and what it cost, as `/admin/stats` and a conversation show it:
/// tokens as the provider counted them, dollars at the price table.
fn savings(t: &Tally) -> Value {
    let usd = |micros: u64| micros as f64 / 1e6;
    json!({
        "requests": t.requests,
        "client_tokens": t.client_tokens,
        "forwarded_tokens": t.forwarded_tokens,
        "tokens_saved": t.tokens_saved(),
        "cached_tokens": t.cached_tokens,
        "cache_write_tokens": t.cache_write_tokens,
        "output_tokens": t.output_tokens,
        "summaries": {"calls": t.summary_calls, "input_tokens": t.summary_input_tokens,
            "output_tokens": t.summary_output_tokens, "usd": usd(t.summary_micros)},
        "recalls": {"calls": t.recalls, "input_tokens": t.recall_input_tokens,
            "output_tokens": t.recall_output_tokens, "usd": usd(t.recall_micros)},
        "usd": {
            "direct": usd(t.direct_micros),
            "forwarded": usd(t.forwarded_micros),
            "summaries": usd(t.summary_micros),
            "recalls": usd(t.recall_micros),
            "net_saved": t.net_micros() as f64 / 1e6,
        },
        "unpriced": t.unpriced,
        "prices_as_of": crate::prices::BUILT_IN_AS_OF,
    })
}

pub(super) async fn compactions(State(state): State<AppState>) -> Response {
    axum::Json(json!({"compactions": state.compactor().recent_compactions()})).into_response()
}

#[derive(Deserialize)]
pub(super) struct Page {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    50
}

/// Recent conversations (most recent first), each with its state.
pub(super) async fn conversations(
    State(state): State<AppState>,
    Query(page): Query<Page>,
) -> Response {
    let limit = page.limit.min(500);
    let store = state.store();
    let recent = match store.recent(page.offset, limit).await {
        Ok(recent) => recent,
        Err(e) => return store_error(&e),
    };
    let mut items = Vec::with_capacity(recent.len());
    for r in recent {
        let loaded = store.load(&r.conversation).await.ok();
        let account = store.account(&r.conversation).await.ok();
        let state = loaded.as_ref().and_then(|l| l.state.as_ref());
        // The latest report among its histories.
        let latest = loaded.as_ref().and_then(|l| l.usage.first());
        items.push(json!({
            "id": r.conversation,
            "last_seen_ms": r.last_seen_ms,
            "tokens": latest.map(|u| u.tokens),
            "messages": latest.map(|u| u.messages),
            "histories": loaded.as_ref().map(|l| l.usage.len()),
            "compactions": state.map(|s| s.compactions),
            "recalls": account.as_ref().map(|a| a.tally.recalls),
            "checkpoints": loaded.as_ref().map(|l| l.checkpoints.len()),
            "format": account.as_ref().and_then(|a| a.format.clone()),
            "tokens_saved": account.as_ref().map(|a| a.tally.tokens_saved()),
            "net_saved_usd": account.as_ref()
                .filter(|a| a.tally.requests > a.tally.unpriced)
                .map(|a| a.tally.net_micros() as f64 / 1e6),
        }));
    }
    axum::Json(json!({"offset": page.offset, "limit": limit, "conversations": items}))
        .into_response()
}

fn no_such_conversation() -> Response {
    admin_error(
        StatusCode::NOT_FOUND,
        "No such conversation (ids are 64 hex digits).",
        "not_found",
    )
}

fn store_error(e: &crate::store::StoreError) -> Response {
    admin_error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("The store did not answer: {e}"),
        "store_unavailable",
    )
}

/// A checkpoint as the admin API shows it: what it covers, how big, and its text — what
/// abridge wrote; a client message it kept unchanged is shown by its index only (the
/// store does not hold client text it forwards as it came).
fn checkpoint_json(c: &Checkpoint) -> Value {
    let replacement: Vec<Value> = c
        .pieces()
        .map(|piece| match piece {
            Piece::Stored(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
            Piece::Kept(k) => json!({"kept_message": k}),
        })
        .collect();
    json!({
        "through": c.through,
        "head": c.head,
        "messages_replaced": c.messages_replaced(),
        "strategy": c.strategy,
        "fallback": c.fallback,
        "tokens_before": c.tokens_before,
        "tokens_after": c.tokens_after,
        "replacement_bytes": c.replacement_bytes(),
        "created_ms": c.created_ms,
        "summary": c.summary,
        "gate": c.gate,
        "replacement": replacement,
    })
}

pub(super) async fn conversation(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    let loaded = match state.store().load(&id).await {
        Ok(loaded) => loaded,
        Err(e) => return store_error(&e),
    };
    let Some(s) = &loaded.state else {
        return no_such_conversation();
    };
    let account = match state.store().account(&id).await {
        Ok(account) => account,
        Err(e) => return store_error(&e),
    };
    let body = json!({
        "id": id,
        "format": account.format,
        "state": {
            "scheduled": s.scheduled,
            "compactions": s.compactions,
            "recalls": account.tally.recalls,
            "last_seen_ms": s.last_seen_ms,
        },
        "savings": savings(&account.tally),
        "decision": account.verdict.as_ref().map(decision),
        // Its latest requests, oldest first: the prompt as the client sent it and as
        // forwarded (the provider's count), and the checkpoint in force.
        "series": account.series,
        // Each history's last report, newest first.
        "usage": loaded.usage.iter().map(|u| json!({
            "prefix": u.prefix,
            "messages": u.messages,
            "tokens": u.tokens,
            "applied": u.applied,
            "head_tokens": u.head_tokens,
            "growth": u.growth,
            "at_ms": u.at_ms,
        })).collect::<Vec<_>>(),
        "checkpoints": loaded.checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>(),
    });
    axum::Json(body).into_response()
}

/// What was decided for a conversation's latest request: the policy, whether it was
/// compacted and why (as `x-abridge-reason` says it), and what the cost model weighed,
/// its totals in dollars.
fn decision(v: &Verdict) -> Value {
    let usd = |micros: u64| micros as f64 / 1e6;
    let by_cost = v.cost && v.priced;
    let reason = match v.why {
        Some(why) => Some(why.as_str()),
        None => (v.cost && !v.priced && v.compacted).then_some("size-no-price"),
    };
    json!({
        "at_ms": v.at_ms,
        "policy": if by_cost { "cost" } else { "size" },
        "priced": v.priced,
        "compacted": v.compacted,
        "reason": reason,
        "model": v.figures.map(|f| json!({
            "prompt_tokens": f.prompt,
            "as_is_usd": usd(f.as_is_micros),
            "compacted_usd": usd(f.compacted_micros),
            "break_even_requests": f.break_even,
            "remaining_requests": f.remaining,
            "cache": if f.cold { "cold" } else { "warm" },
            "since_last_request_secs": f.since_ms.map(|ms| ms as f64 / 1000.0),
            "threshold_tokens": f.threshold,
            "target_tokens": f.target,
        })),
    })
}

pub(super) async fn delete_conversation(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    match state.store().delete(&id).await {
        Ok(true) => {
            tracing::info!(conversation = %id, "conversation deleted by an operator");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => no_such_conversation(),
        Err(e) => store_error(&e),
    }
}

/// `DELETE /admin/windows[?model=<name>]`'s query.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WindowsQuery {
    model: Option<String>,
}

/// `GET /admin/windows`: the context windows learned from the providers (see
/// [`crate::windows`]).
pub(super) async fn windows(State(state): State<AppState>) -> Response {
    axum::Json(json!({ "learned_windows": state.compactor().learned_windows() })).into_response()
}

/// `DELETE /admin/windows[?model=<name>]`: forgets the learned windows of one model (of
/// every tenant, on every upstream), or all of them, here, in the store and — at their
/// next refresh — on every replica.
pub(super) async fn forget_windows(
    State(state): State<AppState>,
    Query(query): Query<WindowsQuery>,
) -> Response {
    let forgotten = state
        .compactor()
        .forget_windows(query.model.as_deref())
        .await;
    tracing::info!(
        model = query.model.as_deref().unwrap_or("*"),
        forgotten,
        "learned context windows forgotten by an operator"
    );
    axum::Json(json!({ "forgotten": forgotten })).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CompactRequest {
    /// What a summary should keep in particular detail.
    #[serde(default)]
    focus: Option<String>,
}

/// Recompaction happens at the conversation's next turn: abridge keeps checkpoints, not
/// the conversation itself, so the next request (which carries the whole history) is
/// compacted, forced, with the focus for a summarising strategy.
pub(super) async fn schedule_compaction(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(id) = Fingerprint::from_hex(&id) else {
        return no_such_conversation();
    };
    let request: CompactRequest = if body.is_empty() {
        CompactRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return admin_error(
                    StatusCode::BAD_REQUEST,
                    &format!("Invalid body: {e}"),
                    "invalid_body",
                );
            }
        }
    };
    let focus = request.focus.unwrap_or_default();
    match state.store().schedule_compaction(&id, &focus).await {
        Ok(true) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"scheduled": true, "at": "next turn", "focus": focus})),
        )
            .into_response(),
        Ok(false) => no_such_conversation(),
        Err(e) => store_error(&e),
    }
}

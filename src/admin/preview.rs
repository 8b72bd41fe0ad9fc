//! `POST /admin/preview`: what abridge would forward for a request, computed by the same
//! stages a request goes through, without forwarding or storing anything.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::admin_error;
use crate::AppState;
use crate::compactor::{self, Decision, Reason};
use crate::controls::Controls;
use crate::formats::Format;
use crate::headers::Credentials;
use crate::prepare::{Prepared, prepare};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewRequest {
    /// A request body: chat completions, or what `format` says.
    request: Value,
    /// The route's wire format: `chat` (the default), `responses` or `messages`.
    #[serde(default)]
    format: PreviewFormat,
    /// The headers it would carry: the tenant header (e.g. `authorization`) and any
    /// `x-abridge-*` controls.
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum PreviewFormat {
    #[default]
    Chat,
    Responses,
    Messages,
}

impl From<PreviewFormat> for Format {
    fn from(f: PreviewFormat) -> Self {
        match f {
            PreviewFormat::Chat => Format::Chat,
            PreviewFormat::Responses => Format::Responses,
            PreviewFormat::Messages => Format::Messages,
        }
    }
}

#[derive(Serialize)]
struct PreviewPlan {
    head: u32,
    through: u32,
    strategy: String,
    fallback: Option<String>,
    tokens_before: u64,
    tokens_after: u64,
}

/// What abridge would forward for a request, without forwarding it or storing anything.
/// A strategy that needs a summary calls the summariser, as the request would.
pub(super) async fn preview(State(state): State<AppState>, body: Bytes) -> Response {
    let preview: PreviewRequest = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid body: {e}"),
                "invalid_body",
            );
        }
    };
    let mut headers = match header_map(&preview.headers) {
        Ok(h) => h,
        Err(name) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid header {name}"),
                "invalid_header",
            );
        }
    };
    let controls = match Controls::from_headers(&headers, state.config().compaction.allowed()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let bytes = match serde_json::to_vec(&preview.request) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Invalid request: {e}"),
                "invalid_body",
            );
        }
    };
    crate::headers::strip_request(&mut headers);
    let credentials = Credentials::from_headers(
        &headers,
        state.config().identity.tenant_headers.iter().map(|h| &h.0),
    );
    let format: Format = preview.format.into();
    // Whose API it speaks, as if it had come to the format's own route.
    let route = match format {
        Format::Messages => "/v1/messages",
        Format::Chat | Format::Responses => "/v1/chat/completions",
    };
    let provider = crate::upstream::Upstream::provider_of(route, &headers);
    let prepared = match prepare(
        &state,
        Reason::Preview,
        (controls, credentials),
        (format, bytes),
        (None, provider),
    )
    .await
    {
        Ok(p) => p,
        Err((_, e)) => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                &format!("Not a request abridge understands: {e}"),
                "unparseable",
            );
        }
    };
    let turn = prepared.turn();
    let decision = state.compactor().plan(&turn, Reason::Preview).await;
    answer(&decision, &prepared, format)
}

/// The headers of a preview request as a header map, or the name of the first that is
/// not a valid header.
fn header_map(headers: &BTreeMap<String, String>) -> Result<HeaderMap, &str> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return Err(name);
        };
        map.insert(name, value);
    }
    Ok(map)
}

/// The preview's answer: the messages that would be forwarded, the plan, the estimate
/// and the report headers the request would get.
fn answer(decision: &Decision, prepared: &Prepared, format: Format) -> Response {
    let items = prepared.request.items();
    let forwarded: Vec<Value> = match &decision.apply {
        Some(c) => compactor::forwarded(items, c)
            .into_iter()
            .map(|raw| serde_json::from_str(raw.get()).unwrap_or(Value::Null))
            .collect(),
        None => items
            .iter()
            .map(|m| serde_json::from_str(m.raw.get()).unwrap_or(Value::Null))
            .collect(),
    };
    let plan = decision.apply.as_ref().map(|c| PreviewPlan {
        head: c.head,
        through: c.through,
        strategy: c.strategy.to_string(),
        fallback: c.fallback.clone(),
        tokens_before: c.tokens_before,
        tokens_after: c.tokens_after,
    });
    let mut report_headers = HeaderMap::new();
    decision.report.write(&mut report_headers);
    let report: BTreeMap<&str, &str> = report_headers
        .iter()
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        .collect();
    axum::Json(json!({
        "compacted": decision.report.compacted,
        "messages": forwarded,
        "plan": plan,
        "estimate": decision.estimate,
        "threshold": decision.threshold,
        "conversation": prepared.identified.as_ref().map(|i| i.conversation),
        "format": format.name(),
        "headers": report,
    }))
    .into_response()
}

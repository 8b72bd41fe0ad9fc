//! The request's log span, whose fields are formatted only when a line is written.
//!
//! Every request gets a span carrying its id, method and path, and the provider's id
//! once the answer names one (see [`crate::request_id`]). tracing's `fmt` layer formats
//! a span's fields when the span is created or recorded — for every request, although
//! most requests write no line at all. Here the span is created with its fields empty
//! and their values wait in the span's extensions ([`span`], [`record_upstream`]);
//! [`Lazy`], the event format abridge logs with, formats them into the span the first
//! time a line is written inside it (and again only when the provider's id arrived
//! since). A line reads exactly as it would had the fields been formatted eagerly.

use std::fmt;

use http::Method;
use tracing::field::{Empty, Value, display};
use tracing::span::Record;
use tracing::{Event, Span, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use crate::request_id::RequestId;

/// The request span's field values, not yet formatted. Owned copies: a client's id is a
/// slice of the connection's read buffer, which the span (held by a stream's relay for
/// its whole life) would otherwise keep alive.
#[derive(Clone)]
struct Pending {
    id: Box<str>,
    method: Method,
    path: Box<str>,
    upstream: Option<Box<str>>,
    /// Changed since the span's fields were last formatted.
    stale: bool,
}

/// The request's span (at `error` level, so that it exists whenever any of the
/// request's lines is logged: a span's level decides whether it is recorded, not how
/// loud it is). Its fields are those of the request, the path without the query (which
/// may carry a key).
pub fn span(id: &RequestId, method: &Method, path: &str) -> Span {
    let span = tracing::error_span!(
        "request",
        request_id = Empty,
        method = Empty,
        path = Empty,
        upstream_request_id = Empty,
    );
    let pending = Pending {
        id: id.as_str().into(),
        method: method.clone(),
        path: path.into(),
        upstream: None,
        stale: true,
    };
    in_registry(&span, |span| span.extensions_mut().insert(pending));
    span
}

/// Records the provider's request id on the request's span.
pub fn record_upstream(span: &Span, theirs: &str) {
    in_registry(span, |span| {
        if let Some(pending) = span.extensions_mut().get_mut::<Pending>() {
            pending.upstream = Some(theirs.into());
            pending.stale = true;
        }
    });
}

/// Runs `f` on the span's data when a [`Registry`] records the span (not when it is
/// disabled, or under another subscriber).
fn in_registry(span: &Span, f: impl FnOnce(SpanRef<'_, Registry>)) {
    span.with_subscriber(|(id, dispatch)| {
        if let Some(span) = dispatch
            .downcast_ref::<Registry>()
            .and_then(|registry| registry.span(id))
        {
            f(span);
        }
    });
}

/// An event format that first formats the pending fields of the spans the line is
/// written in, then writes the line with `F`.
#[derive(Debug, Clone, Default)]
pub struct Lazy<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for Lazy<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                format_pending(ctx, &span);
            }
        }
        self.0.format_event(ctx, writer, event)
    }
}

/// Formats `span`'s pending fields into its formatted fields, if they changed since.
fn format_pending<S, N>(ctx: &FmtContext<'_, S, N>, span: &SpanRef<'_, S>)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let mut extensions = span.extensions_mut();
    let pending = match extensions.get_mut::<Pending>() {
        Some(pending) if pending.stale => {
            pending.stale = false;
            pending.clone()
        }
        _ => return,
    };
    let Some(formatted) = extensions.get_mut::<FormattedFields<N>>() else {
        return;
    };
    let (id, method, path) = (
        display(&pending.id),
        display(&pending.method),
        display(&pending.path),
    );
    let upstream = pending.upstream.as_deref().map(display);
    // In the order the span declares them.
    let values: [Option<&dyn Value>; 4] = [
        Some(&id),
        Some(&method),
        Some(&path),
        upstream.as_ref().map(|u| u as &dyn Value),
    ];
    let fields = span.metadata().fields();
    if fields.len() != values.len() {
        return;
    }
    let set = fields.value_set_all(&values);
    formatted.fields.clear();
    let _ = ctx.format_fields(formatted.as_writer(), Record::new(&set));
}

#[cfg(test)]
mod tests;

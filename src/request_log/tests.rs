use std::io;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue, Method};
use tracing::field::{Empty, display};
use tracing::{Span, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::fmt::format::DefaultFields;
use tracing_subscriber::fmt::{self, FormattedFields};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

use super::{Lazy, record_upstream, span};
use crate::request_id::RequestId;

/// What a subscriber wrote.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

type Dyn = Box<dyn Subscriber + Send + Sync>;

/// abridge's text and JSON log formats (as `main` sets them up, without the time),
/// with the lazy fields or with tracing's own.
fn subscriber(json: bool, lazy: bool, lines: &Lines) -> Dyn {
    let lines = lines.clone();
    let layer = fmt::layer()
        .with_writer(move || lines.clone())
        .with_ansi(false);
    let text = fmt::format().without_time();
    let json_format = fmt::format()
        .without_time()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false);
    match (json, lazy) {
        (false, false) => Box::new(Registry::default().with(layer.event_format(text))),
        (false, true) => Box::new(Registry::default().with(layer.event_format(Lazy(text)))),
        (true, false) => Box::new(Registry::default().with(layer.json().event_format(json_format))),
        (true, true) => {
            Box::new(Registry::default().with(layer.json().event_format(Lazy(json_format))))
        }
    }
}

fn id() -> RequestId {
    let mut headers = HeaderMap::new();
    headers.insert("x-request-id", HeaderValue::from_static("req-7f3a"));
    RequestId::of(&headers)
}

/// A request's life in the log: lines before and after the provider's id, in a
/// nested span, outside it, and a request that logs nothing.
fn story(lazy: bool) {
    let path = "/v1/chat/completions";
    let (request, quiet) = if lazy {
        (
            span(&id(), &Method::POST, path),
            span(&id(), &Method::GET, "/v1/models"),
        )
    } else {
        let eager = |method: &Method, path: &str| {
            tracing::error_span!(
                "request",
                request_id = %id(),
                method = %method,
                path = %path,
                upstream_request_id = Empty,
            )
        };
        (
            eager(&Method::POST, path),
            eager(&Method::GET, "/v1/models"),
        )
    };
    let upstream = |span: &Span, theirs: &str| {
        if lazy {
            record_upstream(span, theirs);
        } else {
            span.record("upstream_request_id", display(theirs));
        }
    };
    request.in_scope(|| tracing::warn!(tokens = 12, "before the answer"));
    request.in_scope(|| tracing::warn!("once more before it"));
    upstream(&request, "chatcmpl-up-1");
    upstream(&quiet, "never-logged");
    request.in_scope(|| {
        tracing::error_span!("relay", events = 3).in_scope(|| tracing::warn!("in a child span"));
    });
    request.in_scope(|| tracing::warn!("after the answer"));
    tracing::warn!("outside any request");
}

fn written(json: bool, lazy: bool) -> String {
    let lines = Lines::default();
    tracing::subscriber::with_default(subscriber(json, lazy, &lines), || story(lazy));
    lines.text()
}

#[test]
fn lines_read_as_if_the_fields_were_formatted_eagerly() {
    for json in [false, true] {
        let eager = written(json, false);
        let lazy = written(json, true);
        assert_eq!(lazy, eager, "json: {json}");
        assert_eq!(lazy.lines().count(), 5, "{lazy}");
    }
    let text = written(false, true);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("request{request_id=req-7f3a method=POST path=/v1/chat/completions}:"),
        "{text}"
    );
    assert!(
        lines[3].contains("upstream_request_id=chatcmpl-up-1}"),
        "{text}"
    );
    assert!(lines[2].contains("}:relay{events=3}:"), "{text}");
    assert!(
        !text.contains("never-logged") && !text.contains("/v1/models"),
        "{text}"
    );
    let json = written(true, true);
    let last: serde_json::Value = serde_json::from_str(json.lines().nth(3).unwrap()).unwrap();
    assert_eq!(last["span"]["request_id"], "req-7f3a", "{json}");
    assert_eq!(
        last["span"]["upstream_request_id"], "chatcmpl-up-1",
        "{json}"
    );
}

/// The span's formatted fields, as the fmt layer keeps them.
fn formatted(span: &Span) -> String {
    let mut out = None;
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<Registry>().unwrap();
        let span = registry.span(id).unwrap();
        let fields = span
            .extensions()
            .get::<FormattedFields<DefaultFields>>()
            .map(|f| f.fields.clone());
        out = fields;
    });
    out.expect("a recorded span with formatted fields")
}

#[test]
fn nothing_is_formatted_until_a_line_is_written() {
    let lines = Lines::default();
    tracing::subscriber::with_default(subscriber(false, true, &lines), || {
        let request = span(&id(), &Method::POST, "/v1/messages");
        record_upstream(&request, "msg_up");
        assert_eq!(formatted(&request), "");
        request.in_scope(|| tracing::warn!("now"));
        let fields = formatted(&request);
        assert!(
            fields.contains("request_id=req-7f3a") && fields.contains("msg_up"),
            "{fields}"
        );
    });
    assert_eq!(lines.text().lines().count(), 1);
}

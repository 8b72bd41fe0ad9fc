//! abridge's own errors: one type, tagged by origin, answered in the route's error shape.
//!
//! Provider errors are not represented here: they pass through with their own status and
//! body. What is here is what abridge itself answers — an unknown path, a body over the
//! limit, an unreachable or silent provider — as OpenAI's
//! `{"error":{"message","type","param","code"}}`, or on Anthropic's routes
//! (`/v1/messages…`) as Anthropic's `{"type":"error","error":{"type","message"}}`, so
//! each SDK surfaces it like any API error of its provider ([`Shape`]).

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// Which provider's error shape a route answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shape {
    #[default]
    OpenAi,
    Anthropic,
}

impl Shape {
    /// Anthropic's shape on Anthropic's routes (`/v1/messages` and below), OpenAI's
    /// everywhere else.
    pub fn for_path(path: &str) -> Self {
        match path.strip_prefix("/v1/messages") {
            Some("") => Shape::Anthropic,
            Some(rest) if rest.starts_with('/') => Shape::Anthropic,
            _ => Shape::OpenAi,
        }
    }
}

/// Who caused an error: decides the status class and whether it is worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The client's request (4xx).
    Client,
    /// The provider could not be reached or did not answer (5xx, retryable).
    Upstream,
    /// abridge itself (5xx).
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Unknown path {method} {path}")]
    NotFound { method: String, path: String },
    #[error(
        "Unknown path {method} {path}: Azure OpenAI's /openai/ paths are served when the upstream is an Azure v1 base, e.g. upstream = \"https://RESOURCE.openai.azure.com/openai/v1\""
    )]
    NotAzure { method: String, path: String },
    #[error(
        "Invalid request path: dot segments, encoded slashes or backslashes, backslashes, `;` parameters, double percent-encoding and empty segments are not allowed"
    )]
    BadPath,
    #[error("Invalid value `{value}` for header {header}: expected {expected}")]
    BadHeader {
        header: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "Request body is larger than this proxy's limit of {limit} bytes (limits.max_body_bytes)"
    )]
    BodyTooLarge { limit: usize },
    #[error("Could not read the request body: {0}")]
    ClientBody(String),
    #[error("abridge could not reach the upstream provider: {0}")]
    UpstreamUnreachable(String),
    #[error("The upstream provider did not answer within {}s (timeouts.first_byte_ms)", .0.as_secs_f64())]
    UpstreamTimeout(Duration),
    #[error("abridge is at its limit ({0}); retry shortly")]
    Overloaded(&'static str),
    #[error("The request body did not arrive within {}s (timeouts.{key})", .after.as_secs_f64())]
    BodyTimeout { after: Duration, key: &'static str },
    #[error("Internal error in abridge: {0}")]
    Internal(String),
    /// A request abridge answers itself that asks for what cannot be done (the message
    /// says what, as the provider would).
    #[error("{message}")]
    InvalidValue {
        message: &'static str,
        param: &'static str,
    },
}

impl Error {
    pub fn origin(&self) -> Origin {
        match self {
            Error::NotFound { .. }
            | Error::NotAzure { .. }
            | Error::BadPath
            | Error::BadHeader { .. }
            | Error::BodyTooLarge { .. }
            | Error::ClientBody(_)
            | Error::BodyTimeout { .. }
            | Error::InvalidValue { .. } => Origin::Client,
            Error::Overloaded(_) => Origin::Internal,
            Error::UpstreamUnreachable(_) | Error::UpstreamTimeout(_) => Origin::Upstream,
            Error::Internal(_) => Origin::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::NotFound { .. } | Error::NotAzure { .. } => StatusCode::NOT_FOUND,
            Error::BadPath
            | Error::BadHeader { .. }
            | Error::ClientBody(_)
            | Error::InvalidValue { .. } => StatusCode::BAD_REQUEST,
            Error::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Error::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Error::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and a stable machine-readable `code`.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Error::NotFound { .. } | Error::NotAzure { .. } => {
                ("invalid_request_error", "unknown_url")
            }
            Error::BadPath => ("invalid_request_error", "invalid_path"),
            Error::BadHeader { .. } => ("invalid_request_error", "invalid_header"),
            Error::BodyTooLarge { .. } => ("invalid_request_error", "request_too_large"),
            Error::ClientBody(_) => ("invalid_request_error", "invalid_body"),
            Error::InvalidValue { .. } => ("invalid_request_error", "invalid_value"),
            Error::BodyTimeout { .. } => ("invalid_request_error", "body_timeout"),
            Error::Overloaded(_) => ("server_error", "overloaded"),
            Error::UpstreamUnreachable(_) => ("upstream_error", "upstream_unreachable"),
            Error::UpstreamTimeout(_) => ("upstream_error", "upstream_timeout"),
            Error::Internal(_) => ("server_error", "internal_error"),
        }
    }

    /// The OpenAI-shaped JSON body.
    pub fn body(&self) -> Bytes {
        #[derive(Serialize)]
        struct Envelope<'a> {
            error: Body<'a>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            message: String,
            r#type: &'a str,
            param: Option<&'a str>,
            code: &'a str,
        }
        let (r#type, code) = self.kind();
        let param = match self {
            Error::BadHeader { header, .. } => Some(*header),
            Error::InvalidValue { param, .. } => Some(*param),
            _ => None,
        };
        let envelope = Envelope {
            error: Body {
                message: self.to_string(),
                r#type,
                param,
                code,
            },
        };
        serde_json::to_vec(&envelope)
            .map(Bytes::from)
            .unwrap_or_else(|_| Bytes::from_static(br#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#))
    }
}

impl Error {
    /// Anthropic's error `type` for this error (by its status, as Anthropic types them).
    fn anthropic_type(&self) -> &'static str {
        match self.status().as_u16() {
            400 | 408 => "invalid_request_error",
            404 => "not_found_error",
            413 => "request_too_large",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The body in `shape`.
    pub fn body_in(&self, shape: Shape) -> Bytes {
        match shape {
            Shape::OpenAi => self.body(),
            Shape::Anthropic => {
                let body = serde_json::json!({
                    "type": "error",
                    "error": {"type": self.anthropic_type(), "message": self.to_string()},
                });
                Bytes::from(body.to_string())
            }
        }
    }

    /// The response, with its body in `shape`.
    pub fn response_in(self, shape: Shape) -> Response {
        match (&self, self.origin()) {
            // A load signal, not a fault: the caller retries (Retry-After).
            (Error::Overloaded(_), _) => tracing::debug!(error = %self, "request refused"),
            (_, Origin::Client) => tracing::debug!(error = %self, "rejected request"),
            (_, Origin::Upstream) => tracing::warn!(error = %self, "upstream failure"),
            (_, Origin::Internal) => tracing::error!(error = %self, "internal error"),
        }
        let mut response = (self.status(), self.body_in(shape)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, Error::Overloaded(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        self.response_in(Shape::OpenAi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = Error::BodyTooLarge { limit: 10 };
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        let err = &v["error"];
        assert!(err["message"].as_str().unwrap().contains("10 bytes"));
        assert_eq!(err["type"], "invalid_request_error");
        assert_eq!(err["code"], "request_too_large");
        assert!(err["param"].is_null());
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn anthropic_routes_get_anthropic_shape() {
        assert_eq!(Shape::for_path("/v1/messages"), Shape::Anthropic);
        assert_eq!(
            Shape::for_path("/v1/messages/count_tokens"),
            Shape::Anthropic
        );
        assert_eq!(Shape::for_path("/v1/messagesx"), Shape::OpenAi);
        assert_eq!(Shape::for_path("/v1/chat/completions"), Shape::OpenAi);
        let e = Error::UpstreamTimeout(Duration::from_secs(3));
        let v: serde_json::Value = serde_json::from_slice(&e.body_in(Shape::Anthropic)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("3s"));
        let e = Error::BodyTooLarge { limit: 1 };
        let v: serde_json::Value = serde_json::from_slice(&e.body_in(Shape::Anthropic)).unwrap();
        assert_eq!(v["error"]["type"], "request_too_large");
    }
}

//! abridge's own errors: one type, tagged by origin, answered in OpenAI's error shape.
//!
//! Provider errors are not represented here: they pass through with their own status and
//! body. What is here is what abridge itself answers — an unknown path, a body over the
//! limit, an unreachable or silent provider — as
//! `{"error":{"message","type","param","code"}}` so SDKs surface it like any API error.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

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
        "Invalid request path: dot segments, encoded slashes or backslashes, backslashes and `;` parameters are not allowed"
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
    #[error("The request body did not arrive within {}s (timeouts.client_body_ms)", .0.as_secs_f64())]
    BodyTimeout(Duration),
    #[error("Internal error in abridge: {0}")]
    Internal(String),
}

impl Error {
    pub fn origin(&self) -> Origin {
        match self {
            Error::NotFound { .. }
            | Error::BadPath
            | Error::BadHeader { .. }
            | Error::BodyTooLarge { .. }
            | Error::ClientBody(_)
            | Error::BodyTimeout(_) => Origin::Client,
            Error::Overloaded(_) => Origin::Internal,
            Error::UpstreamUnreachable(_) | Error::UpstreamTimeout(_) => Origin::Upstream,
            Error::Internal(_) => Origin::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::NotFound { .. } => StatusCode::NOT_FOUND,
            Error::BadPath | Error::BadHeader { .. } | Error::ClientBody(_) => {
                StatusCode::BAD_REQUEST
            }
            Error::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Error::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Error::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and a stable machine-readable `code`.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Error::NotFound { .. } => ("invalid_request_error", "unknown_url"),
            Error::BadPath => ("invalid_request_error", "invalid_path"),
            Error::BadHeader { .. } => ("invalid_request_error", "invalid_header"),
            Error::BodyTooLarge { .. } => ("invalid_request_error", "request_too_large"),
            Error::ClientBody(_) => ("invalid_request_error", "invalid_body"),
            Error::BodyTimeout(_) => ("invalid_request_error", "body_timeout"),
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

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        match (&self, self.origin()) {
            // A load signal, not a fault: the caller retries (Retry-After).
            (Error::Overloaded(_), _) => tracing::debug!(error = %self, "request refused"),
            (_, Origin::Client) => tracing::debug!(error = %self, "rejected request"),
            (_, Origin::Upstream) => tracing::warn!(error = %self, "upstream failure"),
            (_, Origin::Internal) => tracing::error!(error = %self, "internal error"),
        }
        let mut response = (self.status(), self.body()).into_response();
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
}

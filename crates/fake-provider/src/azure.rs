//! Azure OpenAI's paths, answered as Azure answers them, before the ordinary routes see
//! the request.
//!
//! - The classic API, `/openai/…` (`/openai/deployments/{deployment}/chat/completions`,
//!   `/openai/models`, `/openai/responses`, …): a credential is required — an `api-key`
//!   header, or `Authorization: Bearer` (an Entra ID token) — else `401`; an
//!   `api-version` query is required, else `404 Resource not found`; one that is not a
//!   dated version (`2024-10-21`, `2025-04-01-preview`) is `400 API version not
//!   supported`. On a deployment path the model is the deployment's: the body's `model`
//!   is replaced by the deployment name, so the answer names it.
//! - The v1 base, `/openai/v1/…`: the same credential rule; `api-version` is optional,
//!   and only `preview`, `latest` or `v1` are accepted. `/openai/v1/deployments/…` does
//!   not exist (`404`), as on Azure: the v1 API takes the deployment from the body.
//!
//! Errors have Azure's shape, `{"error":{"code":"404","message":"Resource not found"}}`.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};

const ROOT: &str = "/openai/";
const V1: &str = "/openai/v1/";
const DEPLOYMENTS: &str = "deployments/";

/// Why Azure refuses a request before any route sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `api-key` (nor bearer token): 401.
    Unauthorized,
    /// No `api-version` on the classic API, or a path Azure does not have: 404.
    NotFound,
    /// An `api-version` the API does not know: 400.
    Unsupported,
}

impl Refusal {
    /// Azure's answer, the request complete.
    pub(crate) fn response_for(self, completion: crate::Completion) -> Response {
        completion.complete();
        self.response()
    }

    /// Azure's answer.
    pub(crate) fn response(self) -> Response {
        match self {
            Refusal::Unauthorized => error(
                StatusCode::UNAUTHORIZED,
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
            ),
            Refusal::NotFound => error(StatusCode::NOT_FOUND, "404", "Resource not found"),
            Refusal::Unsupported => error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "API version not supported",
            ),
        }
    }
}

/// The body the ordinary routes answer (the deployment's model put in on a deployment
/// path), or Azure's refusal. Requests outside `/openai/` pass unchanged.
pub(crate) fn admit(parts: &http::request::Parts, body: Bytes) -> Result<Bytes, Refusal> {
    let path = parts.uri.path();
    let Some(below) = path.strip_prefix(ROOT) else {
        return Ok(body);
    };
    if !has_credential(&parts.headers) {
        return Err(Refusal::Unauthorized);
    }
    let version = api_version(parts.uri.query());
    if let Some(rest) = path.strip_prefix(V1) {
        if rest.starts_with(DEPLOYMENTS) {
            return Err(Refusal::NotFound);
        }
        return match version {
            Some(v) if !matches!(v, "preview" | "latest" | "v1") => Err(Refusal::Unsupported),
            _ => Ok(body),
        };
    }
    match version {
        None => return Err(Refusal::NotFound),
        Some(v) if !is_dated(v) => return Err(Refusal::Unsupported),
        Some(_) => {}
    }
    match below
        .strip_prefix(DEPLOYMENTS)
        .and_then(|r| r.split_once('/'))
    {
        Some((deployment, _)) if !deployment.is_empty() => Ok(with_model(body, deployment)),
        _ if below.starts_with(DEPLOYMENTS) => Err(Refusal::NotFound),
        _ => Ok(body),
    }
}

fn has_credential(headers: &HeaderMap) -> bool {
    let present = |name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().is_empty())
    };
    present("api-key")
        || headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("Bearer ") && v.len() > "Bearer ".len())
}

fn api_version(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("api-version="))
}

/// `YYYY-MM-DD` or `YYYY-MM-DD-preview`.
fn is_dated(version: &str) -> bool {
    let date = version.strip_suffix("-preview").unwrap_or(version);
    let b = date.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// The JSON body with `model` set to the deployment (a body that is not a JSON object
/// is left for the route to refuse).
fn with_model(body: Bytes, deployment: &str) -> Bytes {
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut object)) => {
            object.insert("model".into(), deployment.into());
            serde_json::to_vec(&object).map(Bytes::from).unwrap_or(body)
        }
        _ => body,
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&'static str, &'static str)]) -> http::request::Parts {
        let mut request = http::Request::post(uri);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn status(uri: &str, headers: &[(&'static str, &'static str)]) -> u16 {
        match admit(&parts(uri, headers), Bytes::from_static(b"{}")) {
            Ok(_) => 200,
            Err(refusal) => refusal.response().status().as_u16(),
        }
    }

    #[test]
    fn answers_as_azure_does() {
        let key = [("api-key", "k")];
        let classic = "/openai/deployments/gpt-4o/chat/completions";
        assert_eq!(
            status(&format!("{classic}?api-version=2024-10-21"), &key),
            200
        );
        assert_eq!(
            status(&format!("{classic}?api-version=2025-04-01-preview"), &key),
            200
        );
        assert_eq!(
            status(&format!("{classic}?api-version=2024-10-21"), &[]),
            401
        );
        assert_eq!(
            status(
                &format!("{classic}?api-version=2024-10-21"),
                &[("authorization", "Bearer entra")]
            ),
            200
        );
        assert_eq!(status(classic, &key), 404);
        assert_eq!(status(&format!("{classic}?api-version=v2"), &key), 400);
        assert_eq!(status("/openai/models?api-version=2024-10-21", &key), 200);
        assert_eq!(status("/openai/v1/chat/completions", &key), 200);
        assert_eq!(
            status("/openai/v1/responses?api-version=preview", &key),
            200
        );
        assert_eq!(
            status("/openai/v1/responses?api-version=2024-10-21", &key),
            400
        );
        assert_eq!(status("/openai/v1/chat/completions", &[]), 401);
        assert_eq!(
            status("/openai/v1/deployments/gpt-4o/chat/completions", &key),
            404
        );
        // Not Azure's: untouched.
        assert_eq!(status("/v1/chat/completions", &[]), 200);
    }

    #[test]
    fn the_deployment_is_the_model() {
        let body = admit(
            &parts(
                "/openai/deployments/prod-4o/chat/completions?api-version=2024-10-21",
                &[("api-key", "k")],
            ),
            Bytes::from_static(br#"{"messages":[]}"#),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["model"], "prod-4o");
    }
}

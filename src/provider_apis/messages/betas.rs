//! The client's `anthropic-beta` header as a Messages upstream that lacks compaction
//! and context editing is to see it: without the beta values of the features abridge
//! serves in its place ([`SERVED`]), every other value kept in its order.
//!
//! The header is a comma-separated list, possibly over several lines. A line that names
//! none of the served values goes on byte for byte; one that does is written again with
//! what is left (comma-joined, as the Anthropic SDKs write it), or dropped when nothing
//! is left — and with it the header, when no line is left. Each line is read once; the
//! server has already bounded the headers.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The beta values of what abridge serves on the Messages route: `compact_20260112`
/// (`compact-2026-01-12`), `clear_tool_uses_20250919` and `clear_thinking_20251015`
/// (`context-management-2025-06-27`).
pub const SERVED: [&str; 2] = ["compact-2026-01-12", "context-management-2025-06-27"];

static ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");

/// Takes the [`SERVED`] values out of `headers`' `anthropic-beta` (see the module docs).
/// A value is compared in any ASCII case: abridge never reads the header to decide what
/// it serves (the body says), so a value spelled otherwise is still one a validating
/// upstream would refuse.
pub fn withhold(headers: &mut HeaderMap) {
    let mut changed = false;
    let mut lines: Vec<HeaderValue> = Vec::new();
    for line in headers.get_all(&ANTHROPIC_BETA) {
        let values = line
            .as_bytes()
            .split(|b| *b == b',')
            .map(<[u8]>::trim_ascii);
        if !values.clone().any(is_served) {
            lines.push(line.clone());
            continue;
        }
        changed = true;
        let kept: Vec<&[u8]> = values.filter(|v| !v.is_empty() && !is_served(v)).collect();
        if kept.is_empty() {
            continue;
        }
        // Bytes of a valid value, joined by commas: valid too.
        if let Ok(mut value) = HeaderValue::from_bytes(&kept.join(&b","[..])) {
            value.set_sensitive(line.is_sensitive());
            lines.push(value);
        }
    }
    if !changed {
        return;
    }
    headers.remove(&ANTHROPIC_BETA);
    for line in lines {
        headers.append(ANTHROPIC_BETA.clone(), line);
    }
}

fn is_served(value: &[u8]) -> bool {
    SERVED
        .iter()
        .any(|served| value.eq_ignore_ascii_case(served.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn withheld(lines: &[&'static str]) -> Vec<String> {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        for line in lines {
            headers.append(&ANTHROPIC_BETA, HeaderValue::from_static(line));
        }
        withhold(&mut headers);
        assert_eq!(headers["anthropic-version"], "2023-06-01");
        headers
            .get_all(&ANTHROPIC_BETA)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_served_values_go_and_every_other_stays_in_order() {
        assert_eq!(
            withheld(&[
                "claude-code-20250219,context-management-2025-06-27,oauth-2025-04-20,compact-2026-01-12,interleaved-thinking-2025-05-14"
            ]),
            ["claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14"]
        );
        // Whitespace around values and empty elements; any ASCII case.
        assert_eq!(
            withheld(&[" oauth-2025-04-20 ,\t Compact-2026-01-12 ,, files-api-2025-04-14 "]),
            ["oauth-2025-04-20,files-api-2025-04-14"]
        );
        // Several lines: one without a served value is kept byte for byte, one left
        // empty is dropped.
        assert_eq!(
            withheld(&[
                "oauth-2025-04-20 , x",
                "compact-2026-01-12, context-management-2025-06-27",
                "context-management-2025-06-27,y",
            ]),
            ["oauth-2025-04-20 , x", "y"]
        );
        // A value that only contains a served one is another value.
        assert_eq!(
            withheld(&["compact-2026-01-12-preview,xcompact-2026-01-12"]),
            ["compact-2026-01-12-preview,xcompact-2026-01-12"]
        );
    }

    #[test]
    fn the_header_goes_when_nothing_is_left() {
        assert!(withheld(&["compact-2026-01-12,context-management-2025-06-27"]).is_empty());
        assert!(withheld(&[" compact-2026-01-12 ", "context-management-2025-06-27"]).is_empty());
        assert!(withheld(&[]).is_empty());
    }
}

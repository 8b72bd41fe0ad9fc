//! A client's request path (and whether it carries Anthropic's credential style) → the
//! upstream URI: never another scheme, host or port; always below the configured base;
//! nothing appended that a server could read as a dot segment, an encoded separator, a
//! double encoding or an empty segment.
#![no_main]

use std::sync::LazyLock;

use abridge::config::Config;
use abridge::upstream::Upstream;
use http::{HeaderMap, HeaderValue, Method, Uri};
use libfuzzer_sys::fuzz_target;

static UPSTREAM: LazyLock<Upstream> = LazyLock::new(|| {
    let config = Config {
        upstream: "https://api.openai.example/team/v1".parse().unwrap(),
        anthropic_upstream: Some("https://api.anthropic.example/v1".parse().unwrap()),
        ..Config::default()
    };
    Upstream::new(&config).unwrap()
});

/// What a server reading `text` percent-decoded (once, or twice) could take for a
/// dot segment or a separator.
fn decodes_to_trouble(segment: &str) -> bool {
    let once = percent(segment);
    let twice = percent(&String::from_utf8_lossy(&once));
    [once, twice].iter().any(|d| {
        d == b"." || d == b".." || d.iter().any(|b| matches!(b, b'/' | b'\\' | 0))
    })
}

fn percent(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, path)) = data.split_first() else {
        return;
    };
    let Ok(uri) = Uri::try_from(path) else {
        return;
    };
    let mut headers = HeaderMap::new();
    if flags & 1 == 1 {
        headers.insert("x-api-key", HeaderValue::from_static("sk-ant-fuzz"));
    }
    let method = if flags & 2 == 2 { Method::GET } else { Method::POST };
    let Ok((target, provider)) = UPSTREAM.route(&method, &uri, &headers) else {
        return;
    };
    let (authority, base) = match provider {
        abridge::headers::Provider::Anthropic => ("api.anthropic.example", "/v1"),
        abridge::headers::Provider::Main => ("api.openai.example", "/team"),
    };
    assert_eq!(target.scheme_str(), Some("https"), "{target}");
    assert_eq!(target.authority().map(|a| a.as_str()), Some(authority), "{target}");
    if flags & 1 == 1 {
        assert_eq!(provider, abridge::headers::Provider::Anthropic, "{target}");
    }
    let out = target.path();
    assert!(out.starts_with(base), "{target} is not below {base}");
    let rest = &out[base.len()..];
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    for (i, segment) in segments.iter().enumerate() {
        assert!(
            !segment.is_empty() || i + 1 == segments.len(),
            "empty segment in {target}"
        );
        assert!(!decodes_to_trouble(segment), "{segment:?} in {target}");
    }
    assert_eq!(target.query(), uri.query());
});

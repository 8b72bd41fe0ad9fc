//! A request's headers as a client may send them: abridge's controls (`x-abridge-*`),
//! the request id it adopts and sends on, the credentials it keys tenants and payers by,
//! and the hygiene before forwarding. Never a panic; never an `x-abridge-*` header, a
//! hop-by-hop header or more than one `x-request-id` upstream; ids visible ASCII.
#![no_main]

use abridge::config::Config;
use abridge::controls::Controls;
use abridge::headers::{self, Credentials, Provider};
use abridge::request_id::RequestId;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

/// Lines of `name: value` (the value's bytes as sent).
fn headers_of(data: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) else {
            continue;
        };
        map.append(name, value);
    }
    map
}

fuzz_target!(|data: &[u8]| {
    let mut map = headers_of(data);
    let allowed = Config::default().compaction.allowed();
    let _ = Controls::from_headers(&map, allowed);
    let id = RequestId::of(&map);
    assert!(!id.as_str().is_empty() && id.as_str().len() <= 128);
    assert!(id.as_str().bytes().all(|b| b.is_ascii_graphic()), "{id}");
    headers::strip_request(&mut map);
    id.propagate(&mut map);
    assert_eq!(map.get_all("x-request-id").iter().count(), 1);
    assert!(!map.keys().any(|k| k.as_str().starts_with("x-abridge-")));
    for hop in ["connection", "keep-alive", "te", "transfer-encoding", "upgrade", "host"] {
        assert!(!map.contains_key(hop), "{hop}");
    }
    let names = Config::default().identity.tenant_headers;
    let credentials = Credentials::from_headers(&map, names.iter().map(|h| &h.0));
    let tenant = credentials.tenant();
    assert_eq!(tenant.is_empty(), credentials.is_empty());
    for provider in [Provider::Main, Provider::Anthropic] {
        for azure in [false, true] {
            let payer = credentials.payer(provider, azure);
            // The payer is one of the tenant's credentials, never more.
            assert!(payer.len() <= tenant.len());
        }
    }
    assert!(!format!("{credentials:?}").contains("Bearer"));
});

//! A Responses request body from a client: the borrowed parse of the request and of
//! every input item (the walk over an item agreeing with serde), and the splice abridge makes (the input replaced by a subset),
//! which must yield a body that parses again to what was kept, every other byte intact.
#![no_main]

use abridge::formats::responses;
use abridge::json::Raw;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The validating pass accepts and refuses the bodies serde_json does (objects at
    // the top: the rest is left to serde).
    if let Ok(text) = std::str::from_utf8(data) {
        assert!(abridge::json::agrees_with_serde(text), "{text:?}");
    }
    // The top level found by the validating pass reads as serde reads it (the same
    // request and items, or the same error).
    assert_eq!(
        format!("{:?}", responses::parse(data)),
        format!("{:?}", responses::parse_by_serde(data)),
    );
    // Each item is read by a walk over its bytes: it must read what serde reads (the
    // same item, or a refusal where serde refuses).
    if let Ok(fields) = serde_json::from_slice::<responses::Fields<'_>>(data) {
        let raw: Vec<Raw<'_>> = fields
            .input
            .and_then(|m| serde_json::from_str(m.get()).ok())
            .unwrap_or_default();
        for raw in raw {
            assert_eq!(
                responses::item(raw).ok(),
                responses::item_by_serde(raw).ok(),
                "item {:?}",
                raw.get()
            );
        }
    }
    let body = Bytes::copy_from_slice(data);
    let Ok(parsed) = responses::parse(&body) else {
        return;
    };
    assert_eq!(parsed.items.len(), parsed.raw_items.len());
    for (item, raw) in parsed.items.iter().zip(&parsed.raw_items) {
        assert_eq!(item.raw.get(), raw.get());
        // A digest replaces only the output, and is recognised as such.
        if item.is_result()
            && let Some(digest) = responses::with_output(item.raw, "[elided]")
        {
            assert!(responses::same_but_output(Raw::from(&*digest), item.raw));
        }
    }
    // Keep every other item, as a compaction keeps a subset.
    let kept: Vec<_> = parsed.raw_items.iter().copied().step_by(2).collect();
    let Some(out) = responses::with_input(&body, &parsed, &kept) else {
        return;
    };
    let again = responses::parse(&out).unwrap_or_else(|e| {
        panic!(
            "the spliced body does not parse: {e}\n{}",
            String::from_utf8_lossy(&out)
        )
    });
    let got: Vec<&str> = again.raw_items.iter().map(|r| r.get()).collect();
    let want: Vec<&str> = kept.iter().map(|r| r.get()).collect();
    assert_eq!(got, want);
});

//! A chat-completions request body from a client: the borrowed parse of the request and
//! of every message (the walk over a message agreeing with serde), and the splices
//! abridge makes (usage requested, messages replaced), which must yield a body that
//! parses again to what was kept.
#![no_main]

use abridge::formats::chat;
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
        format!("{:?}", chat::parse(data)),
        format!("{:?}", chat::parse_by_serde(data)),
    );
    // Each message is read by a walk over its bytes: it must read what serde reads
    // (the same item, or a refusal where serde refuses).
    if let Ok(request) = serde_json::from_slice::<chat::ChatRequest<'_>>(data) {
        for &raw in &request.messages {
            assert_eq!(
                chat::item(raw).ok(),
                chat::item_by_serde(raw).ok(),
                "message {:?}",
                raw.get()
            );
        }
    }
    let Ok(parsed) = chat::parse(data) else {
        return;
    };
    let request = &parsed.request;
    assert_eq!(parsed.messages.len(), request.messages.len());
    // Each message's typed view keeps its exact bytes (what is forwarded when kept). What
    // abridge reads from the views is exercised by the `identity` target.
    for (m, raw) in parsed.messages.iter().zip(&request.messages) {
        assert_eq!(m.raw.get(), raw.get());
    }

    // Keep every other message (the first, the third…), as a compaction keeps a subset.
    let kept: Vec<_> = request.messages.iter().copied().step_by(2).collect();
    let usage = chat::usage_edit(data, request);
    let messages = chat::messages_edit(data, request, &kept);
    let edits: Vec<_> = usage.iter().chain(&messages).cloned().collect();
    let expected = if messages.is_some() {
        kept.iter().map(|m| m.get()).collect()
    } else {
        request.messages.iter().map(|m| m.get()).collect::<Vec<_>>()
    };
    let Some(body) = abridge::formats::splice::apply(data, edits.clone()) else {
        // Edits computed from one parse never overlap: `None` only for no edit at all.
        assert!(
            edits.is_empty(),
            "apply refused the edits of one parse: {edits:?}"
        );
        return;
    };
    let again = chat::parse(&body).unwrap_or_else(|e| {
        panic!(
            "the spliced body no longer parses: {e}\nbody: {:?}",
            String::from_utf8_lossy(&body)
        )
    });
    let got: Vec<_> = again.request.messages.iter().map(|m| m.get()).collect();
    assert_eq!(got, expected, "the spliced body holds other messages");
    assert_eq!(again.request.model, request.model);
    assert_eq!(again.request.stream, request.stream);
    if usage.is_some() {
        // Usage is asked for now: asking again changes nothing.
        assert_eq!(chat::usage_edit(&body, &again.request), None);
    }
});

//! A provider's server-sent-events stream, cut into chunks at fuzzer-chosen places, through
//! the usage tap in both modes. Observe mode must pass every byte through unchanged;
//! strip mode must not depend on where the chunks were cut.
//!
//! Input layout: byte 0 is a header (low 4 bits: how many chunk sizes follow, 0–15; bit
//! 4: repeat those sizes until the stream ends), then the sizes (one byte each, 0 is an
//! empty chunk), then the stream; whatever the sizes do not cover is the last chunk.
#![no_main]

use abridge::relay::sse::SseTap;
use abridge::relay::usage::Usage;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

/// The stream cut into chunks as the header says.
fn chunks(data: &[u8]) -> (&[u8], Vec<&[u8]>) {
    let Some((&header, rest)) = data.split_first() else {
        return (&[], Vec::new());
    };
    let count = usize::from(header & 0x0f).min(rest.len());
    let (sizes, stream) = rest.split_at(count);
    let repeat = header & 0x10 != 0;
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while i < sizes.len() && at < stream.len() {
        let end = (at + usize::from(sizes[i])).min(stream.len());
        out.push(&stream[at..end]);
        at = end;
        i += 1;
        // Repeat the sizes; an all-zero list would never advance.
        if repeat && i == sizes.len() && sizes.iter().any(|&s| s > 0) {
            i = 0;
        }
    }
    if at < stream.len() || out.is_empty() {
        out.push(&stream[at..]);
    }
    (stream, out)
}

struct Run {
    out: Vec<u8>,
    usage: Option<Usage>,
    dropped: u32,
}

fn run(strip: bool, chunks: &[&[u8]]) -> Run {
    let mut tap = SseTap::new(strip);
    assert_eq!(tap.strips(), strip);
    let mut out = Vec::new();
    for chunk in chunks {
        let sent = tap.feed(Bytes::copy_from_slice(chunk));
        if !strip {
            assert_eq!(&sent[..], *chunk, "observe mode changed a chunk");
        }
        out.extend_from_slice(&sent);
    }
    out.extend_from_slice(&tap.finish());
    Run {
        out,
        usage: tap.usage(),
        dropped: tap.dropped_events(),
    }
}

fuzz_target!(|data: &[u8]| {
    let (stream, cut) = chunks(data);
    let whole = [stream];

    let observed = run(false, &cut);
    assert_eq!(observed.out, stream, "observe mode changed the stream");
    assert_eq!(observed.dropped, 0);
    let observed_whole = run(false, &whole);
    assert_eq!(
        observed.usage, observed_whole.usage,
        "the usage read depends on the chunking"
    );

    let stripped = run(true, &cut);
    let stripped_whole = run(true, &whole);
    assert!(stripped.out.len() <= stream.len(), "strip mode added bytes");
    assert_eq!(
        stripped.out, stripped_whole.out,
        "strip mode's output depends on the chunking"
    );
    assert_eq!(stripped.usage, stripped_whole.usage);
    assert_eq!(stripped.dropped, stripped_whole.dropped);
    assert_eq!(
        stripped.usage, observed.usage,
        "the modes read different usage"
    );
    if !stream.windows(7).any(|w| w == b"\"usage\"") {
        assert_eq!(
            stripped.out, stream,
            "strip mode changed a stream without usage"
        );
    }
});

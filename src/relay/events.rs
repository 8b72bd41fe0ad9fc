//! Server-sent events read one at a time from what arrived: the first complete event of
//! a stretch of stream, its fields, and the bytes it took (blank line included). Lines
//! end in LF, CRLF or CR (WHATWG HTML §9.2); an event not yet complete is left for the
//! next read. The relay's own tap scans incrementally ([`super::sse`]); this is for the
//! readers that act on whole events (the overflow peek, the recall rounds).

/// One event's fields.
#[derive(Debug, Default)]
pub struct Event<'a> {
    /// `event:`, when named.
    pub name: Option<&'a str>,
    /// Each `data:` line's value.
    pub data: Vec<&'a str>,
    /// llama-server's old non-standard `error:` field.
    pub error: Option<&'a str>,
    /// Only comments (or nothing): a keep-alive.
    pub comment_only: bool,
}

impl Event<'_> {
    /// The data lines joined as the SSE spec joins them.
    pub fn data(&self) -> std::borrow::Cow<'_, str> {
        match self.data.as_slice() {
            [one] => std::borrow::Cow::Borrowed(one),
            lines => std::borrow::Cow::Owned(lines.join("\n")),
        }
    }
}

/// The first complete event of `bytes` and the bytes it took, with its blank line.
pub fn next_event(bytes: &[u8]) -> Option<(usize, Event<'_>)> {
    let mut event = Event {
        comment_only: true,
        ..Event::default()
    };
    let mut at = 0;
    loop {
        let rest = &bytes[at..];
        let end = rest.iter().position(|&b| b == b'\n' || b == b'\r')?;
        let ending = match (rest[end], rest.get(end + 1)) {
            (b'\r', Some(b'\n')) => 2,
            // A CR at the end of what was read may be the first half of a CRLF.
            (b'\r', None) => return None,
            _ => 1,
        };
        let line = std::str::from_utf8(&rest[..end]).unwrap_or("");
        at += end + ending;
        if line.is_empty() {
            return Some((at, event));
        }
        if line.starts_with(':') {
            continue;
        }
        event.comment_only = false;
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event.name = Some(value),
            "data" => event.data.push(value),
            "error" => event.error = Some(value),
            _ => {}
        }
    }
}

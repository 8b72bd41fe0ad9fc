//! The prompt of a Messages request as the fake sees it — its blocks, their token count —
//! and a simple simulation of Anthropic's prompt caching.
//!
//! The prompt is the sequence of the `system` blocks (a string `system` is one text
//! block), then, message by message, each message's content blocks (a string content is
//! one text block). Tokens: 3 per request, 4 for `system` when present and 4 per message,
//! plus each block's own: ⌈bytes/4⌉ of a `text` block's text, a `tool_use` block's `name`
//! and its `input` as compact JSON (each rounded up on its own), a `tool_result` block's
//! content (a string, or its blocks counted likewise), a `thinking` block's `thinking`, a
//! `redacted_thinking` block's `data`, a text `document`'s `source.data`; other blocks
//! (images…) count their `text` if they have one, else 0. Tools are not counted.
//!
//! Caching: each block ends a prefix of the prompt (everything up to and including it),
//! with a token count (the running count above) and a hash (FNV-1a over the canonical JSON
//! of its blocks, `cache_control` left out, and each message's role). A block with
//! `cache_control` is a breakpoint. The fake remembers, per instance (the latest
//! [`REMEMBERED`]), the hashes of the prefixes that ended at a breakpoint of an earlier
//! accepted request. For a request, the longest of its prefixes that ends at or before its
//! last breakpoint and is remembered is read from the cache (`cache_read_input_tokens`:
//! that prefix's tokens); what follows it up to the last breakpoint is written
//! (`cache_creation_input_tokens`); the rest is `input_tokens`; the three add up to the
//! prompt's count. There is no minimum cacheable length and no expiry, and neither the
//! tools nor the model are part of a prefix.
//!
//! Chat completions and Responses get OpenAI's automatic caching instead ([`AutoCache`]):
//! no breakpoints; the prompt is cut after each message or item (the model and the tools
//! start it; Responses' `instructions` is a cut of its own), and each cut of every
//! accepted request is remembered (the latest [`AUTO_REMEMBERED`]). A request's
//! `cached_tokens` is the token count of its longest remembered cut, when that is at
//! least 1,024, rounded down to a multiple of 128 (times `token_scale`, rounded up,
//! before the rounding down).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::chat::{fnv, fnv_extend};
use crate::lock;

/// How many breakpoint prefixes an instance remembers.
pub const REMEMBERED: usize = 4096;

/// One prefix of a prompt: up to and including one block.
struct Prefix {
    tokens: u64,
    hash: u64,
    breakpoint: bool,
}

/// A request's prompt, cut after each block.
pub(crate) struct Prompt {
    prefixes: Vec<Prefix>,
    /// The prompt's token count.
    pub(crate) total: u64,
}

impl Prompt {
    pub(crate) fn of(request: &Value) -> Self {
        let mut walk = Walk {
            tokens: 3,
            pending: 0,
            hash: fnv(b""),
            prefixes: Vec::new(),
        };
        match &request["system"] {
            Value::Null => {}
            system => walk.message("system", system),
        }
        for m in request["messages"].as_array().into_iter().flatten() {
            walk.message(m["role"].as_str().unwrap_or(""), &m["content"]);
        }
        Self {
            total: walk.tokens + walk.pending,
            prefixes: walk.prefixes,
        }
    }
}

struct Walk {
    tokens: u64,
    /// A started message's 4, counted with its first block.
    pending: u64,
    hash: u64,
    prefixes: Vec<Prefix>,
}

impl Walk {
    fn message(&mut self, role: &str, content: &Value) {
        self.pending += 4;
        self.hash = fnv_extend(self.hash, format!("\u{0}{role}\u{0}").as_bytes());
        match content {
            Value::String(s) => self.block(&json!({"type": "text", "text": s})),
            Value::Array(blocks) => blocks.iter().for_each(|b| self.block(b)),
            _ => {}
        }
    }

    fn block(&mut self, block: &Value) {
        self.tokens += std::mem::take(&mut self.pending) + block_tokens(block);
        let mut canonical = String::new();
        write_canonical(block, Some("cache_control"), &mut canonical);
        self.hash = fnv_extend(self.hash, canonical.as_bytes());
        self.prefixes.push(Prefix {
            tokens: self.tokens,
            hash: self.hash,
            breakpoint: has_cache_control(block),
        });
    }
}

/// Whether a block (or tool) carries a `cache_control` breakpoint.
pub(crate) fn has_cache_control(block: &Value) -> bool {
    block.get("cache_control").is_some_and(|c| !c.is_null())
}

/// A content block's own tokens (see the module doc).
fn block_tokens(block: &Value) -> u64 {
    let tokens = |s: &str| (s.len() as u64).div_ceil(4);
    let field = |k: &str| block[k].as_str().map_or(0, tokens);
    match block["type"].as_str().unwrap_or("") {
        "tool_use" => {
            let input = match &block["input"] {
                Value::Null => 0,
                input => tokens(&input.to_string()),
            };
            field("name") + input
        }
        "tool_result" => match &block["content"] {
            Value::String(s) => tokens(s),
            Value::Array(blocks) => blocks.iter().map(block_tokens).sum(),
            _ => 0,
        },
        "thinking" => field("thinking"),
        "redacted_thinking" => field("data"),
        "document" if block["source"]["type"] == "text" => {
            block["source"]["data"].as_str().map_or(0, tokens)
        }
        _ => field("text"),
    }
}

/// JSON with the members of every object in key order (`skip` left out of the outer
/// one), so equal values give equal text however they were written.
fn write_canonical(value: &Value, skip: Option<&str>, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().filter(|k| Some(k.as_str()) != skip).collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_canonical(&map[k.as_str()], None, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, None, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A prompt's tokens, split as Anthropic's usage reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) input: u64,
    pub(crate) cache_creation: u64,
    pub(crate) cache_read: u64,
}

/// The breakpoint prefixes an instance has seen, oldest first.
#[derive(Default)]
pub(crate) struct PromptCache {
    seen: Mutex<(HashSet<u64>, VecDeque<u64>)>,
}

impl PromptCache {
    /// Splits the prompt's tokens (times `scale`, rounded up) into cache reads, writes and
    /// the rest, then remembers its breakpoints.
    pub(crate) fn split(&self, prompt: &Prompt, scale: f64) -> Split {
        let scaled = |n: u64| (n as f64 * scale).ceil() as u64;
        let total = scaled(prompt.total);
        let Some(last) = prompt.prefixes.iter().rposition(|p| p.breakpoint) else {
            return Split {
                input: total,
                cache_creation: 0,
                cache_read: 0,
            };
        };
        let mut guard = lock(&self.seen);
        let (set, order) = &mut *guard;
        let read = prompt.prefixes[..=last]
            .iter()
            .rev()
            .find(|p| set.contains(&p.hash))
            .map_or(0, |p| scaled(p.tokens));
        let written = scaled(prompt.prefixes[last].tokens);
        for p in prompt.prefixes.iter().filter(|p| p.breakpoint) {
            if set.insert(p.hash) {
                order.push_back(p.hash);
                if order.len() > REMEMBERED
                    && let Some(old) = order.pop_front()
                {
                    set.remove(&old);
                }
            }
        }
        Split {
            input: total.saturating_sub(written),
            cache_creation: written.saturating_sub(read),
            cache_read: read,
        }
    }
}

/// How many prefixes OpenAI-style caching remembers.
pub const AUTO_REMEMBERED: usize = 65_536;

/// A chat or Responses prompt cut after each item: the token count and the prefix hash
/// of each cut, in order.
pub(crate) struct Cuts(Vec<(u64, u64)>);

impl Cuts {
    /// `start`: the tokens and the canonical text (model, tools) before the first item;
    /// then each item with its own tokens.
    pub(crate) fn of<'v>(
        (mut tokens, start): (u64, &str),
        items: impl Iterator<Item = (u64, &'v Value)>,
    ) -> Self {
        let mut hash = fnv_extend(fnv(b""), start.as_bytes());
        let mut cuts = Vec::new();
        for (own, item) in items {
            tokens += own;
            let mut canonical = String::new();
            write_canonical(item, None, &mut canonical);
            hash = fnv_extend(hash, canonical.as_bytes());
            cuts.push((tokens, hash));
        }
        Self(cuts)
    }
}

/// The canonical text of the model and tools that start a chat or Responses prompt.
pub(crate) fn prompt_start(request: &Value) -> String {
    let mut start = String::new();
    write_canonical(&request["model"], None, &mut start);
    write_canonical(&request["tools"], None, &mut start);
    start
}

/// OpenAI's automatic prompt caching (see the module doc).
#[derive(Default)]
pub(crate) struct AutoCache {
    seen: Mutex<(HashSet<u64>, VecDeque<u64>)>,
}

impl AutoCache {
    /// The tokens (times `scale`) the cache serves of a prompt cut as `cuts`; then its
    /// cuts are remembered.
    pub(crate) fn cached(&self, cuts: &Cuts, scale: f64) -> u64 {
        let mut guard = lock(&self.seen);
        let (set, order) = &mut *guard;
        let hit = cuts
            .0
            .iter()
            .rev()
            .find(|(_, hash)| set.contains(hash))
            .map_or(0, |(tokens, _)| (*tokens as f64 * scale).ceil() as u64);
        for (_, hash) in &cuts.0 {
            if set.insert(*hash) {
                order.push_back(*hash);
                if order.len() > AUTO_REMEMBERED
                    && let Some(old) = order.pop_front()
                {
                    set.remove(&old);
                }
            }
        }
        if hit < 1024 { 0 } else { hit / 128 * 128 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_caching_serves_the_longest_prefix_seen_in_128_token_steps() {
        let cache = AutoCache::default();
        let long = |c: char| json!({"role": "user", "content": c.to_string().repeat(4000)});
        let items = [
            long('a'),
            json!({"role": "assistant", "content": "ok"}),
            long('b'),
        ];
        let cuts = |n: usize| Cuts::of((3, "m"), items[..n].iter().map(|i| (1004, i)));
        assert_eq!(cache.cached(&cuts(1), 1.0), 0, "nothing seen yet");
        // The first item (1,007 tokens) is remembered but under 1,024 tokens.
        assert_eq!(cache.cached(&cuts(2), 1.0), 0);
        // Two items seen: 2,011 tokens, served as 1,920.
        assert_eq!(cache.cached(&cuts(3), 1.0), 1920);
        // Another start (other tools) shares nothing.
        let other = Cuts::of((3, "n"), items.iter().map(|i| (1004, i)));
        assert_eq!(cache.cached(&other, 1.0), 0);
    }

    fn request(messages: Value) -> Value {
        json!({"system": [{"type": "text", "text": "s".repeat(40), "cache_control": {"type": "ephemeral"}}],
            "messages": messages})
    }

    #[test]
    fn counts_blocks_as_documented() {
        let r = json!({"system": "12345678", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "text", "text": "abcde"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "tool_use", "id": "t", "name": "read", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "12345"},
                {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]},
        ]});
        // 3 + system (4 + 2) + (4 + 1 + 2) + (4 + 1 + 1 + ⌈7/4⌉) + (4 + 2 + 0)
        assert_eq!(Prompt::of(&r).total, 3 + 6 + 7 + 8 + 6);
    }

    #[test]
    fn a_repeated_prefix_is_read_and_the_rest_written() {
        let cache = PromptCache::default();
        let first = request(json!([{"role": "user", "content": [
            {"type": "text", "text": "hello there", "cache_control": {"type": "ephemeral"}}]}]));
        let p = Prompt::of(&first);
        // 3 + (4 + 10) system, then 4 + 3 for the message.
        assert_eq!(p.total, 24);
        assert_eq!(
            cache.split(&p, 1.0),
            Split {
                input: 0,
                cache_creation: 24,
                cache_read: 0
            }
        );
        // The same prefix without its marker, then more: read up to the old breakpoint.
        let second = request(json!([
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            {"role": "assistant", "content": "ok!!"},
            {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "tail"}]},
        ]));
        let p = Prompt::of(&second);
        assert_eq!(p.total, 24 + (4 + 1) + (4 + 1 + 1));
        let split = cache.split(&p, 1.0);
        assert_eq!(
            split,
            Split {
                input: 1,
                cache_creation: 10,
                cache_read: 24
            }
        );
        assert_eq!(
            split.input + split.cache_creation + split.cache_read,
            p.total
        );
    }

    #[test]
    fn a_changed_block_breaks_the_prefix() {
        let cache = PromptCache::default();
        let a = request(json!([{"role": "user", "content": "x"}]));
        cache.split(&Prompt::of(&a), 1.0);
        let mut b = a.clone();
        b["system"][0]["text"] = json!("t".repeat(40));
        let split = cache.split(&Prompt::of(&b), 1.0);
        assert_eq!(split.cache_read, 0);
        assert_eq!(split.cache_creation, 3 + 4 + 10);
        // The original system prefix is still remembered.
        assert_eq!(cache.split(&Prompt::of(&a), 1.0).cache_read, 17);
    }

    #[test]
    fn canonical_json_ignores_key_order_and_the_marker() {
        let mut a = String::new();
        let mut b = String::new();
        write_canonical(
            &json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}),
            Some("cache_control"),
            &mut a,
        );
        write_canonical(
            &json!({"text": "x", "type": "text"}),
            Some("cache_control"),
            &mut b,
        );
        assert_eq!(a, b);
        assert_eq!(a, r#"{"text":"x","type":"text"}"#);
    }
}

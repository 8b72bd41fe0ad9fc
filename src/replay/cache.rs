//! Prompt caching as the providers do it, for `abridge replay`: OpenAI's automatic
//! prefix caching (chat completions, Responses) and Anthropic's at the client's
//! breakpoints (Messages). The same simulation runs over what abridge forwarded (the
//! simulated provider's usage) and over the requests as the client sent them (the
//! direct figures), so both are priced on one model of the cache.
//!
//! A prompt is its head (tools, then `system` or `instructions`) and its history items
//! (less the reasoning of earlier turns, which a Responses provider drops), cut after
//! each: every cut has the tokens up to it and a hash of everything up to it
//! (an item's `cache_control` marker left out, since a client moves its breakpoint from
//! turn to turn). Automatic: the longest cut an earlier request of the conversation had
//! is read, from 1,024 tokens, in steps of 128; every cut is remembered. Breakpoints: the
//! longest remembered cut at or before the prompt's last breakpoint is read, what follows
//! it up to that breakpoint is written, and the prompt's breakpoint cuts are remembered.
//! A cut's hash and tokens are worked out once per distinct item: a history that grows
//! costs only its new items.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

use crate::formats::Format;
use crate::prices::Tokens;

use super::input::list_key;

/// The fewest tokens a provider caches, and the steps OpenAI caches in.
const MIN_CACHED: u64 = 1024;
const STEP: u64 = 128;

/// A conversation's cache: the prefixes it holds, and what each item seen costs.
#[derive(Default)]
pub struct Cache {
    held: HashSet<u64>,
    /// The head's tokens in the latest request served.
    head: u64,
    /// An item's key (its text's hash) → its own hash and tokens (computed once).
    items: HashMap<u64, (u64, u64)>,
}

/// An item's key: the hash of its JSON text.
pub fn key(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// One cut of a prompt: the tokens up to it, a hash of all up to it, and whether a
/// breakpoint ends it.
struct Cut {
    tokens: u64,
    hash: u64,
    breakpoint: bool,
}

impl Cache {
    /// The input tokens of `body` (a request of `format`) as the provider bills them —
    /// all of it, of which read from and written to the cache — then remembered. `count`
    /// gives an item's (or the head's) tokens.
    pub fn serve(&mut self, format: Format, body: &Value, count: &dyn Fn(&Value) -> u64) -> Tokens {
        let items = body[list_key(format)]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let keys: Vec<u64> = items.iter().map(|i| key(&i.to_string())).collect();
        self.serve_items(format, (body, items, &keys, None), count)
    }

    /// The same for a request given as its other members (`rest`: tools, system…), its
    /// history items and their [`key`]s, and its newest item as sent when that differs
    /// from the last of `items` (a breakpoint the client added).
    pub fn serve_items(
        &mut self,
        format: Format,
        request: (&Value, &[Value], &[u64], Option<&Value>),
        count: &dyn Fn(&Value) -> u64,
    ) -> Tokens {
        let cuts = self.cuts(format, request, count);
        let total = cuts.last().map_or(0, |c| c.tokens);
        let (cached, cache_write) = match format {
            Format::Chat | Format::Responses => self.automatic(&cuts),
            Format::Messages => self.breakpoints(&cuts),
        };
        Tokens {
            input: total,
            cached,
            cache_write,
            output: 0,
        }
    }

    /// The head's tokens (tools, then `system` or `instructions`) in the latest request
    /// served.
    pub fn head(&self) -> u64 {
        self.head
    }

    fn automatic(&mut self, cuts: &[Cut]) -> (u64, u64) {
        let hit = cuts
            .iter()
            .rev()
            .find(|c| self.held.contains(&c.hash))
            .map_or(0, |c| c.tokens);
        self.held.extend(cuts.iter().map(|c| c.hash));
        let cached = if hit < MIN_CACHED {
            0
        } else {
            hit / STEP * STEP
        };
        (cached, 0)
    }

    fn breakpoints(&mut self, cuts: &[Cut]) -> (u64, u64) {
        let Some(last) = cuts.iter().rposition(|c| c.breakpoint) else {
            return (0, 0);
        };
        let read = cuts[..=last]
            .iter()
            .rev()
            .find(|c| self.held.contains(&c.hash))
            .map_or(0, |c| c.tokens);
        self.held
            .extend(cuts.iter().filter(|c| c.breakpoint).map(|c| c.hash));
        (read, cuts[last].tokens - read)
    }

    /// The prompt's cuts: its head, then each history item.
    fn cuts(
        &mut self,
        format: Format,
        (rest, items, keys, newest): (&Value, &[Value], &[u64], Option<&Value>),
        count: &dyn Fn(&Value) -> u64,
    ) -> Vec<Cut> {
        let head = head(format, rest);
        let (head_hash, head_tokens) = self.item(key(&head.to_string()), &head, count);
        self.head = head_tokens;
        let mut cut = Cut {
            tokens: head_tokens,
            hash: head_hash,
            breakpoint: marked(&head),
        };
        let mut cuts = Vec::with_capacity(items.len() + 1);
        let last = items.len().saturating_sub(1);
        let dropped = dropped_reasoning(format, items);
        for (i, (item, &item_key)) in items.iter().zip(keys).enumerate() {
            if dropped(i) {
                continue;
            }
            let item = match newest {
                Some(newest) if i == last => newest,
                _ => item,
            };
            let (hash, tokens) = self.item(item_key, item, count);
            let mut h = DefaultHasher::new();
            (cut.hash, hash).hash(&mut h);
            let next = Cut {
                tokens: cut.tokens + tokens,
                hash: h.finish(),
                breakpoint: marked(item),
            };
            cuts.push(std::mem::replace(&mut cut, next));
        }
        cuts.push(cut);
        cuts
    }

    /// An item's own hash (its `cache_control` markers left out) and tokens, worked out
    /// the first time its `key` is seen.
    fn item(&mut self, item_key: u64, item: &Value, count: &dyn Fn(&Value) -> u64) -> (u64, u64) {
        *self
            .items
            .entry(item_key)
            .or_insert_with(|| (key(&unmarked(item).to_string()), count(item)))
    }
}

/// Which items of a Responses prompt the provider drops: the reasoning of turns before
/// the latest user message (a reasoning model keeps only the current turn's). Dropped,
/// they are neither billed nor part of the cached prefix: a new user turn after
/// reasoning reads nothing from the cache past the first dropped item, as the providers'
/// bills show.
fn dropped_reasoning(format: Format, items: &[Value]) -> impl Fn(usize) -> bool + '_ {
    let last_user = (format == Format::Responses)
        .then(|| {
            items.iter().rposition(|i| {
                i["role"] == "user" && matches!(i["type"].as_str(), Some("message") | None)
            })
        })
        .flatten();
    move |i| last_user.is_some_and(|u| i < u) && items[i]["type"] == "reasoning"
}

/// What starts a prompt: its tools and its `system` or `instructions`.
fn head(format: Format, body: &Value) -> Value {
    let system = match format {
        Format::Chat => Value::Null,
        Format::Responses => body["instructions"].clone(),
        Format::Messages => body["system"].clone(),
    };
    serde_json::json!({"tools": body["tools"], "system": system})
}

/// Of a request billed `billed` (its head `head` tokens; the conversation's previous
/// request `previous` tokens, 0 for its first), the history: what came before its own
/// turn, beyond its head — billed in the prompt's order, the cache's reads covering the
/// head first, then the history, and the rest of the history written or sent plain as
/// the request's own tokens were. What no rewrite of the history can make cheaper is
/// the rest (the head, the turn, the answer), so this, priced and summed, is the most
/// any compaction could save.
pub fn history(billed: Tokens, head: u64, previous: u64) -> Tokens {
    let turn = billed.input.saturating_sub(previous);
    let input = match previous {
        0 => 0,
        _ => billed.input.saturating_sub(head).saturating_sub(turn),
    };
    let cached = input.min(billed.cached.saturating_sub(head));
    Tokens {
        input,
        cached,
        cache_write: (input - cached).min(billed.cache_write),
        output: 0,
    }
}

/// Whether a value carries a `cache_control` breakpoint anywhere in it.
fn marked(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            map.get("cache_control").is_some_and(|c| !c.is_null()) || map.values().any(marked)
        }
        Value::Array(items) => items.iter().any(marked),
        _ => false,
    }
}

/// The value without its `cache_control` members.
pub fn unmarked(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), unmarked(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(unmarked).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A token per byte of the item's text (its markers left out, as the simulated
    /// provider's count leaves them out), so sizes are easy to follow.
    fn bytes(v: &Value) -> u64 {
        unmarked(v).to_string().len() as u64
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    #[test]
    fn the_history_is_what_came_before_the_turn_beyond_the_head() {
        let billed = |input, cached, cache_write| Tokens {
            input,
            cached,
            cache_write,
            output: 300,
        };
        // A first request has no history.
        assert_eq!(history(billed(5_000, 0, 5_000), 2_000, 0).input, 0);
        // 10,000 tokens after 8,000: 2,000 of head, 2,000 of turn, 6,000 of history,
        // read from the cache.
        let warm = history(billed(10_000, 9_000, 1_000), 2_000, 8_000);
        assert_eq!(
            (warm.input, warm.cached, warm.cache_write),
            (6_000, 6_000, 0)
        );
        assert_eq!(warm.output, 0, "the answer is no history");
        // After the cache went cold, the history was written again (Anthropic) or sent
        // as plain input (OpenAI), as the request's own tokens were.
        let cold = history(billed(10_000, 0, 10_000), 2_000, 8_000);
        assert_eq!((cold.cached, cold.cache_write), (0, 6_000));
        // A prefix read from the cache covers the head first: here, not even all of it.
        let plain = history(billed(10_000, 1_024, 0), 2_000, 8_000);
        assert_eq!(
            (plain.input, plain.cached, plain.cache_write),
            (6_000, 0, 0)
        );
        let part = history(billed(10_000, 5_000, 0), 2_000, 8_000);
        assert_eq!((part.cached, part.cache_write), (3_000, 0));
        // After the client compacted itself (smaller than before), all but the head.
        assert_eq!(history(billed(4_000, 0, 4_000), 2_000, 9_000).input, 2_000);
    }

    #[test]
    fn openai_reads_the_longest_prefix_it_saw_in_steps_of_128() {
        let mut cache = Cache::default();
        let body = |n: usize| {
            let messages: Vec<Value> = (0..n)
                .map(|i| user(&format!("{i}{}", "x".repeat(600))))
                .collect();
            json!({"model": "m", "messages": messages})
        };
        let first = cache.serve(Format::Chat, &body(2), &bytes);
        assert_eq!((first.cached, first.cache_write), (0, 0));
        let second = cache.serve(Format::Chat, &body(3), &bytes);
        let two = first.input;
        assert!(two >= MIN_CACHED);
        assert_eq!(second.cached, two / STEP * STEP);
        // An edited first message shares nothing.
        let mut edited = body(3);
        edited["messages"][0]["content"] = json!("changed");
        assert_eq!(cache.serve(Format::Chat, &edited, &bytes).cached, 0);
    }

    #[test]
    fn anthropic_reads_up_to_a_breakpoint_it_wrote_and_writes_the_rest() {
        let mut cache = Cache::default();
        let marked = |text: &str| {
            json!({"role": "user", "content": [{"type": "text", "text": text,
                "cache_control": {"type": "ephemeral"}}]})
        };
        let plain =
            |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}]});
        let a = "a".repeat(2000);
        let b = "b".repeat(500);
        let first = json!({"system": "s", "messages": [marked(&a)]});
        let t1 = cache.serve(Format::Messages, &first, &bytes);
        assert_eq!((t1.cached, t1.cache_write), (0, t1.input));
        // The client moves its breakpoint to the newest message.
        let second = json!({"system": "s", "messages": [plain(&a),
            {"role": "assistant", "content": "ok"}, marked(&b)]});
        let t2 = cache.serve(Format::Messages, &second, &bytes);
        assert_eq!(t2.cached, t1.input);
        assert_eq!(t2.cache_write, t2.input - t1.input);
        // No breakpoint: nothing cached.
        let none = json!({"system": "s", "messages": [plain(&a)]});
        let t3 = cache.serve(Format::Messages, &none, &bytes);
        assert_eq!((t3.cached, t3.cache_write), (0, 0));
    }
}

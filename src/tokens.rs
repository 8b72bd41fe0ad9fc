//! Token estimation: exact where the model's tokenizer is known, a cheap calibrated
//! estimate otherwise.
//!
//! Compaction decides with these numbers whether a request fits under its threshold, so
//! they must be close and, where inexact, err on the side of more tokens: a compaction a
//! little early costs nothing, a request over the window is rejected by the provider.
//!
//! - OpenAI model families get the real byte-pair encoding (tiktoken-rs): `o200k_base`
//!   for gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3, o4 (and gpt-oss), `cl100k_base` for
//!   gpt-4, gpt-3.5 and the text-embedding-3 / ada-002 models. Each table is parsed once
//!   per process (a few tens of milliseconds) on first use, then shared.
//! - Every other model gets [`approx_text`]: a weight per byte class (letters ¼ token,
//!   digits 0.6, spaces 0.03, line breaks and tabs 1, punctuation ½, each non-ASCII
//!   character 0.8). The weights were fitted against `o200k_base` on 19 samples (this
//!   crate's README and sources, Rust sources and changelogs from the registry, JSON test
//!   fixtures, `Cargo.lock`, English prose, Chinese/Japanese text) and then rounded up
//!   a little: the estimate is 0.92–1.22 × the exact count on every sample (median 1.05),
//!   1.55 × on a file of long runs of spaces. Run the (ignored) test
//!   `tests::calibration` to see the table; point `ABRIDGE_CALIBRATION_FILES` (`:`-separated
//!   paths) at more text to check it. Other vendors' tokenizers (Llama, Qwen, Mistral,
//!   Claude) were not measured: for them the estimate is a guide calibrated on a modern
//!   200k-vocabulary BPE, which is why it errs high.
//!
//! Cost, measured by `cargo bench --bench compact` (numbers in docs/src/performance.md): the estimate
//! reads each byte once (sub-millisecond for a 200 KB request); the exact encoding is two
//! orders of magnitude slower. Callers on the hot path therefore estimate only what was
//! appended since the provider last reported usage (DESIGN §4), never the whole request.
//!
//! Per-message accounting follows OpenAI's published recipe: 3 tokens per message, 1 more
//! for a `name`, 3 to prime the reply; tool calls count their name, arguments and id plus
//! a small frame; images a fixed 765 (a 1024×1024 high-detail image; 85 for
//! `"detail":"low"`; an Anthropic `image` block 1,600), since their size is not known
//! without decoding them — never their base64 data as text.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tiktoken_rs::CoreBPE;

use crate::conversation::{Content, Item, Part};

/// Tokens OpenAI adds per message (role and separators).
const PER_MESSAGE: u64 = 3;
/// Tokens for a message's `name`, on top of the name itself.
const PER_NAME: u64 = 1;
/// Tokens that prime the assistant's reply, once per request.
const PER_REQUEST: u64 = 3;
/// Frame around one tool call (id, type, function object).
const PER_TOOL_CALL: u64 = 8;
/// An image of unknown size: a 1024×1024 image at high detail (85 + 4 × 170).
const IMAGE_HIGH: u64 = 765;
/// An image at `"detail":"low"`.
const IMAGE_LOW: u64 = 85;
/// An Anthropic `image` block of unknown size: the most Anthropic bills for one it does
/// not downscale (1.15 megapixels, width × height / 750).
const IMAGE_ANTHROPIC: u64 = 1_600;

/// Counts tokens for one model. Cheap to clone (a reference to a shared table or
/// nothing).
#[derive(Clone, Copy)]
pub struct Estimator {
    bpe: Option<&'static CoreBPE>,
}

impl std::fmt::Debug for Estimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.bpe.is_some() {
            "Estimator(exact)"
        } else {
            "Estimator(approx)"
        })
    }
}

/// The byte-pair encodings abridge knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    O200k,
    Cl100k,
}

impl Encoding {
    /// The encoding of a model name, `None` when it is not an OpenAI family. A provider
    /// prefix (`openai/gpt-4o` on OpenRouter) is ignored.
    fn of_model(model: &str) -> Option<Self> {
        let name = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
        if starts(&[
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "gpt-oss",
            "o1",
            "o3",
            "o4",
        ]) {
            Some(Self::O200k)
        } else if starts(&[
            "gpt-4",
            "gpt-3.5",
            "gpt-35",
            "text-embedding-3",
            "text-embedding-ada-002",
        ]) {
            Some(Self::Cl100k)
        } else {
            None
        }
    }

    fn cell(self) -> &'static OnceLock<Option<CoreBPE>> {
        static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        match self {
            Self::O200k => &O200K,
            Self::Cl100k => &CL100K,
        }
    }

    fn load(self) -> Option<CoreBPE> {
        match self {
            Self::O200k => tiktoken_rs::o200k_base().ok(),
            Self::Cl100k => tiktoken_rs::cl100k_base().ok(),
        }
    }

    /// The shared table, parsed on first use. `None` if it failed to load (it is
    /// compiled in, so this does not happen; the estimate then stands in).
    fn table(self) -> Option<&'static CoreBPE> {
        self.cell().get_or_init(|| self.load()).as_ref()
    }

    /// The table if it is loaded; otherwise `None`, and the first such call starts
    /// loading it on a thread of its own. Loading takes tens of milliseconds and ~20 MB
    /// per table, so the request path neither waits for it nor pays it for models that
    /// never come.
    fn table_if_ready(self) -> Option<&'static CoreBPE> {
        static STARTED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
        let cell = self.cell();
        if let Some(table) = cell.get() {
            return table.as_ref();
        }
        if !STARTED[self as usize].swap(true, Ordering::AcqRel) {
            std::thread::spawn(move || {
                cell.get_or_init(|| self.load());
            });
        }
        None
    }
}

impl Estimator {
    /// The estimator for a model name as the client sent it (loads the model's table on
    /// first use and waits for it).
    pub fn for_model(model: &str) -> Self {
        Self {
            bpe: Encoding::of_model(model).and_then(Encoding::table),
        }
    }

    /// As [`Estimator::for_model`], but never waits: until the model's table is loaded
    /// (in the background, started by the first call) this is the calibrated estimate.
    /// For the request path.
    pub fn for_model_ready(model: &str) -> Self {
        Self {
            bpe: Encoding::of_model(model).and_then(Encoding::table_if_ready),
        }
    }

    /// The calibrated estimate, for models whose tokenizer is not known.
    pub fn approx() -> Self {
        Self { bpe: None }
    }

    /// Whether counts come from the model's own tokenizer.
    pub fn is_exact(&self) -> bool {
        self.bpe.is_some()
    }

    /// Tokens of a text. The exact encoder sees the text in pieces of at most
    /// [`EXACT_PIECE`] bytes, cut before a whitespace where there is one: byte-pair
    /// merging is quadratic in the length of a run without a pre-token break (a
    /// megabyte of letters took seconds), and a cut costs at most a token or two.
    pub fn text(&self, text: &str) -> u64 {
        let Some(bpe) = self.bpe else {
            return approx_text(text);
        };
        let mut rest = text;
        let mut total = 0;
        while !rest.is_empty() {
            let (piece, after) = rest.split_at(piece_end(rest));
            total += bpe.encode_ordinary(piece).len() as u64;
            rest = after;
        }
        total
    }

    /// Tokens one message adds to a request: content, name, tool calls, tool call id and
    /// OpenAI's per-message overhead; none for an item the provider drops
    /// ([`Item::dropped`]).
    pub fn message(&self, message: &Item<'_>) -> u64 {
        match message.dropped {
            true => 0,
            false => self.read(message),
        }
    }

    /// Tokens one message adds to a request the provider reads it in (a dropped item's,
    /// while it was not).
    pub fn read(&self, message: &Item<'_>) -> u64 {
        if let Some(tokens) = message.reasoning {
            return PER_MESSAGE + tokens;
        }
        let mut n = PER_MESSAGE + self.content(&message.content);
        if let Some(name) = &message.name {
            n += PER_NAME + self.text(name);
        }
        for id in &message.results {
            n += self.text(id);
        }
        for call in &message.calls {
            n += PER_TOOL_CALL
                + self.text(&call.id)
                + self.text(&call.name)
                + self.text(&call.arguments);
        }
        // What abridge does not model (an unknown shape): counted by its bytes.
        if let Some(raw) = message.extra {
            n += approx_text(raw.get());
        }
        n
    }

    /// Tokens of a whole `messages` array, reply priming included.
    pub fn messages(&self, messages: &[Item<'_>]) -> u64 {
        PER_REQUEST + messages.iter().map(|m| self.message(m)).sum::<u64>()
    }

    /// The tokens a request carries besides its messages' own: the reply priming.
    pub fn per_request(&self) -> u64 {
        PER_REQUEST
    }

    fn content(&self, content: &Content<'_>) -> u64 {
        match content {
            Content::None => 0,
            Content::Text(t) => self.text(t),
            Content::Parts(parts) => parts
                .iter()
                .map(|part| match part {
                    Part::Text(t) => self.text(t),
                    Part::Other(raw) => other_part(raw.get()),
                })
                .sum(),
            Content::Other(raw) => approx_text(raw.get()),
        }
    }
}

/// Longest text the exact encoder is given at once (see [`Estimator::text`]).
const EXACT_PIECE: usize = 4096;

/// Where the first piece of `text` ends: all of it when short, else before the last
/// whitespace within [`EXACT_PIECE`] bytes (the encoder joins a space to the word after
/// it, so the count does not change), else at the last character boundary there.
fn piece_end(text: &str) -> usize {
    if text.len() <= EXACT_PIECE {
        return text.len();
    }
    let window = &text.as_bytes()[..EXACT_PIECE];
    match window.iter().rposition(u8::is_ascii_whitespace) {
        Some(at) if at > 0 => at,
        _ => (1..=EXACT_PIECE)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len()),
    }
}

/// A non-text content part: images at a fixed size, anything else by its bytes.
fn other_part(raw: &str) -> u64 {
    let low = || raw.contains(r#""detail":"low""#) || raw.contains(r#""detail": "low""#);
    crate::conversation::part_type(raw)
        .and_then(|kind| image(&kind, low))
        .unwrap_or_else(|| approx_text(raw))
}

/// The tokens an image part of `kind` counts (`None`: not an image): OpenAI's
/// `image_url` / `input_image` at high detail or, when `low` says so (asked only of
/// those), `"detail":"low"`; Anthropic's `image` block.
pub fn image(kind: &str, low: impl FnOnce() -> bool) -> Option<u64> {
    match kind {
        "image_url" | "input_image" => Some(if low() { IMAGE_LOW } else { IMAGE_HIGH }),
        "image" => Some(IMAGE_ANTHROPIC),
        _ => None,
    }
}

/// Hundredths of a token each byte weighs in [`approx_text`], by class: letters 25,
/// digits 60, spaces 3 (they merge into the next word), other whitespace 100 (a line
/// break and its indentation are about one token), punctuation 50, the lead byte of a
/// non-ASCII character 80, its continuation bytes 0.
const WEIGHTS: [u16; 256] = {
    let mut w = [0u16; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        w[b] = if c.is_ascii_alphabetic() {
            25
        } else if c.is_ascii_digit() {
            60
        } else if c == b' ' {
            3
        } else if c.is_ascii_whitespace() {
            100
        } else if c.is_ascii() {
            50
        } else if c >= 0xC0 {
            80
        } else {
            0
        };
        b += 1;
    }
    w
};

/// The reasoning tokens a Responses `reasoning` item whose `encrypted_content` is `len`
/// characters long carries: what the provider bills it for, about
/// [`REASONING_CHARS_PER_TOKEN`] characters of ciphertext a token past
/// [`REASONING_OVERHEAD_CHARS`]. Counted as text, the ciphertexts of fifteen real Codex
/// rollouts (2,586 reasoning items, one an answer) came to three times that in all, and
/// six times for the median item, whose reasoning is short.
pub fn reasoning(len: usize) -> u64 {
    (len.saturating_sub(REASONING_OVERHEAD_CHARS) as f64 / REASONING_CHARS_PER_TOKEN) as u64
}

/// Measured on a gpt-5-codex rollout: its `token_count` events' `reasoning_output_tokens`
/// against the length of the `encrypted_content` of the reasoning item each answer left
/// (64 → 1,528 characters, 448 → 3,832, 1,472 → 9,356, 1,856 → 11,980, 0 → ~950).
pub const REASONING_OVERHEAD_CHARS: usize = 950;
pub const REASONING_CHARS_PER_TOKEN: f64 = 5.9;

/// The calibrated estimate: a weight per byte class (see `WEIGHTS`), rounded up. One
/// table look-up per byte, no allocation.
pub fn approx_text(text: &str) -> u64 {
    let hundredths: u64 = text
        .as_bytes()
        .iter()
        .map(|&b| u64::from(WEIGHTS[usize::from(b)]))
        .sum();
    hundredths.div_ceil(100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::chat;

    #[test]
    fn the_request_path_estimator_never_waits_and_becomes_exact_once_loaded() {
        // Until the table is loaded (started by the first call, on its own thread) this
        // is the calibrated estimate; afterwards the exact count.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let exact = loop {
            let e = Estimator::for_model_ready("gpt-4-0613");
            if e.is_exact() {
                break e;
            }
            assert!(std::time::Instant::now() < deadline, "table never loaded");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let text = "The quick brown fox jumps over the lazy dog.";
        assert_eq!(
            exact.text(text),
            Estimator::for_model("gpt-4").text(text),
            "the same table as the blocking loader"
        );
        assert!(!Estimator::for_model_ready("llama-3.1-8b").is_exact());
    }

    #[test]
    fn models_map_to_their_encodings() {
        for m in [
            "gpt-4o",
            "gpt-4o-mini-2024-07-18",
            "gpt-4.1-nano",
            "gpt-5",
            "o3-mini",
            "o1",
            "openai/gpt-4o",
            "GPT-4O",
        ] {
            assert_eq!(Encoding::of_model(m), Some(Encoding::O200k), "{m}");
        }
        for m in [
            "gpt-4",
            "gpt-4-turbo",
            "gpt-3.5-turbo",
            "text-embedding-3-small",
        ] {
            assert_eq!(Encoding::of_model(m), Some(Encoding::Cl100k), "{m}");
        }
        for m in [
            "llama-3.1-70b",
            "claude-3-5-sonnet",
            "mistral-large",
            "",
            "gpt",
        ] {
            assert_eq!(Encoding::of_model(m), None, "{m}");
        }
        assert!(Estimator::for_model("gpt-4o").is_exact());
        assert!(!Estimator::for_model("qwen2.5").is_exact());
    }

    #[test]
    fn exact_counts_match_tiktoken() {
        let e = Estimator::for_model("gpt-4o");
        assert_eq!(e.text("hello world"), 2);
        assert_eq!(e.text(""), 0);
        let e = Estimator::for_model("gpt-4");
        assert_eq!(e.text("hello world"), 2);
    }

    #[test]
    fn long_texts_are_counted_in_pieces_at_a_linear_cost() {
        let e = Estimator::for_model("gpt-4o");
        // Prose cut at whitespace counts as it does whole.
        let prose = "The quick brown fox jumps over the lazy dog. ".repeat(400);
        let whole = e
            .bpe
            .map(|b| b.encode_ordinary(&prose).len() as u64)
            .unwrap();
        assert_eq!(e.text(&prose), whole);
        // A run without a break (one BPE piece) is cut at character boundaries; the
        // count stays close and the time linear (a megabyte of it once took seconds).
        let run = "é".repeat(300_000);
        let started = std::time::Instant::now();
        let n = e.text(&run);
        assert!(n > 0);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(piece_end("short"), 5);
        let spaced = format!("{} {}", "a".repeat(5000), "b".repeat(10));
        assert_eq!(piece_end(&spaced), EXACT_PIECE);
    }

    #[test]
    fn approx_counts_ascii_and_wide_characters() {
        assert_eq!(approx_text(""), 0);
        assert_eq!(approx_text("abcd"), 1);
        assert_eq!(approx_text("abcde"), 2);
        assert_eq!(approx_text("hello world"), 3);
        assert_eq!(approx_text("日本語"), 3);
        assert_eq!(approx_text("é"), 1);
        assert_eq!(approx_text("🦀🦀"), 2);
        assert_eq!(approx_text("2024-07-18"), 6);
        assert_eq!(approx_text("\n\n"), 2);
    }

    #[test]
    fn messages_count_overheads_tool_calls_and_images() {
        let body = br#"{"messages":[
            {"role":"user","content":"hello world","name":"bob"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.rs\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"fn main() {}"},
            {"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:x","detail":"low"}}]},
            {"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#;
        let parsed = chat::parse(body).unwrap();
        let e = Estimator::approx();
        let m = &parsed.messages;
        assert_eq!(e.message(&m[0]), 3 + 3 + 1 + 1);
        assert!(e.message(&m[1]) > PER_MESSAGE + PER_TOOL_CALL);
        assert_eq!(e.message(&m[3]), 3 + 1 + IMAGE_LOW);
        assert_eq!(e.message(&m[4]), 3 + IMAGE_HIGH);
        let total: u64 = m.iter().map(|x| e.message(x)).sum();
        assert_eq!(e.messages(m), total + PER_REQUEST);
        let exact = Estimator::for_model("gpt-4o");
        assert_eq!(exact.message(&m[0]), 3 + 2 + 1 + 1);
    }

    #[test]
    fn an_image_is_an_image_whatever_order_its_keys_come_in() {
        // Keys sorted (as serde_json and Python's sort_keys write them): the base64 data
        // comes before the type. A real Codex rollout's 197 KB screenshot was counted
        // as ~100,000 tokens of text.
        let data = "iVBORw0KGgoAAAANSUhEUgAABU8AAALoCAIAAA".repeat(2_000);
        let responses =
            format!(r#"{{"image_url":"data:image/png;base64,{data}","type":"input_image"}}"#);
        assert_eq!(other_part(&responses), IMAGE_HIGH);
        let chat = format!(
            r#"{{"image_url":{{"detail":"low","url":"data:image/png;base64,{data}"}},"type":"image_url"}}"#
        );
        assert_eq!(other_part(&chat), IMAGE_LOW);
        let anthropic = format!(
            r#"{{"source":{{"data":"{data}","media_type":"image/png","type":"base64"}},"type":"image"}}"#
        );
        assert_eq!(other_part(&anthropic), IMAGE_ANTHROPIC);
        // Anything else still by its bytes.
        let file = format!(r#"{{"file_data":"{data}","type":"input_file"}}"#);
        assert!(other_part(&file) > 10_000);
    }

    /// Prints bytes per token of `o200k_base` against the estimate on the text at hand
    /// (this crate's sources and docs, the registry's sources, JSON, CJK). Run with
    /// `cargo test --lib tokens::tests::calibration -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints the calibration table; not a check"]
    fn calibration() {
        let exact = Estimator::for_model("gpt-4o");
        let mut samples: Vec<(String, String)> = Vec::new();
        let root = env!("CARGO_MANIFEST_DIR");
        for (label, path) in [
            ("prose: docs/src/compaction.md", "docs/src/compaction.md"),
            ("code: src/formats/chat.rs", "src/formats/chat.rs"),
            ("code: src/config/mod.rs", "src/config/mod.rs"),
            ("toml: Cargo.lock", "Cargo.lock"),
        ] {
            if let Ok(t) = std::fs::read_to_string(format!("{root}/{path}")) {
                samples.push((label.to_owned(), t));
            }
        }
        let json: Vec<serde_json::Value> = (0..200)
            .map(|i| {
                serde_json::json!({"id": format!("call_{i:08x}"), "name": "read_file",
                "path": format!("src/module_{i}/file.rs"), "size": i * 1337, "ok": i % 3 == 0})
            })
            .collect();
        samples.push(("json".to_owned(), serde_json::to_string(&json).unwrap()));
        samples.push((
            "cjk".to_owned(),
            "上下文窗口是模型一次能够处理的最大令牌数。当对话过长时，需要压缩较早的消息，\
             同时保留系统提示和最近的对话轮次。日本語の文章もここに含めます。会話の要約は参考資料です。"
                .repeat(20),
        ));
        samples.push((
            "prose: english".to_owned(),
            "The context window is the largest number of tokens a model can read at once. \
             When a conversation grows too long, older messages are summarised while the system \
             prompt and the most recent turns are kept verbatim, so the model keeps its bearings."
                .repeat(30),
        ));
        if let Ok(list) = std::env::var("ABRIDGE_CALIBRATION_FILES") {
            for path in list.split(':') {
                if let Ok(t) = std::fs::read_to_string(path) {
                    samples.push((path.to_owned(), t));
                }
            }
        }
        for (label, text) in &samples {
            let b = text.as_bytes();
            let count = |f: &dyn Fn(u8) -> bool| b.iter().filter(|&&x| f(x)).count();
            println!(
                "CSV,{label},{},{},{},{},{},{},{}",
                exact.text(text),
                count(&|x| x.is_ascii_alphabetic()),
                count(&|x| x.is_ascii_digit()),
                count(&|x| x == b' '),
                count(&|x| x.is_ascii_whitespace() && x != b' '),
                count(&|x| x.is_ascii_punctuation()),
                count(&|x| x >= 0xC0),
            );
        }
        for (label, text) in samples {
            let t = exact.text(&text) as f64;
            let a = approx_text(&text) as f64;
            println!(
                "{label:24} bytes/token {:5.2}  estimate/exact {:5.2}",
                text.len() as f64 / t,
                a / t
            );
        }
    }
}

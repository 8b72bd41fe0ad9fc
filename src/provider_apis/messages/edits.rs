//! A Messages request's `context_management.edits`, read and checked as Anthropic checks
//! them: `clear_thinking_20251015` (`keep`: `{type: "thinking_turns", value > 0}`, `"all"`
//! or `{type: "all"}`; first in the list), `clear_tool_uses_20250919` (`trigger`
//! `input_tokens`/`tool_uses`, `keep`, `clear_at_least`, `clear_tool_inputs`,
//! `exclude_tools`) and `compact_20260112` (`trigger` `input_tokens` ≥ 50,000,
//! `pause_after_compaction`, `instructions`). A request that breaks a rule is refused
//! with Anthropic's wording: the field's path, then what it should be.

use serde_json::{Map, Value};

/// The fewest input tokens a `compact_20260112` trigger may name.
pub const MIN_COMPACT_TRIGGER: u64 = 50_000;
/// A `compact_20260112` trigger when none is given.
pub const DEFAULT_COMPACT_TRIGGER: u64 = 150_000;
/// A `clear_tool_uses_20250919` trigger when none is given (input tokens).
const DEFAULT_CLEAR_TRIGGER: u64 = 100_000;
/// Tool uses `clear_tool_uses_20250919` keeps when not told.
const DEFAULT_KEEP_TOOL_USES: u64 = 3;
/// Names read from `exclude_tools` or `clear_tool_inputs`, at most; longer lists and
/// names are refused (a bound on what a client makes abridge hold).
const MAX_NAMES: usize = 1_000;
const MAX_NAME_CHARS: usize = 256;
/// Characters of `instructions` read.
pub const MAX_INSTRUCTIONS_CHARS: usize = 100_000;

const THINKING: &str = "clear_thinking_20251015";
const TOOL_USES: &str = "clear_tool_uses_20250919";
const COMPACT: &str = "compact_20260112";

/// The edits a request asks for (each at most once).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Edits {
    pub thinking: Option<ClearThinking>,
    pub tool_uses: Option<ClearToolUses>,
    pub compact: Option<Compact>,
}

/// `clear_thinking_20251015`: the thinking of all but the last `keep` assistant turns
/// that have some (`None`: all kept).
#[derive(Debug, Clone, PartialEq)]
pub struct ClearThinking {
    pub keep: Option<u64>,
}

/// When `clear_tool_uses_20250919` acts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    InputTokens(u64),
    ToolUses(u64),
}

/// Which tool uses have their inputs cleared too.
#[derive(Debug, Clone, PartialEq)]
pub enum Inputs {
    None,
    All,
    Of(Vec<String>),
}

/// `clear_tool_uses_20250919`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClearToolUses {
    pub trigger: Trigger,
    pub keep: u64,
    pub clear_at_least: Option<u64>,
    pub inputs: Inputs,
    pub exclude: Vec<String>,
}

/// `compact_20260112`.
#[derive(Debug, Clone, PartialEq)]
pub struct Compact {
    pub trigger: u64,
    pub pause: bool,
    pub instructions: Option<String>,
}

/// The edits of `context_management` (its JSON text), or the message of Anthropic's 400.
pub fn read(raw: &str) -> Result<Edits, String> {
    let value: Value = serde_json::from_str(raw)
        .map_err(|_| "context_management: Input should be a valid dictionary".to_owned())?;
    let object = value
        .as_object()
        .ok_or("context_management: Input should be a valid dictionary")?;
    only(object, &["edits"], "context_management")?;
    let mut edits = Edits::default();
    let Some(list) = object.get("edits").filter(|e| !e.is_null()) else {
        return Ok(edits);
    };
    let list = list
        .as_array()
        .ok_or("context_management.edits: Input should be a valid list")?;
    for (n, edit) in list.iter().enumerate() {
        let at = format!("context_management.edits.{n}");
        let object = edit
            .as_object()
            .ok_or_else(|| format!("{at}: Input should be a valid dictionary"))?;
        match object.get("type").and_then(Value::as_str) {
            Some(THINKING) => {
                if n != 0 {
                    return Err(format!(
                        "{at}: `{THINKING}` must be the first strategy in `context_management.edits`"
                    ));
                }
                edits.thinking = Some(thinking(object, &at)?);
            }
            Some(TOOL_USES) => set(&mut edits.tool_uses, tool_uses(object, &at)?, &at)?,
            Some(COMPACT) => set(&mut edits.compact, compact(object, &at)?, &at)?,
            Some(other) => {
                let other: String = other.chars().take(MAX_NAME_CHARS).collect();
                return Err(format!(
                    "{at}: Input tag '{other}' found using 'type' does not match any of the expected tags: '{TOOL_USES}', '{THINKING}', '{COMPACT}'"
                ));
            }
            None => return Err(format!("{at}.type: Field required")),
        }
    }
    Ok(edits)
}

fn set<T>(slot: &mut Option<T>, edit: T, at: &str) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!(
            "{at}: each strategy may appear only once in `context_management.edits`"
        ));
    }
    *slot = Some(edit);
    Ok(())
}

/// Refuses a member not in `known`, as Anthropic refuses extra inputs.
fn only(object: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), String> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => {
            let key: String = key.chars().take(MAX_NAME_CHARS).collect();
            Err(format!("{at}.{key}: Extra inputs are not permitted"))
        }
        None => Ok(()),
    }
}

fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

/// `{type: <kind>, value: <integer ≥ min>}` at `at`; its kind and value.
fn counted(value: &Value, kinds: &[&str], min: u64, at: &str) -> Result<(String, u64), String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("{at}: Input should be a valid dictionary"))?;
    only(object, &["type", "value"], at)?;
    let kind = object
        .get("type")
        .and_then(Value::as_str)
        .filter(|k| kinds.contains(k))
        .ok_or_else(|| {
            let expected: Vec<String> = kinds.iter().map(|k| format!("'{k}'")).collect();
            format!("{at}.type: Input should be {}", expected.join(" or "))
        })?;
    let number = object
        .get("value")
        .ok_or_else(|| format!("{at}.value: Field required"))?;
    let number = number
        .as_u64()
        .or_else(|| number.as_i64().map(|_| 0))
        .ok_or_else(|| format!("{at}.value: Input should be a valid integer"))?;
    if number < min {
        let words = match min {
            1 => "greater than 0".to_owned(),
            _ => format!("greater than or equal to {min}"),
        };
        return Err(format!("{at}.value: Input should be {words}"));
    }
    Ok((kind.to_owned(), number))
}

fn thinking(object: &Map<String, Value>, at: &str) -> Result<ClearThinking, String> {
    only(object, &["type", "keep"], at)?;
    let keep = match present(object, "keep") {
        None => Some(1),
        Some(Value::String(s)) if s == "all" => None,
        Some(Value::Object(k)) if k.get("type").and_then(Value::as_str) == Some("all") => {
            only(k, &["type"], &format!("{at}.keep"))?;
            None
        }
        Some(k) => Some(counted(k, &["thinking_turns"], 1, &format!("{at}.keep"))?.1),
    };
    Ok(ClearThinking { keep })
}

fn names(value: &Value, at: &str) -> Result<Vec<String>, String> {
    let list = value
        .as_array()
        .filter(|l| l.len() <= MAX_NAMES)
        .ok_or_else(|| {
            format!("{at}: Input should be a valid list of at most {MAX_NAMES} tool names")
        })?;
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .filter(|s| s.len() <= MAX_NAME_CHARS)
                .map(str::to_owned)
                .ok_or_else(|| format!("{at}.{i}: Input should be a valid string"))
        })
        .collect()
}

fn tool_uses(object: &Map<String, Value>, at: &str) -> Result<ClearToolUses, String> {
    let known = [
        "type",
        "trigger",
        "keep",
        "clear_at_least",
        "clear_tool_inputs",
        "exclude_tools",
    ];
    only(object, &known, at)?;
    let trigger = match present(object, "trigger") {
        None => Trigger::InputTokens(DEFAULT_CLEAR_TRIGGER),
        Some(t) => match counted(
            t,
            &["input_tokens", "tool_uses"],
            1,
            &format!("{at}.trigger"),
        )? {
            (kind, n) if kind == "tool_uses" => Trigger::ToolUses(n),
            (_, n) => Trigger::InputTokens(n),
        },
    };
    let keep = match present(object, "keep") {
        None => DEFAULT_KEEP_TOOL_USES,
        Some(k) => counted(k, &["tool_uses"], 0, &format!("{at}.keep"))?.1,
    };
    let clear_at_least = match present(object, "clear_at_least") {
        None => None,
        Some(c) => Some(counted(c, &["input_tokens"], 0, &format!("{at}.clear_at_least"))?.1),
    };
    let inputs = match present(object, "clear_tool_inputs") {
        None | Some(Value::Bool(false)) => Inputs::None,
        Some(Value::Bool(true)) => Inputs::All,
        Some(list) => Inputs::Of(names(list, &format!("{at}.clear_tool_inputs"))?),
    };
    let exclude = match present(object, "exclude_tools") {
        None => Vec::new(),
        Some(list) => names(list, &format!("{at}.exclude_tools"))?,
    };
    Ok(ClearToolUses {
        trigger,
        keep,
        clear_at_least,
        inputs,
        exclude,
    })
}

fn compact(object: &Map<String, Value>, at: &str) -> Result<Compact, String> {
    only(
        object,
        &["type", "trigger", "pause_after_compaction", "instructions"],
        at,
    )?;
    let trigger = match present(object, "trigger") {
        None => DEFAULT_COMPACT_TRIGGER,
        Some(t) => {
            counted(
                t,
                &["input_tokens"],
                MIN_COMPACT_TRIGGER,
                &format!("{at}.trigger"),
            )?
            .1
        }
    };
    let pause = match present(object, "pause_after_compaction") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(format!(
                "{at}.pause_after_compaction: Input should be a valid boolean"
            ));
        }
    };
    let instructions = match present(object, "instructions") {
        None => None,
        Some(Value::String(s)) if s.chars().count() <= MAX_INSTRUCTIONS_CHARS => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(format!(
                "{at}.instructions: String should have at most {MAX_INSTRUCTIONS_CHARS} characters"
            ));
        }
        Some(_) => return Err(format!("{at}.instructions: Input should be a valid string")),
    };
    Ok(Compact {
        trigger,
        pause,
        instructions,
    })
}

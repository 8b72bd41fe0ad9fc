//! The fake model's use of a proxy's `abridge_recall` tool, the way a model uses it:
//! asked a question (the ask has a `?`) about something no longer in its context (a word
//! of the question of at least four letters, not a common one, that appears nowhere else
//! in the request), it calls the tool with those words as its `query` — an instruction
//! full of new words (an agent's first ask) is work to do, not something to look up;
//! given the tool's result, it answers from it (the result's line that names most of the
//! question's words). It never calls the tool for anything else, and its other tool
//! calls are made with the client's tools.

/// The tool's name.
pub const NAME: &str = "abridge_recall";

/// Words too common to be what a question is about.
const COMMON: &[&str] = &[
    "what", "which", "where", "when", "that", "this", "there", "these", "those", "with", "from",
    "have", "were", "does", "about", "again", "tell", "earlier", "said", "your", "them", "they",
    "then", "than", "into", "over", "used", "using", "make", "made",
];

/// What the fake does with the tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// Call it with this query.
    Call(String),
    /// Answer with this text, from what it recalled.
    Answer(String),
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric() && c != '-')
        .map(|w| w.trim_matches('-').to_lowercase())
        .filter(|w| w.chars().count() >= 4 && !COMMON.contains(&w.as_str()))
}

/// The move for a request whose last question is `question`, whose other text is
/// `context`, and whose recall results since the question are `results`; `callable`:
/// the tool is offered and may be called.
pub fn decide(question: &str, context: &str, results: &[String], callable: bool) -> Option<Move> {
    let asked: Vec<String> = words(question).collect();
    if !results.is_empty() {
        let text = results.join("\n");
        let best = text
            .lines()
            .filter(|l| !l.starts_with('['))
            .map(|l| {
                (
                    asked
                        .iter()
                        .filter(|w| l.to_lowercase().contains(w.as_str()))
                        .count(),
                    l,
                )
            })
            .filter(|(n, _)| *n > 0)
            .max_by_key(|(n, _)| *n)
            .map(|(_, l)| l.trim().to_owned());
        return Some(Move::Answer(match best {
            Some(line) => format!("From the earlier conversation: {line}"),
            None => "I could not find that in the earlier conversation.".to_owned(),
        }));
    }
    if !callable || !question.contains('?') {
        return None;
    }
    let context: std::collections::HashSet<String> = words(context).collect();
    let mut missing: Vec<String> = asked.into_iter().filter(|w| !context.contains(w)).collect();
    missing.dedup();
    (!missing.is_empty()).then(|| Move::Call(missing.join(" ")))
}

/// [`decide`] for a request whose items' texts are `texts`, the question at `asked`;
/// `extra`: text beside the items (a system prompt, instructions). Only a question that
/// ends the request, or recall results after it, are acted on.
pub fn decide_at(
    (asked, texts): (usize, &[String]),
    results: &[String],
    extra: Option<&str>,
    callable: bool,
) -> Option<Move> {
    if results.is_empty() && asked + 1 != texts.len() {
        return None;
    }
    let context: Vec<&str> = texts
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != asked)
        .map(|(_, t)| t.as_str())
        .chain(extra)
        .collect();
    decide(texts.get(asked)?, &context.join("\n"), results, callable)
}

/// Whether `tools` (a request's `tools`) offers the recall tool, in any format's shape.
pub fn offered(tools: &serde_json::Value) -> bool {
    proxy_tool(tools).is_some()
}

/// The name of the proxy's recall tool among `tools`, in any format's shape: a tool
/// named [`NAME`] (or a name that starts with it, when a client's own tool took that
/// one) whose description says it reads what was condensed. A client's own tool of the
/// same name is not it.
pub fn proxy_tool(tools: &serde_json::Value) -> Option<String> {
    tools.as_array()?.iter().rev().find_map(|t| {
        let t = if t["function"].is_object() {
            &t["function"]
        } else {
            t
        };
        let name = t["name"].as_str()?;
        let description = t["description"].as_str().unwrap_or_default();
        (name.starts_with(NAME) && description.contains("condensed")).then(|| name.to_owned())
    })
}

/// Whether `tool` (one of a request's `tools`, any format's shape) is the proxy's.
pub fn is_proxy_tool(tool: &serde_json::Value) -> bool {
    proxy_tool(&serde_json::Value::from(vec![tool.clone()])).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_recalls_what_is_missing_and_answers_from_the_result() {
        let context = "We spoke about the harbour and the lighthouse.";
        assert_eq!(
            decide(
                "Which port did the staging database use?",
                context,
                &[],
                true
            ),
            Some(Move::Call("port staging database".to_owned()))
        );
        assert_eq!(
            decide("Tell me about the lighthouse", context, &[], true),
            None
        );
        assert_eq!(decide("Which port?", context, &[], false), None);
        assert_eq!(
            decide("Review the staging database module.", context, &[], true),
            None,
            "an instruction is not a question"
        );
        let result =
            "[abridge_recall: …]\n[m2 user]\nThe staging database listens on port 6543.".to_owned();
        assert_eq!(
            decide(
                "Which port did the staging database use?",
                context,
                &[result],
                false
            ),
            Some(Move::Answer(
                "From the earlier conversation: The staging database listens on port 6543."
                    .to_owned()
            ))
        );
    }
}

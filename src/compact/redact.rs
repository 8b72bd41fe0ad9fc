//! Secrets removed from what is sent to the summariser (which may be a different, cheaper
//! provider than the conversation's): API keys of the common providers, bearer tokens,
//! JSON web tokens, private keys (also when a truncation cut one in half), passwords in
//! URLs and `password=`/`api_key:`-style assignments.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::Regex;

/// What a secret is replaced by.
pub const REDACTED: &str = "[REDACTED]";

/// (pattern, replacement); `$1` keeps a non-secret prefix such as the key's name.
const RULES: &[(&str, &str)] = &[
    // Private keys, whole, unterminated (cut by truncation), or only their end.
    (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
        "[REDACTED PRIVATE KEY]",
    ),
    (
        r"\A[A-Za-z0-9+/=\s]*-----END [A-Z0-9 ]*PRIVATE KEY-----",
        "[REDACTED PRIVATE KEY]",
    ),
    // Provider keys: OpenAI / Anthropic (sk-…), AWS access keys, GitHub, Slack, Google.
    (r"\bsk-[A-Za-z0-9_-]{16,}", REDACTED),
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", REDACTED),
    (
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",
        REDACTED,
    ),
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", REDACTED),
    (r"\bAIza[0-9A-Za-z_-]{30,}", REDACTED),
    // JSON web tokens.
    (
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        REDACTED,
    ),
    // Authorization headers.
    (
        r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}",
        "$1$2[REDACTED]",
    ),
    // Passwords in URLs: scheme://user:password@host.
    (
        r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@",
        "$1[REDACTED]@",
    ),
    // Assignments: password=…, "api_key": "…", secret: …
    (
        r#"(?i)((?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|client[_-]?secret|private[_-]?key)["']?\s*[:=]\s*["']?)[^\s"',;]{4,}"#,
        "$1[REDACTED]",
    ),
];

fn rules() -> &'static [(Regex, &'static str)] {
    static R: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    R.get_or_init(|| {
        let patterns: Vec<&str> = RULES.iter().map(|(p, _)| *p).collect();
        super::text::compile(&patterns)
            .into_iter()
            .zip(RULES.iter().map(|(_, r)| *r))
            .collect()
    })
}

/// `text` with every secret replaced; borrowed when there was none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for (re, with) in rules() {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, *with).into_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let cases = [
            (
                "key sk-proj-abcdefghijklmnopqrstuvwx ok",
                "key [REDACTED] ok",
            ),
            ("AKIAIOSFODNN7EXAMPLE", "[REDACTED]"),
            (
                "Authorization: Bearer abc.def-ghi_jkl",
                "Authorization: Bearer [REDACTED]",
            ),
            (
                "postgres://admin:hunter22@db.example.com:5432/app",
                "postgres://admin:[REDACTED]@db.example.com:5432/app",
            ),
            ("password=hunter22 next", "password=[REDACTED] next"),
            (r#""api_key": "abcd1234efgh""#, r#""api_key": "[REDACTED]""#),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[REDACTED]"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                "[REDACTED]",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----\nafter",
                "[REDACTED PRIVATE KEY]\nafter",
            ),
            (
                "x -----BEGIN PRIVATE KEY-----\nMIIEow (cut)",
                "x [REDACTED PRIVATE KEY]",
            ),
            (
                "abc+/=\nQQ==\n-----END PRIVATE KEY-----\nrest",
                "[REDACTED PRIVATE KEY]\nrest",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    #[test]
    fn ordinary_text_is_borrowed() {
        let text = "Run cargo test in src/compact; the token budget is 8000 tokens.";
        assert!(matches!(redact(text), Cow::Borrowed(_)));
    }
}

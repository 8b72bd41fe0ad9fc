//! Secrets removed from what is sent to the summariser (which may be a different, cheaper
//! provider than the conversation's): API keys of the common providers (OpenAI,
//! Anthropic, Stripe, Groq, xAI, Hugging Face, GitHub, GitLab, npm, PyPI, SendGrid, Slack,
//! Google, AWS), JSON web tokens, PEM and PGP private keys (also when a truncation cut
//! one in half), Azure storage keys and SAS signatures, passwords in URLs, `Cookie:`
//! headers, bearer/basic credentials and `password=` / `"api_key":` / `refresh_token=`
//! style assignments.
//!
//! Ordinary prose is left alone: a credential after `Bearer`, `Basic` or `token`, and the
//! value of a bare `token` assignment, is redacted only when it looks like one (see
//! [`looks_secret`]), so "token estimation" or "the token budget" pass unchanged.
//!
//! Each rule is a pattern whose named group `s` is the secret (the whole match when it
//! has none); what the match holds around `s` (a key's name, `@` after a URL password)
//! is kept.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// What a secret is replaced by.
pub const REDACTED: &str = "[REDACTED]";

/// How a rule decides whether its match is a secret.
#[derive(Clone, Copy)]
enum Check {
    /// Always: the pattern only matches secrets.
    Always,
    /// Only when the value looks like a credential, not a word.
    LooksSecret,
}

/// (pattern, replacement, check).
const RULES: &[(&str, &str, Check)] = &[
    // Private keys (PEM and PGP), whole, unterminated (cut by truncation), or only their
    // end.
    (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\z)",
        "[REDACTED PRIVATE KEY]",
        Check::Always,
    ),
    (
        r"\A[A-Za-z0-9+/=\s]*-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----",
        "[REDACTED PRIVATE KEY]",
        Check::Always,
    ),
    // Provider keys by their published prefixes.
    (r"\bsk-[A-Za-z0-9_-]{16,}", REDACTED, Check::Always),
    (
        r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}",
        REDACTED,
        Check::Always,
    ),
    (r"\bwhsec_[A-Za-z0-9]{16,}", REDACTED, Check::Always),
    (r"\bgsk_[A-Za-z0-9]{20,}", REDACTED, Check::Always),
    (r"\bxai-[A-Za-z0-9]{20,}", REDACTED, Check::Always),
    (r"\bhf_[A-Za-z0-9]{20,}", REDACTED, Check::Always),
    (r"\bglpat-[A-Za-z0-9_-]{20,}", REDACTED, Check::Always),
    (r"\bnpm_[A-Za-z0-9]{30,}", REDACTED, Check::Always),
    (r"\bpypi-[A-Za-z0-9_-]{16,}", REDACTED, Check::Always),
    (
        r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}",
        REDACTED,
        Check::Always,
    ),
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", REDACTED, Check::Always),
    (
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",
        REDACTED,
        Check::Always,
    ),
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", REDACTED, Check::Always),
    (r"\bAIza[0-9A-Za-z_-]{30,}", REDACTED, Check::Always),
    // JSON web tokens.
    (
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        REDACTED,
        Check::Always,
    ),
    // Azure storage account keys and shared-access signatures.
    (
        r"(?i)\b(?:Account|SharedAccess)Key\s*=\s*(?P<s>[A-Za-z0-9+/]{16,}={0,2})",
        REDACTED,
        Check::Always,
    ),
    (
        r"[?&]sig=(?P<s>[A-Za-z0-9%+/=]{16,})",
        REDACTED,
        Check::Always,
    ),
    // Cookie headers: the whole value, every pair in it.
    (
        r"(?im)^[ \t>]*(?:set-)?cookie:[ \t]*(?P<s>\S[^\r\n]*)",
        REDACTED,
        Check::Always,
    ),
    // Authorization credentials, when the word after the scheme, on its line, looks like
    // one (a path on the line after "expired token" is not).
    (
        r"(?i)\b(?:bearer|basic|token)[ \t]+(?P<s>[A-Za-z0-9._~+/=_-]{8,})",
        REDACTED,
        Check::LooksSecret,
    ),
    // Passwords in URLs: scheme://user:password@host.
    (
        r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:(?P<s>[^@\s/]+)@",
        REDACTED,
        Check::Always,
    ),
    // Assignments to keys that name a secret: password=…, "api_key": "…", secret: …
    (
        r#"(?i)(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|refresh[_-]?token|id[_-]?token|session[_-]?token|client[_-]?secret|private[_-]?key|cookie)["']?\s*[:=]\s*["']?(?P<s>[^\s"',;&]{4,})"#,
        REDACTED,
        Check::Always,
    ),
    // A bare `token` assignment, when the value looks like a credential.
    (
        r#"(?i)\btoken["']?\s*[:=]\s*["']?(?P<s>[^\s"',;&]{8,})"#,
        REDACTED,
        Check::LooksSecret,
    ),
];

fn rules() -> &'static [(Regex, &'static str, Check)] {
    static R: OnceLock<Vec<(Regex, &'static str, Check)>> = OnceLock::new();
    R.get_or_init(|| {
        let patterns: Vec<&str> = RULES.iter().map(|(p, _, _)| *p).collect();
        super::text::compile(&patterns)
            .into_iter()
            .zip(RULES.iter().map(|(_, r, c)| (*r, *c)))
            .map(|(re, (with, check))| (re, with, check))
            .collect()
    })
}

/// Whether a word after `Bearer`/`Basic`/`token` is a credential rather than prose:
/// letters and digits together, both cases (base64, random keys), or a long run with
/// key punctuation. "estimation", "budget" and "counting" are not.
fn looks_secret(value: &str) -> bool {
    // A sentence's full stop is not part of a word.
    let value = value.trim_end_matches('.');
    let has = |f: fn(&u8) -> bool| value.as_bytes().iter().any(f);
    let digit = has(u8::is_ascii_digit);
    let upper = has(u8::is_ascii_uppercase);
    let lower = has(u8::is_ascii_lowercase);
    let punct = has(|b| matches!(b, b'.' | b'_' | b'~' | b'+' | b'/' | b'='));
    value.len() >= 8
        && ((digit && (upper || lower)) || (upper && lower) || (punct && value.len() >= 10))
}

/// `text` with every secret replaced; borrowed when there was none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for (re, with, check) in rules() {
        if !re.is_match(&out) {
            continue;
        }
        let replaced = re.replace_all(&out, |caps: &Captures<'_>| {
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let Some(secret) = caps.name("s").or_else(|| caps.get(0)) else {
                return whole.to_owned();
            };
            if matches!(check, Check::LooksSecret) && !looks_secret(secret.as_str()) {
                return whole.to_owned();
            }
            let start = caps.get(0).map_or(0, |m| m.start());
            let (before, after) = (
                &whole[..secret.start() - start],
                &whole[secret.end() - start..],
            );
            format!("{before}{with}{after}")
        });
        // A match the check kept is replaced by itself: borrowed stays borrowed.
        if let Cow::Owned(changed) = replaced
            && changed != *out
        {
            out = Cow::Owned(changed);
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
            ("sk-ant-api03-abcdefghijklmnopqrst", "[REDACTED]"),
            ("AKIAIOSFODNN7EXAMPLE", "[REDACTED]"),
            (
                "Authorization: Bearer abc.def-ghi_jkl",
                "Authorization: Bearer [REDACTED]",
            ),
            (
                "Authorization: Basic dXNlcjpwYXNz",
                "Authorization: Basic [REDACTED]",
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
        assert_redacted(&cases);
    }

    #[test]
    fn the_shapes_the_first_version_missed_are_redacted() {
        let cases = [
            ("stripe sk_live_51HxAbCdEfGhIjKlMn", "stripe [REDACTED]"),
            ("rk_live_51HxAbCdEfGhIjKlMn", "[REDACTED]"),
            ("sk_test_4eC39HqLyjWDarjtT1zdp7dc", "[REDACTED]"),
            ("gsk_abcdefghijklmnopqrstuvwxyz012345", "[REDACTED]"),
            ("xai-abcdefghijklmnopqrstuvwxyz012345", "[REDACTED]"),
            ("hf_abcdefghijklmnopqrstuvwxyzABCD", "[REDACTED]"),
            ("glpat-abcdefghij1234567890", "[REDACTED]"),
            ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "[REDACTED]"),
            ("pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdo", "[REDACTED]"),
            (
                "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEF",
                "[REDACTED]",
            ),
            (
                "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=Zm9vYmFyYmF6cXV4cXV1eA==;EndpointSuffix=core.windows.net",
                "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=[REDACTED];EndpointSuffix=core.windows.net",
            ),
            (
                "https://acme.blob.core.windows.net/c/f?sv=2022-11-02&se=2026-01-01&sig=AbCdEf1234567890%2BxYz%3D",
                "https://acme.blob.core.windows.net/c/f?sv=2022-11-02&se=2026-01-01&sig=[REDACTED]",
            ),
            (
                "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
                "[REDACTED PRIVATE KEY]",
            ),
            (
                "POST /oauth refresh_token=1//0gAbCdEf-123&grant_type=refresh_token",
                "POST /oauth refresh_token=[REDACTED]&grant_type=refresh_token",
            ),
            (
                "GET / HTTP/1.1\nCookie: session=abc123; csrftoken=xyz789\nAccept: */*",
                "GET / HTTP/1.1\nCookie: [REDACTED]\nAccept: */*",
            ),
            (
                "Set-Cookie: id=a3fWa; Expires=Thu, 21 Oct 2021",
                "Set-Cookie: [REDACTED]",
            ),
            ("token: ya29.a0AfH6SMBx3", "token: [REDACTED]"),
        ];
        assert_redacted(&cases);
    }

    fn assert_redacted(cases: &[(&str, &str)]) {
        for (input, want) in cases {
            assert_eq!(redact(input), *want, "{input}");
        }
    }

    #[test]
    fn ordinary_text_is_borrowed() {
        for text in [
            "Run cargo test in src/compact; the token budget is 8000 tokens.",
            "The token estimation is calibrated; token counting errs high.",
            "Basic arithmetic, bearer bonds and token economics.",
            "A token: estimation of the budget.",
            "Cookies are nice; the cookie jar is empty.",
            "Use the signature (sig) parameter.",
            "description: Invalid or expired token\n\n  /auth/email/resend-verification:",
        ] {
            assert!(matches!(redact(text), Cow::Borrowed(_)), "{text}");
        }
    }
}

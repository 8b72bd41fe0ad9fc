//! A string that must never reach a log line.
//!
//! Credentials (the admin token, a summariser API key) are held as [`Secret`]: its `Debug`
//! and `Display` print `*****`, so a `?config` in a tracing macro cannot leak them. The
//! value is reachable only through [`Secret::expose`], which is easy to grep for.

use std::fmt;

use serde::{Deserialize, Deserializer};

const MASK: &str = "*****";

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value. Every call site is a place where a credential leaves its box.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What an operator may see of the value (`abridge --check-config`): a URL keeps its
    /// scheme, host, port and path, its password (or a user part alone, which may be a
    /// token) and any query masked — `redis://:*****@cache:6379/0`; anything else is
    /// `*****`.
    pub fn masked(&self) -> String {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return MASK.to_owned();
        };
        let plain_scheme = !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
        if !plain_scheme {
            return MASK.to_owned();
        }
        let (rest, query) = match rest.split_once(['?', '#']) {
            Some((rest, _)) => (rest, "?*****"),
            None => (rest, ""),
        };
        match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:{MASK}@{host}{query}"),
                None => format!("{scheme}://{MASK}@{host}{query}"),
            },
            None => format!("{scheme}://{rest}{query}"),
        }
    }

    /// Compares against `candidate` in time independent of where the first difference is,
    /// so a token cannot be guessed byte by byte from response timings.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        if ours.len() != candidate.len() {
            return false;
        }
        ours.iter()
            .zip(candidate)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_keeps_where_a_url_points_and_hides_what_opens_it() {
        let cases = [
            (
                "rediss://default:pa55@eu1-x.upstash.io:6379",
                "rediss://default:*****@eu1-x.upstash.io:6379",
            ),
            ("redis://:p@ss@cache:6379/0", "redis://:*****@cache:6379/0"),
            ("redis://tok3n@cache", "redis://*****@cache"),
            ("redis://cache:6379/2", "redis://cache:6379/2"),
            ("redis://cache?password=x", "redis://cache?*****"),
            ("sk-live-123", "*****"),
            ("not a url://x", "*****"),
        ];
        for (value, shown) in cases {
            assert_eq!(Secret::new(value).masked(), shown, "{value}");
        }
    }

    #[test]
    fn debug_and_display_hide_the_value() {
        let s = Secret::new("sk-live-123");
        assert_eq!(format!("{s:?}"), "*****");
        assert_eq!(format!("{s}"), "*****");
        assert_eq!(format!("{:?}", Some(&s)), "Some(*****)");
        assert_eq!(s.expose(), "sk-live-123");
    }

    #[test]
    fn matches_only_the_exact_value() {
        let s = Secret::new("token");
        assert!(s.matches(b"token"));
        assert!(!s.matches(b"tokem"));
        assert!(!s.matches(b"token2"));
        assert!(!s.matches(b""));
    }
}

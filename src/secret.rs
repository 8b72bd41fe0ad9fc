//! A string that must never reach a log line.
//!
//! Credentials (the admin token, a summariser API key) are held as [`Secret`]: its `Debug`
//! and `Display` print `*****`, so a `?config` in a tracing macro cannot leak them. The
//! value is reachable only through [`Secret::expose`], which is easy to grep for.

use std::fmt;

use serde::{Deserialize, Deserializer};

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
        f.write_str("*****")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("*****")
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

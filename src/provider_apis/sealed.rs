//! The `encrypted_content` of a `compaction` item abridge makes: self-contained and
//! integrity-protected, so any replica sharing the identity secret reads it, after a
//! restart and with a cold store. `abridge.v1.` + base64url(JSON payload) + `.` +
//! base64url(HMAC-SHA256 tag over everything before the last dot), keyed with a key
//! derived from the identity secret (`IdentityKey::derived`). Not encrypted: the summary
//! is the client's own conversation, which it sent in the clear. Anything else — another
//! provider's ciphertext, an altered or truncated token, a token signed with another
//! secret — does not open.
//!
//! The payload's fields are additive within `v1`: a field added later is optional, so a
//! token made before it opens without it, and a replica that predates it opens a newer
//! token and ignores the field (a rolling deploy never loses a summary). The one added so
//! far is `archive`: what the compaction replaced, for recall
//! ([`crate::recall::archive`]: compressed, bounded, redacted). Tokens that carry one
//! grow by its base64 (at most about 128 KiB, inside the payload's own base64).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::identity::IdentityKey;

/// What every token starts with.
const PREFIX: &str = "abridge.v1.";
/// The derived key's label.
const PURPOSE: &[u8] = b"abridge compaction item v1";

/// What a compaction item carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The summary of what the item replaces, as abridge expands it.
    pub summary: String,
    /// How many input items it summarised (earlier compactions' included).
    pub items: u64,
    /// When it was made (Unix seconds).
    pub created_at: u64,
    /// What it replaced, for recall (absent from tokens made before archives were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<String>,
}

impl Summary {
    /// Its archive, for recall.
    pub fn archive(&self) -> Option<crate::recall::Archive> {
        self.archive.as_deref().map(crate::recall::Archive::new)
    }
}

/// The token for `summary`.
pub fn seal(key: &IdentityKey, summary: &Summary) -> String {
    let payload = serde_json::to_vec(summary).unwrap_or_default();
    let signed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(payload));
    let tag = mac(key, signed.as_bytes()).finalize().into_bytes();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// What `token` carries, when abridge made it with this secret; `None` otherwise.
pub fn open(key: &IdentityKey, token: &str) -> Option<Summary> {
    let (signed, tag) = token.rsplit_once('.')?;
    let payload = signed.strip_prefix(PREFIX)?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    mac(key, signed.as_bytes()).verify_slice(&tag).ok()?;
    let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&payload).ok()
}

fn mac(key: &IdentityKey, bytes: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.derived(PURPOSE))
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(bytes);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn key(s: &str) -> IdentityKey {
        IdentityKey::new(Secret::new(s))
    }

    #[test]
    fn a_token_opens_with_the_same_secret_only() {
        let summary = Summary {
            summary: "The user asked for tests.".into(),
            items: 12,
            created_at: 1_700_000_000,
            archive: None,
        };
        let token = seal(&key("one"), &summary);
        assert!(token.starts_with("abridge.v1."));
        assert_eq!(open(&key("one"), &token), Some(summary));
        assert_eq!(open(&key("two"), &token), None, "another secret");
        let mut altered = token.clone().into_bytes();
        altered[15] ^= 1;
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(open(&key("one"), &altered), None, "altered");
        assert_eq!(open(&key("one"), &token[..token.len() - 2]), None);
        assert_eq!(open(&key("one"), "gAAAAABoOpenAI"), None, "foreign");
        assert_eq!(open(&key("one"), ""), None);
    }

    /// A token made before archives (its payload without the field, as that code wrote
    /// it) opens with no archive; one with an archive opens with it.
    #[test]
    fn a_token_without_an_archive_still_opens() {
        let old = br#"{"summary":"The user asked for tests.","items":3,"created_at":1700000000}"#;
        let signed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(old));
        let tag = mac(&key("one"), signed.as_bytes()).finalize().into_bytes();
        let token = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag));
        let opened = open(&key("one"), &token).unwrap();
        assert_eq!(opened.summary, "The user asked for tests.");
        assert_eq!(opened.archive, None);
        let summary = Summary {
            archive: Some("abc".into()),
            ..opened.clone()
        };
        assert_eq!(
            open(&key("one"), &seal(&key("one"), &summary)),
            Some(summary)
        );
        assert_eq!(
            seal(&key("one"), &opened),
            token,
            "without an archive, the same bytes as before"
        );
    }
}

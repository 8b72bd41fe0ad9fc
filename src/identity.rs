//! Conversation identity: which stored state a request belongs to, without any client
//! cooperation.
//!
//! Clients resend the whole history every turn. Each message is reduced to a canonical
//! byte form of the fields that carry meaning (role, content, name, tool calls,
//! tool-call id), hashed, and chained into a rolling prefix hash over the messages after
//! the head (the leading system/developer messages, `s` of them):
//!
//! ```text
//! h(s-1) = H(namespace)           namespace = HMAC(secret, tenant ‖ conversation id)
//! h(i)   = H(h(i-1) ‖ H(canon(m_i)))       for i ≥ s
//! ```
//!
//! so `h(i)` names "this exact history from the head to message i, for this tenant". A
//! checkpoint stores `h(through)`; a later request matches it only if its messages
//! `s..=through` are the same — an edited or forked history falls back to an older
//! checkpoint or none, never to a wrong summary. The conversation key is `h(first user
//! message)`.
//!
//! The head is left out of the chain on purpose: it is never summarised (every plan
//! keeps it verbatim), and many apps put the current time or an environment block in
//! their system prompt, which would otherwise make every turn a new conversation. It
//! has a hash of its own ([`Hashes::head`]), and for `i < s`, `h(i)` is `H(namespace)`
//! (nothing can be checkpointed there). A change in the number of head messages shifts
//! every index, and a checkpoint is matched at its own index, so nothing matches then:
//! safe, and rare.
//!
//! Canonical form (all framing length-prefixed, so it is prefix-free: no two different
//! messages produce the same bytes by concatenation):
//! - role: one tag byte;
//! - content: text (a string, or an array of only text parts, which is read as the equal
//!   string) → `T`+text; an array with non-text parts → `P` then per part `t`+text or
//!   `o`+raw JSON; any other JSON value → `O`+raw JSON. Empty text and `null`/absent
//!   content are the same (nothing);
//! - name → `N`+name, unless empty;
//! - each tool call → `C`+id+name+arguments (no calls and `[]` are the same);
//! - bytes the format does not model ([`Item::extra`]) → `X`+raw JSON;
//! - each id of a call it answers → `I`+id, unless empty;
//! - an opaque item: `w` (travels with the next) or `b` (a provider's compaction item).
//!
//! Everything else in an item (`refusal: null`, `annotations`, vendor fields, key order,
//! whitespace) is volatile for identity and does not change the hash. The item is
//! destructured in [`hash_message`], so adding a field to [`Item`] does not compile until
//! someone decides whether it is part of identity. Identity sees only the format-neutral
//! items, so it is the same for every wire format.
//!
//! The secret makes namespaces unguessable: knowing a tenant's credential does not let
//! anyone compute (or probe for) another deployment's keys, and the credential itself is
//! never stored — only this keyed hash of it.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::conversation::{Content, Item, Opaque, Part, Role};
use crate::secret::Secret;

/// A SHA-256 digest naming a message, a prefix of a conversation, or a namespace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        self.hex().to_owned()
    }

    /// The hex digits in a buffer on the stack: formatting a fingerprint (store keys,
    /// logs) allocates nothing of its own. `hex::encode` builds its string a char at a
    /// time, which showed in the per-request profile of the Redis path.
    pub fn hex(&self) -> HexDigits {
        let mut out = [0u8; 64];
        let encoded = hex::encode_to_slice(self.0, &mut out);
        debug_assert!(encoded.is_ok(), "64 digits for 32 bytes");
        HexDigits(out)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }

    fn of(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }
}

/// A fingerprint's 64 lowercase hex digits (`Deref` to the `str`).
pub struct HexDigits([u8; 64]);

impl std::ops::Deref for HexDigits {
    type Target = str;
    fn deref(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell fingerprints apart in logs and test failures.
        write!(f, "Fingerprint({}…)", &self.hex()[..12])
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Fingerprint::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom("not a 64-digit hex fingerprint"))
    }
}

/// The server secret that keys namespaces. Shared by all replicas (configured, or created
/// once and kept in the store).
#[derive(Clone)]
pub struct IdentityKey {
    secret: Secret,
    /// HMAC keyed with the secret, ready to take a message: keying hashes two blocks,
    /// which every namespace would otherwise pay again.
    keyed: Hmac<Sha256>,
}

impl IdentityKey {
    pub fn new(secret: Secret) -> Self {
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose().as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        Self { secret, keyed }
    }

    /// A fresh random secret (256 bits, hex).
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(Self::new(Secret::new(hex::encode(bytes))))
    }

    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The namespace of a tenant (its credential, or whatever the tenant header carries)
    /// and an optional explicit conversation id, for chat conversations.
    pub fn namespace(&self, tenant: &[u8], conversation: Option<&[u8]>) -> Fingerprint {
        self.namespace_in(
            tenant,
            Scope {
                format: None,
                conversation,
            },
        )
    }

    /// The namespace of a tenant within `scope`: a wire format's domain (so no state
    /// of one format is ever matched by a request in another) and the conversation id.
    pub fn namespace_in(&self, tenant: &[u8], scope: Scope<'_>) -> Fingerprint {
        let mut mac = self.keyed.clone();
        frame(&mut mac, b't', tenant);
        // Chat has no domain frame: its namespaces are those of before the other
        // formats, so stored state stays reachable across the upgrade. After the tenant
        // frame comes `f`, `c` or `-`: still prefix-free.
        if let Some(format) = scope.format {
            frame(&mut mac, b'f', format);
        }
        match scope.conversation {
            Some(id) => frame(&mut mac, b'c', id),
            None => mac.update(b"-"),
        }
        Fingerprint(mac.finalize().into_bytes().into())
    }
}

/// What narrows a tenant's namespace: the wire format's domain (`None` for chat) and
/// the conversation id (the client's `x-abridge-conversation`, or the format's hint).
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope<'a> {
    pub format: Option<&'a [u8]>,
    pub conversation: Option<&'a [u8]>,
}

impl IdentityKey {
    /// The tenant's id (a keyed hash of its credential headers, see
    /// `Credentials::tenant`): what abridge remembers about a credential is kept under
    /// it, never the credential.
    pub fn tenant_id(&self, tenant: &[u8]) -> Fingerprint {
        let mut mac = self.keyed.clone();
        frame(&mut mac, b'T', tenant);
        Fingerprint(mac.finalize().into_bytes().into())
    }
}

impl IdentityKey {
    /// A key for `purpose`, derived from the secret (a keyed hash of the framed label):
    /// what abridge signs its own tokens with, never the secret itself, so every replica
    /// sharing the secret derives the same key.
    pub fn derived(&self, purpose: &[u8]) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        frame(&mut mac, b'K', purpose);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentityKey(*****)")
    }
}

/// Every hash of a request, computed in one pass over its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashes {
    /// `prefixes[i]` = h(i): the rolling hash of messages `head..=i` (see the module
    /// docs; for `i` in the head, the namespace's seed).
    pub prefixes: Vec<Fingerprint>,
    /// Index of the first user message, if any.
    pub first_user: Option<usize>,
    /// How many leading system/developer messages make the head.
    pub head_len: usize,
    /// The head's own hash (all of its messages, chained from the same seed).
    pub head: Fingerprint,
}

impl Hashes {
    /// The conversation key: the prefix hash through the first user message. `None`
    /// when the request has no user message (nothing to recognise later).
    pub fn conversation(&self) -> Option<Fingerprint> {
        self.first_user.map(|i| self.prefixes[i])
    }
}

/// Who a request belongs to: its tenant, its conversation key and every prefix hash.
#[derive(Debug, Clone)]
pub struct Identified {
    /// The payer's id (the credential the provider authenticates; see
    /// `headers::Credentials::payer`): whose summaries and summary budget.
    pub payer: Fingerprint,
    pub conversation: Fingerprint,
    pub hashes: Hashes,
}

/// identify: the tenant (the value of the tenant header, e.g. the credential), its
/// payer (the credential the provider reads), the scope (format, optional explicit
/// conversation id), and the messages → the conversation, or `None` when the request
/// has no user message to recognise it by.
pub fn identify(
    key: &IdentityKey,
    (tenant, payer): (&[u8], &[u8]),
    scope: Scope<'_>,
    messages: &[Item<'_>],
) -> Option<Identified> {
    let namespace = key.namespace_in(tenant, scope);
    let hashes = hash_conversation(&namespace, messages);
    Some(Identified {
        payer: key.tenant_id(payer),
        conversation: hashes.conversation()?,
        hashes,
    })
}

/// Hashes every prefix of `messages` within `namespace` (see the module docs).
pub fn hash_conversation(namespace: &Fingerprint, messages: &[Item<'_>]) -> Hashes {
    let seed = Fingerprint::of(Sha256::new_with_prefix(namespace.as_bytes()));
    let head_len = messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let chain = |previous: Fingerprint, message: &Item<'_>| {
        let mut h = Sha256::new();
        h.update(previous.as_bytes());
        h.update(hash_message(message).as_bytes());
        Fingerprint::of(h)
    };
    let head = messages[..head_len].iter().fold(seed, chain);
    let mut prefixes = Vec::with_capacity(messages.len());
    prefixes.resize(head_len, seed);
    let mut previous = seed;
    let mut first_user = None;
    for (i, message) in messages.iter().enumerate().skip(head_len) {
        if first_user.is_none() && message.role == Role::User {
            first_user = Some(i);
        }
        previous = chain(previous, message);
        prefixes.push(previous);
    }
    Hashes {
        prefixes,
        first_user,
        head_len,
        head,
    }
}

/// `H(canon(m))`: see the module docs for the canonical form.
pub fn hash_message(message: &Item<'_>) -> Fingerprint {
    // Destructured on purpose: a new field must be classified here (hashed or volatile)
    // before this compiles.
    let Item {
        raw: _,
        role,
        content,
        name,
        calls,
        results,
        opaque,
        extra,
        // Read from the bytes `extra` holds; where the item stands, not what it is.
        reasoning: _,
        dropped: _,
    } = message;
    let mut h = Sha256::new();
    h.update([role_tag(*role)]);
    hash_content(&mut h, content);
    if let Some(name) = name.as_deref().filter(|n| !n.is_empty()) {
        frame(&mut h, b'N', name.as_bytes());
    }
    for call in calls {
        h.update([b'C']);
        frame(&mut h, b'i', call.id.as_bytes());
        frame(&mut h, b'n', call.name.as_bytes());
        frame(&mut h, b'a', call.arguments.as_bytes());
    }
    // A shape abridge does not know: its exact bytes are its identity.
    if let Some(raw) = extra {
        frame(&mut h, b'X', raw.get().as_bytes());
    }
    for id in results.iter().filter(|i| !i.is_empty()) {
        frame(&mut h, b'I', id.as_bytes());
    }
    match opaque {
        Opaque::None => {}
        Opaque::WithNext => h.update([b'w']),
        Opaque::Barrier => h.update([b'b']),
    }
    Fingerprint::of(h)
}

/// The canonical form of parsed content (see the module docs).
fn hash_content(h: &mut Sha256, content: &Content<'_>) {
    match content {
        Content::None => {}
        Content::Text(text) => {
            if !text.is_empty() {
                frame(h, b'T', text.as_bytes());
            }
        }
        // Only text parts: the same bytes as the string they concatenate to (see
        // `Content::as_text`), framed without building that string.
        Content::Parts(parts) if parts.iter().all(|p| matches!(p, Part::Text(_))) => {
            let texts = || {
                parts.iter().filter_map(|p| match p {
                    Part::Text(t) => Some(t.as_bytes()),
                    Part::Other(_) => None,
                })
            };
            let len: usize = texts().map(<[u8]>::len).sum();
            if len > 0 {
                h.update([b'T']);
                h.update((len as u64).to_le_bytes());
                texts().for_each(|t| h.update(t));
            }
        }
        Content::Parts(parts) => {
            h.update([b'P']);
            h.update((parts.len() as u64).to_le_bytes());
            for part in parts {
                match part {
                    Part::Text(t) => frame(h, b't', t.as_bytes()),
                    Part::Other(raw) => frame(h, b'o', raw.get().as_bytes()),
                }
            }
        }
        Content::Other(raw) => frame(h, b'O', raw.get().as_bytes()),
    }
}

fn role_tag(role: Role) -> u8 {
    match role {
        Role::System => b's',
        Role::Developer => b'd',
        Role::User => b'u',
        Role::Assistant => b'a',
        Role::Tool => b't',
        Role::Function => b'f',
    }
}

/// `tag ‖ len(bytes) as u64 LE ‖ bytes`: prefix-free framing.
fn frame(h: &mut impl Update, tag: u8, bytes: &[u8]) {
    h.feed(&[tag]);
    h.feed(&(bytes.len() as u64).to_le_bytes());
    h.feed(bytes);
}

/// The one thing [`frame`] needs from SHA-256 and HMAC alike.
trait Update {
    fn feed(&mut self, bytes: &[u8]);
}

impl Update for Sha256 {
    fn feed(&mut self, bytes: &[u8]) {
        Digest::update(self, bytes);
    }
}

impl Update for Hmac<Sha256> {
    fn feed(&mut self, bytes: &[u8]) {
        Mac::update(self, bytes);
    }
}

#[cfg(test)]
mod tests;

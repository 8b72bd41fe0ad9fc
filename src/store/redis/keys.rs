//! The names the Redis commands carry on the request path — a conversation's keys and
//! fingerprints in hex — written straight into the command being built, so a request
//! allocates no string of its own for them (`format!` per key showed in the per-request
//! profile of the Redis path).

use std::io::Write;

use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

use crate::identity::Fingerprint;

/// `<prefix>:{<conversation>}:<part>`: the braces are the Cluster hash tag, so every key
/// of one conversation is in one slot.
#[derive(Clone, Copy)]
pub(super) struct Key<'a> {
    prefix: &'a str,
    conversation: &'a Fingerprint,
    part: &'static str,
}

impl<'a> Key<'a> {
    pub(super) fn new(prefix: &'a str, conversation: &'a Fingerprint, part: &'static str) -> Self {
        Self {
            prefix,
            conversation,
            part,
        }
    }
}

impl ToRedisArgs for Key<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let hex = self.conversation.hex();
        let pieces = [
            self.prefix.as_bytes(),
            b":{",
            hex.as_bytes(),
            b"}:",
            self.part.as_bytes(),
        ];
        let mut arg = out.writer_for_next_arg();
        for piece in pieces {
            // The writers of `redis` append to a buffer in memory: they do not fail.
            let _ = arg.write_all(piece);
        }
    }
}

impl ToSingleRedisArg for Key<'_> {}

/// A fingerprint's hex digits as one argument; `None` is the empty argument.
pub(super) struct Hex<'a>(pub Option<&'a Fingerprint>);

impl ToRedisArgs for Hex<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self.0 {
            Some(f) => out.write_arg(f.hex().as_bytes()),
            None => out.write_arg(b""),
        }
    }
}

impl ToSingleRedisArg for Hex<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(value: impl ToRedisArgs) -> Vec<Vec<u8>> {
        value.to_redis_args()
    }

    #[test]
    fn a_key_is_prefix_hash_tag_and_part() {
        let f = Fingerprint::from_hex(&"ab".repeat(32)).unwrap();
        let key = Key::new("abridge", &f, "usage");
        let want = format!("abridge:{{{}}}:usage", "ab".repeat(32));
        assert_eq!(args(key), vec![want.clone().into_bytes()]);
        // Written into a command, the key is one argument with the same bytes.
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(key).arg("next");
        let packed = String::from_utf8(cmd.get_packed_command()).unwrap();
        assert_eq!(
            packed,
            format!(
                "*3\r\n$7\r\nHGETALL\r\n${}\r\n{want}\r\n$4\r\nnext\r\n",
                want.len()
            )
        );
    }

    #[test]
    fn hex_is_the_digits_or_empty() {
        let f = Fingerprint::from_hex(&"0f".repeat(32)).unwrap();
        assert_eq!(args(Hex(Some(&f))), vec!["0f".repeat(32).into_bytes()]);
        assert_eq!(args(Hex(None)), vec![Vec::<u8>::new()]);
    }
}

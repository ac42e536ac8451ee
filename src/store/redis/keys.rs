//! The names a [`RedisStore`] gives its keys and its invalidation
//! channel, with the hash-tag escaping that keeps distinct client keys apart.

use crate::store::check::Check;

use super::RedisStore;

impl RedisStore {
    /// `{prefix}:{<key>}:<rule>`, or its sliding log `…/log`.
    pub(super) fn key(&self, check: &Check<'_>, log: bool) -> Vec<u8> {
        let rule = check.rule.name().as_bytes();
        let mut k = Vec::with_capacity(self.prefix.len() + check.key().len() + rule.len() + 10);
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(b":{");
        escape_into(&mut k, check.key());
        k.extend_from_slice(b"}:");
        k.extend_from_slice(rule);
        if log {
            k.extend_from_slice(b"/log");
        }
        k
    }

    /// The channel resets and refunds are published on.
    pub(super) fn channel(&self) -> Vec<u8> {
        let mut channel = self.prefix.to_vec();
        channel.extend_from_slice(b":deny-cache");
        channel
    }
}

/// Appends `bytes` with the hash-tag delimiters escaped (`\` → `\\`, `{` → `\[`,
/// `}` → `\]`), and an empty key as `\0`, so the escaped key is a non-empty hash tag and
/// distinct keys stay distinct.
pub(super) fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        out.extend_from_slice(b"\\0");
        return;
    }
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'{' => out.extend_from_slice(b"\\["),
            b'}' => out.extend_from_slice(b"\\]"),
            _ => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        escape_into(&mut out, b);
        out
    }

    /// Escaping keeps keys distinct, non-empty and free of braces, so a key never breaks
    /// its hash tag, and leaves plain keys as they are.
    #[test]
    fn escaping_keeps_keys_distinct_and_tags_whole() {
        let keys: [&[u8]; 7] = [b"", b"\\0", b"a}b", b"a\\]b", b"{x}", b"\\", b"plain"];
        let all: Vec<_> = keys.iter().map(|k| escaped(k)).collect();
        for (i, a) in all.iter().enumerate() {
            assert!(!a.is_empty());
            assert!(!a.contains(&b'}') && !a.contains(&b'{'));
            for b in &all[..i] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(escaped(b"plain"), b"plain");
    }
}

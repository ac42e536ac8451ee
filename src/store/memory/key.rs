//! The key of a [`MemoryStore`](super::MemoryStore)'s map, and how it is hashed.

use std::hash::{Hash, Hasher};

use crate::rule::name_digest;
use crate::store::check::Check;

/// A rule's name and a key, `name ‖ key`: inline when they fit in [`INLINE_KEY`] bytes (no
/// allocation, compared in the map's own memory), else in one allocation.
///
/// Aligned to 32 bytes so a 96-byte bucket spans two cache lines, never three.
#[repr(align(32))]
pub(super) enum StoreKey {
    /// See [`Inline`].
    Inline(Inline),
    Heap {
        rule_len: usize,
        bytes: Box<[u8]>,
    },
}

/// An inline `name ‖ key`: `[name length, total length, name ‖ key, zeros]`. A lookup
/// compares the parts in place: a probe built in this form would stall store forwarding.
pub(super) type Inline = [u8; INLINE_KEY + 2];

/// The longest `name ‖ key` held inline: what fits beside the tag in the heap form's size.
pub(super) const INLINE_KEY: usize = 29;

impl StoreKey {
    pub(super) fn new(rule: &str, key: &[u8]) -> Self {
        if let Some(inline) = Self::inline(rule, key) {
            return Self::Inline(inline);
        }
        let mut bytes = Vec::with_capacity(rule.len() + key.len());
        bytes.extend_from_slice(rule.as_bytes());
        bytes.extend_from_slice(key);
        Self::Heap {
            rule_len: rule.len(),
            bytes: bytes.into_boxed_slice(),
        }
    }

    /// The inline form of `rule ‖ key`, if it fits.
    fn inline(rule: &str, key: &[u8]) -> Option<Inline> {
        let len = rule.len() + key.len();
        if len > INLINE_KEY {
            return None;
        }
        let mut bytes = [0; INLINE_KEY + 2];
        // Both fit in INLINE_KEY bytes, so in a u8.
        bytes[0] = rule.len() as u8;
        bytes[1] = len as u8;
        bytes[2..2 + rule.len()].copy_from_slice(rule.as_bytes());
        bytes[2 + rule.len()..2 + len].copy_from_slice(key);
        Some(bytes)
    }

    /// The rule's name and the key.
    pub(super) fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Self::Inline(bytes) => {
                bytes[2..2 + usize::from(bytes[1])].split_at(usize::from(bytes[0]))
            }
            Self::Heap { rule_len, bytes } => bytes.split_at(*rule_len),
        }
    }

    #[inline(always)]
    pub(super) fn matches(&self, check: &Check<'_>) -> bool {
        let (name, key) = (check.rule.name().as_bytes(), check.key());
        match self {
            Self::Inline(bytes) => {
                // Both lengths in one comparison, then the bytes where they are.
                let lengths = [bytes[0], bytes[1]];
                let total = name.len() + key.len();
                total <= INLINE_KEY
                    && lengths == [name.len() as u8, total as u8]
                    && same(&bytes[2..2 + name.len()], name)
                    && same(&bytes[2 + name.len()..2 + total], key)
            }
            Self::Heap { rule_len, bytes } => {
                *rule_len == name.len()
                    && bytes.len() == name.len() + key.len()
                    && same(&bytes[..name.len()], name)
                    && same(&bytes[name.len()..], key)
            }
        }
    }
}

/// Whether two slices hold the same bytes, a word at a time (the last word overlapping):
/// for a few dozen bytes, a call to `memcmp` costs more than the comparison.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return match n {
            4.. => word4(a, 0) == word4(b, 0) && word4(a, n - 4) == word4(b, n - 4),
            2.. => word2(a, 0) == word2(b, 0) && a[n - 1] == b[n - 1],
            1 => a[0] == b[0],
            0 => true,
        };
    }
    let mut i = 0;
    while i + 8 < n {
        if word8(a, i) != word8(b, i) {
            return false;
        }
        i += 8;
    }
    word8(a, n - 8) == word8(b, n - 8)
}

#[inline]
fn word8(s: &[u8], i: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&s[i..i + 8]);
    u64::from_ne_bytes(word)
}

#[inline]
fn word2(s: &[u8], i: usize) -> u16 {
    u16::from_ne_bytes([s[i], s[i + 1]])
}

#[inline]
fn word4(s: &[u8], i: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&s[i..i + 4]);
    u32::from_ne_bytes(word)
}

/// The map rehashes stored keys with this when it grows, so it must agree with
/// [`Shared::hash`](super::Shared::hash): both go through [`hash_pair`].
impl Hash for StoreKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (rule, key) = self.parts();
        hash_pair(state, name_digest(rule), key);
    }
}

/// The one way a (rule name, key) pair is hashed, for lookups and stored keys alike: the
/// name's [digest](name_digest), then the key's bytes read in place (a fresh copy stalls).
pub(super) fn hash_pair<H: Hasher>(state: &mut H, name_digest: u64, key: &[u8]) {
    state.write_u64(name_digest);
    state.write(key);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::same;

    proptest! {
        /// `same` says what `==` says, for every length a name or a key has and for slices
        /// that differ in one byte anywhere.
        #[test]
        fn same_is_equality(
            a in proptest::collection::vec(any::<u8>(), 0..70),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            prop_assert!(same(&a, &a.clone()));
            if !a.is_empty() {
                let mut b = a.clone();
                b[at.index(a.len())] ^= flip;
                prop_assert!(!same(&a, &b));
            }
            prop_assert!(!same(&a, &[a.as_slice(), &[0]].concat()));
        }
    }
}

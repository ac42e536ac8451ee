//! The key of a [`MemoryStore`](super::MemoryStore)'s map: a rule's name and a client key,
//! inline where they fit, and the one way such a pair is hashed.

use std::hash::{Hash, Hasher};

use crate::rule::name_digest;
use crate::store::check::Check;

/// A rule's name and a key, `name ‖ key`: inline when they fit in [`INLINE_KEY`] bytes (a
/// lookup then compares them in the map's own memory, and an entry costs no allocation of
/// its own), else in one allocation.
pub(super) enum StoreKey {
    /// See [`Inline`].
    Inline(Inline),
    Heap {
        rule_len: usize,
        bytes: Box<[u8]>,
    },
}

/// An inline `name ‖ key`: `[name length, total length, name ‖ key, zeros]`. A lookup
/// compares the name and the key with the stored parts where they are: building a probe of
/// this form first and reading it back whole stalls the load on the copy's narrower stores
/// (a store-forwarding stall).
pub(super) type Inline = [u8; INLINE_KEY + 2];

/// The longest `name ‖ key` a [`StoreKey`] holds inline: as much as fits beside its tag in
/// the 32 bytes its heap form takes anyway.
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

    #[inline]
    pub(super) fn matches(&self, check: &Check<'_>) -> bool {
        let (rule, key) = self.parts();
        rule == check.rule.name().as_bytes() && key == check.key
    }
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
/// name's digest ([`name_digest`], cached in the rule) and the key's bytes, read where they
/// are (a copy made just before would be read back before it is written out, a stall).
pub(super) fn hash_pair<H: Hasher>(state: &mut H, name_digest: u64, key: &[u8]) {
    state.write_u64(name_digest);
    state.write(key);
}

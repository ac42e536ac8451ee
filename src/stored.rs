//! Keys as the store keeps them ([`StoredKey`]).

use std::borrow::Cow;
use std::fmt;

use sha2::{Digest, Sha256};

/// Keys longer than this many bytes are stored under their SHA-256 digest.
pub(crate) const MAX_KEY_LEN: usize = 128;

/// A key in the form the store keeps it: the key itself up to 128 bytes, otherwise (and for
/// a key starting with `0xFF`) `0xFF` and the key's SHA-256, the same on every instance; no
/// key kept as itself can pose as a digest. Every [`Check`](crate::Check) carries this form,
/// so a 1 MB key costs a store, or a [`DecisionObserver`](crate::layer::DecisionObserver)
/// keeping it, 33 bytes. [`Limiter::peek`](crate::Limiter::peek) and
/// [`Limiter::reset`](crate::Limiter::reset) take either form.
///
/// ```
/// use tollgate::StoredKey;
///
/// let short = StoredKey::of(b"alice");
/// assert_eq!(short.as_bytes(), b"alice");
/// assert!(!short.is_digest());
///
/// let long = StoredKey::of(&[b'x'; 200]);
/// assert!(long.is_digest());
/// assert_eq!(long.as_bytes().len(), 33);
///
/// // Bytes read back (from a page, a log) are taken only in a form a key is stored under.
/// assert_eq!(StoredKey::from_stored(long.as_bytes()), Some(long.clone()));
/// assert_eq!(StoredKey::from_stored(&[0xFF, 1, 2]), None);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoredKey<'a>(Cow<'a, [u8]>);

impl<'a> StoredKey<'a> {
    /// The form `key` is stored under.
    pub fn of(key: &'a [u8]) -> Self {
        match KeyBytes::of(key) {
            KeyBytes::Kept(key) => Self(Cow::Borrowed(key)),
            KeyBytes::Digest(digest) => Self(Cow::Owned(digest.to_vec())),
        }
    }

    /// `bytes`, already in stored form: `None` when no key is stored so (over 128 bytes,
    /// or starting with `0xFF` but not 33 bytes long).
    pub fn from_stored(bytes: &'a [u8]) -> Option<Self> {
        let valid = match bytes.first() {
            Some(0xFF) => bytes.len() == 33,
            _ => bytes.len() <= MAX_KEY_LEN,
        };
        valid.then_some(Self(Cow::Borrowed(bytes)))
    }

    /// The bytes the store keeps the key under.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether these bytes are the digest of a longer key rather than the key itself.
    pub fn is_digest(&self) -> bool {
        self.0.first() == Some(&0xFF)
    }

    /// The same key, owning its bytes.
    pub fn into_owned(self) -> StoredKey<'static> {
        StoredKey(Cow::Owned(self.0.into_owned()))
    }

    /// Bytes already in stored form, as a [`Check`](crate::Check) carries them.
    pub(crate) fn kept(bytes: &'a [u8]) -> Self {
        Self(Cow::Borrowed(bytes))
    }
}

/// A key's own bytes, stored in their form.
impl<'a, K: AsRef<[u8]> + ?Sized> From<&'a K> for StoredKey<'a> {
    fn from(key: &'a K) -> Self {
        Self::of(key.as_ref())
    }
}

/// A key already in its stored form, as it is.
impl<'a> From<&'a StoredKey<'_>> for StoredKey<'a> {
    fn from(key: &'a StoredKey<'_>) -> Self {
        Self::kept(key.as_bytes())
    }
}

/// A key's stored form, borrowed or the digest inline: a check stays `Copy`, unallocated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyBytes<'a> {
    /// A key kept as itself, or bytes already in stored form.
    Kept(&'a [u8]),
    /// The byte `0xFF` and the key's SHA-256.
    Digest([u8; 33]),
}

impl<'a> KeyBytes<'a> {
    /// The form `key` is stored under.
    #[inline]
    pub(crate) fn of(key: &'a [u8]) -> Self {
        if key.len() <= MAX_KEY_LEN && key.first() != Some(&0xFF) {
            return Self::Kept(key);
        }
        Self::digest(key)
    }

    #[inline(never)]
    fn digest(key: &[u8]) -> Self {
        let mut digest = [0xFF; 33];
        digest[1..].copy_from_slice(&Sha256::digest(key));
        Self::Digest(digest)
    }

    /// The bytes the store keeps.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Kept(key) => key,
            Self::Digest(digest) => digest,
        }
    }
}

impl fmt::Debug for StoredKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        f.debug_tuple("StoredKey").field(&hex).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::StoredKey;

    /// Short keys reach the store as they are, and long ones as a fixed-size digest of the
    /// key.
    #[test]
    fn long_keys_are_digested_and_short_ones_kept() {
        assert_eq!(StoredKey::of(b"alice").as_bytes(), b"alice");
        let long = vec![b'x'; 1 << 20];
        let a = StoredKey::of(&long);
        assert_eq!(a.as_bytes().len(), 33);
        assert_eq!(a, StoredKey::of(&long));
        let mut other = long.clone();
        other[12345] = b'y';
        assert_ne!(a, StoredKey::of(&other));
    }
}

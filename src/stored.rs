//! Keys as the store keeps them, and the limiter's `peek` and `reset` by such a key: what a
//! dashboard holds of a key it saw decided (through a
//! [`DecisionObserver`](crate::layer::DecisionObserver)) and acts on later.

use std::borrow::Cow;
use std::fmt;

use crate::decision::RuleOutcome;
use crate::error::StoreError;
use crate::limiter::{store_key, Limiter, MAX_KEY_LEN};
use crate::rule::Rule;
use crate::store::check::Check;
use crate::store::Store;

/// A key in the form the store keeps it: the key itself up to 128 bytes, otherwise (and for
/// a key starting with the byte `0xFF`) the byte `0xFF` and the key's 32-byte SHA-256, as
/// [`Limiter::check`] stores it. The two forms cannot be confused: no key kept as itself
/// starts with `0xFF`.
///
/// A [`DecisionObserver`](crate::layer::DecisionObserver) receives keys in this form, so
/// that what it keeps of a client sending a 1 MB key is 33 bytes, and
/// [`Limiter::peek_stored`] and [`Limiter::reset_stored`] still reach that client's state.
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
        Self(store_key(key))
    }

    /// `bytes`, already in stored form: `None` when no key is stored so (longer than 128
    /// bytes, or starting with `0xFF` without being 33 bytes long).
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
}

impl fmt::Debug for StoredKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hex = String::with_capacity(self.0.len() * 2);
        for b in self.0.iter() {
            hex.push_str(&format!("{b:02x}"));
        }
        f.debug_tuple("StoredKey").field(&hex).finish()
    }
}

/// `peek` and `reset` by the key's stored form.
impl<S: Store> Limiter<S> {
    /// [`peek`](Self::peek) for a key in its stored form: what a request of `cost` would get
    /// from `rule`, without consuming anything. A key the store does not hold (never seen,
    /// expired, or forgotten by a [`MemoryStore`](crate::store::MemoryStore) past its
    /// [bound](crate::store::MemoryStore::max_keys)) is reported fresh, as `check` would
    /// find it.
    pub async fn peek_stored(
        &self,
        rule: &Rule,
        key: &StoredKey<'_>,
        cost: u64,
    ) -> Result<RuleOutcome, StoreError> {
        self.store()
            .peek(Check::new(rule, key.as_bytes()).with_cost(cost))
            .await
    }

    /// [`reset`](Self::reset) for a key in its stored form: clears its state under `rule`
    /// and lifts any lock.
    pub async fn reset_stored(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        if let Err(e) = rule.validate() {
            return Err(StoreError::InvalidBatch(e.to_string()));
        }
        self.store().reset(rule, key.as_bytes()).await
    }
}

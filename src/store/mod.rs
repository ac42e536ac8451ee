//! Where rule state lives: the [`Store`] trait and its implementations.
//!
//! A store decides a batch of [`Check`]s atomically (see [`Store::check`]). It keeps the
//! state; the arithmetic comes from the algorithms' models, which the Lua scripts of a
//! [`RedisStore`](crate::RedisStore) twin.

pub(crate) mod batch;
mod breaker;
pub(crate) mod check;
mod fallback;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use breaker::{Breaker, BreakerState};
pub use fallback::Fallback;

// The store's vocabulary and the stores themselves are at the crate's root
// (`tollgate::Store`, `tollgate::MemoryStore`, `tollgate::RedisStore`).
pub(crate) use check::{Check, Health, Store};
pub(crate) use memory::MemoryStore;

//! Where rule state lives: the [`Store`] trait and its implementations.
//!
//! A store decides a batch of [`Check`]s atomically (see [`Store::check`]). It keeps the
//! state; the arithmetic comes from the algorithms' models, which the Lua scripts of a
//! [`RedisStore`](crate::store::RedisStore) twin.

pub(crate) mod batch;
mod breaker;
pub(crate) mod check;
mod fallback;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use breaker::{Breaker, BreakerState};
pub use check::{Health, Store};
pub use fallback::Fallback;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisOptions, RedisStore};

// A store's question is the crate's: `tollgate::Check`.
pub(crate) use check::Check;

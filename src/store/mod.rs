//! Where rule state lives: the [`Store`] trait and its implementations.
//!
//! A store decides a batch of [`Check`]s atomically (see [`Store::check`]). It keeps the
//! state; the arithmetic comes from the algorithms' models, which the Lua scripts of a
//! [`RedisStore`] twin.

pub(crate) mod batch;
mod breaker;
mod check;
mod fallback;
mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
mod redis;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub use breaker::{Breaker, BreakerState};
pub use fallback::Fallback;
pub use memory::MemoryStore;

pub use check::{Check, Health, Store};

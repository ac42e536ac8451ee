//! Where rule state lives: the [`Store`] trait and its implementations.
//!
//! A store decides a batch of [`Check`]s atomically (see [`Store::check`]). It keeps the
//! state; the arithmetic comes from [`crate::algorithm`].

pub(crate) mod batch;
mod breaker;
mod check;
mod fallback;
mod memory;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::RedisStore;
pub use breaker::{Breaker, BreakerState, DEFAULT_FAILURES, DEFAULT_OPEN_FOR};
pub use fallback::Fallback;
pub use memory::MemoryStore;

pub use check::{Check, Health, Store};

//! Where rule state lives: the [`Store`] trait and every store.
//!
//! - [`MemoryStore`]: in this process, bounded; the default of a layer, tests, single nodes.
//! - [`RedisStore`] (feature `redis`): in Redis (standalone or Cluster), shared by instances.
//! - [`Breaker`]: a circuit breaker around a store, so that a failing one answers at once.
//! - [`Fallback`]: a primary store, and a local one that decides while the primary cannot.
//! - [`Leased`]: decides a hot key in process from a leased share of its quota.
//!
//! A store decides a batch of [`Check`]s atomically ([`Store::check`]); [`Health`] says
//! how well.
//!
#![cfg_attr(feature = "redis", doc = "[`RedisStore`]: crate::store::RedisStore")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisStore`]: https://docs.rs/tollgate/latest/tollgate/store/struct.RedisStore.html"
)]

pub(crate) mod batch;
mod breaker;
pub(crate) mod check;
mod fallback;
mod lease;
pub(crate) mod memory;
pub(crate) mod parked;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod reservation;

pub use breaker::Breaker;
pub use check::{Health, Store};
pub use fallback::Fallback;
pub use lease::Leased;
pub use memory::{MemoryStats, MemoryStore};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisOptions, RedisStore};

// Re-exported at the root as `tollgate::Check`.
pub(crate) use check::Check;

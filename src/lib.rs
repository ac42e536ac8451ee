//! Distributed rate limiting for tower services.
//!
//! tollgate decides whether a request may pass under one or more [`Rule`]s, each counting
//! under a key (a client IP, a user id, a constant for a global limit). Six exact integer
//! algorithms: fixed window, sliding log, sliding window counter, token bucket, leaky bucket
//! (shaping) and GCRA ([choosing one](guide::choosing_an_algorithm)). A [`Penalty`] locks a
//! key out after abuse. State lives in a [`store`]: [`MemoryStore`](store::MemoryStore) in
//! this process, `RedisStore` (feature `redis`) in Redis for many instances.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, Limiter, Rate, Rule, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! // Per user: bursts of 10, then 2 per second.
//! let per_user = Rule::token_bucket("user", 10, Rate::per_second(2));
//! // A download of 4 units costs 4.
//! let outcome = limiter.check(&[Check::new(&per_user, b"user-42").with_cost(4)]).await?;
//! assert!(outcome.is_admitted());
//! assert_eq!(outcome.rules[0].info.remaining, 6);
//! # Ok(()) }
//! ```
//!
//! A batch of rules is decided all or nothing: if one rule denies, no rule consumes. Every
//! clone of a [`Limiter`] shares its store.
//!
//! For HTTP and gRPC, [`RateLimitLayer`](layer::RateLimitLayer) applies rules in any tower
//! stack (axum, hyper, tonic), with keys from the request ([`key`]); see [`layer`].
//!
//! Optional features (none on by default): `axum` and `tonic` let [`key::peer_ip`] read
//! their connection info (and [`key::route`] axum's `MatchedPath`); the layer over tonic
//! needs `tonic` to answer in its body type. `metrics` records
//! decisions, store latency and health, and held requests ([`layer::observe`]). `serde`
//! reads a layer's rules from a file
//! (`tollgate::layer::rules_file`), naming the file, line and field of a problem; a
//! [`ReloadHandle`](layer::ReloadHandle) swaps them in a running layer.
//!
//! The [`guide`] has a page per use case.
//!
//! # Glossary
//!
//! The words the documentation and the code use for a request's life:
//!
//! - **check**: a store decides a batch of rules for a request, all or nothing.
//! - **hold**: an admitted request waits before it passes (a leaky bucket's shaping delay, or
//!   wait mode's reserved slot), in a [`Reservation`].
//! - **release**: the instant a held request passes.
//! - **pending**: a rule that counts a held request only at its release (a global limit
//!   beside the per-user leaky bucket that delays it; see [`Store::check`](store::Store::check)).
//!   [`Reservation::confirm`] counts it.
//! - **refund**: units a request took go back to the store that took them, for a request
//!   that will not pass or does not count ([`Reservation::cancel`], [`layer::Charge`]).
//! - **settle**: a served request's cost becomes known: what its admission took beyond it
//!   is refunded, what it took short is an **overdraft**, a debt the key's next requests pay
//!   ([`Reservation::settle`], [`Limit::cost_from_response`](layer::Limit::cost_from_response)).
//! - **mark**: identifies the state an admission left, so a refund takes back only its units.
//! - **carried**: units a rule's previous configuration had in use, counted by its new one
//!   after a change under the same name.
//! - **shadow**: a rule checked and reported but not enforced.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod algorithm;
mod clock;
mod decision;
mod error;
pub mod guide;
pub mod key;
pub mod layer;
mod limiter;
mod log;
mod penalty;
mod rate;
mod rule;
pub mod store;
mod stored;

pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{
    Decision, Denial, DenyReason, Outcome, RateLimitInfo, RuleOutcome, RuleOutcomes,
};
pub use error::{ConfigError, StoreError};
pub use limiter::Limiter;
pub use penalty::Penalty;
pub use rate::Rate;
pub use rule::Rule;
pub use store::check::{Check, Refusal};
pub use store::reservation::Reservation;
pub use stored::StoredKey;

/// The README's examples compile and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

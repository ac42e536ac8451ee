//! # Waiting for a permit instead of being refused
//!
//! Some callers would rather wait a little than be refused: a batch job calling a partner
//! API, or a service smoothing its clients' bursts. tollgate reserves the slot atomically
//! and says how long to wait: no polling loop, no thundering herd, reservations in order.
//!
//! ## Outside HTTP: [`Limiter::reserve`](crate::Limiter::reserve)
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, Decision, Limiter, Rate, Rule, store::{MemoryStore, Store}};
//!
//! /// Waits until `rule` admits one more call for `key`, up to `max_wait`.
//! async fn acquire<S: Store + Clone>(
//!     limiter: &Limiter<S>,
//!     rule: &Rule,
//!     key: &[u8],
//!     max_wait: Duration,
//! ) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut reservation = limiter.reserve(&[Check::new(rule, key)], max_wait).await?;
//!     // The slot is ours: `confirm` waits until it comes due. Were this task cancelled
//!     // while it waits, dropping the reservation would give the slot to the next caller.
//!     match reservation.confirm().await?.decision {
//!         Decision::Deny(denial) => Err(format!("busy; retry after {:?}", denial.retry_after).into()),
//!         _ => Ok(()),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! // The partner allows 50 calls a second, and no bursts.
//! let partner = Rule::gcra("partner-api", 1, Rate::per_second(50));
//! let started = std::time::Instant::now();
//! for _ in 0..5 {
//!     acquire(&limiter, &partner, b"partner", Duration::from_secs(1)).await?;
//!     // call the partner here
//! }
//! // Five calls, 20 ms apart.
//! assert!(started.elapsed() >= Duration::from_millis(80));
//! # Ok(()) }
//! ```
//!
//! ## In the layer: [`Mode::Wait`](crate::layer::Mode::Wait)
//!
//! In wait mode the layer holds a request until its reserved slot comes due; one that would
//! wait longer than `max_wait` is refused. See [held requests](#held-requests) for their
//! bounds and what a client hanging up gives back.
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, Mode, RateLimitLayer};
//! use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     .limit(Limit::new(Rule::gcra("smooth", 1, Rate::per_second(20)), key::global()))
//!     .mode(Mode::Wait { max_wait: Duration::from_millis(200) })
//!     .build()?;
//! let app = limits.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//!
//! let started = std::time::Instant::now();
//! let (a, b, c) = tokio::join!(
//!     app.clone().oneshot(Request::new(())),
//!     app.clone().oneshot(Request::new(())),
//!     app.clone().oneshot(Request::new(())),
//! );
//! // All three pass, 50 ms apart, instead of two of them being refused.
//! for response in [a?, b?, c?] {
//!     assert_eq!(response.status(), StatusCode::OK);
//! }
//! assert!(started.elapsed() >= Duration::from_millis(100));
//! # Ok(()) }
//! ```
//!
//! A [leaky bucket](crate::Rule::leaky_bucket) shapes traffic the same way in enforce mode:
//! its admitted requests leave evenly spaced, a full queue is refused.
//!
//! ## Held requests
//!
//! A request held (in wait mode, or for a leaky bucket's shaping delay):
//!
//! - **does not hold the inner service**: it waits with an idle clone, driven to readiness
//!   after the wait, so a `ConcurrencyLimit` or `Buffer` inside the layer keeps serving
//!   other clients meanwhile.
//! - **is bounded**: at most [`max_held`](crate::layer::RateLimitLayerBuilder::max_held)
//!   requests at once (10,000 unless changed), and a tenth of that per (rule, key) that
//!   delays them ([`max_held_per_key`](crate::layer::RateLimitLayerBuilder::max_held_per_key)).
//!   A request beyond a bound is refused as if denied (429, `Retry-After` its delay), its
//!   units given back.
//! - **gives its units back** when dropped before its release (its client hung up, a
//!   timeout above the layer fired): through [`Store::refund`](crate::store::Store::refund),
//!   once, best effort, never after its release. A request dropped while the store is still
//!   deciding has nothing to give back yet.
//! - **is counted where it passes**: the rules on other keys than the leaky bucket that
//!   holds it (a global limit beside a per-client queue) are checked at once as they will
//!   stand at the release, and confirmed at the release
//!   ([`Reservation::confirm`](crate::Reservation::confirm)); if other requests took their
//!   room meanwhile, it is refused then (429). So a shared window never admits more than
//!   its limit, and one client's queue never closes a shared limit to the others. In wait
//!   mode it may wait again at the release, for what is left of `max_wait`. The
//!   confirmation is a second store call, and a second decision for the layer's observers.
//! - **costs memory** until released: its response future, the boxed hold, the request
//!   and the idle clone of the inner service; `max_held` bounds the total.

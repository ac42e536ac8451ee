//! # Waiting for a permit instead of being refused
//!
//! Some callers would rather wait a little than be refused: a batch job calling a partner
//! API that allows 10 calls a second, or a service smoothing its own clients' bursts.
//! tollgate reserves the slot atomically and says how long to wait for it: no polling
//! loop, no thundering herd when the slot opens, and the order of reservations is kept.
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
//! If the caller goes away while waiting (its task is cancelled), the dropped
//! [`Reservation`](crate::Reservation) gives the slot back, so the next caller can have it.
//!
//! ## In the layer: [`Mode::Wait`](crate::layer::Mode::Wait)
//!
//! In wait mode the layer holds a request until its reserved slot comes due, then forwards
//! it; a request that would wait longer than `max_wait` is refused as in enforce mode. A
//! held request does not hold the inner service (a `ConcurrencyLimit` inside keeps serving
//! others), held requests are bounded ([`max_held`](crate::layer::RateLimitLayerBuilder::max_held),
//! [`max_held_per_key`](crate::layer::RateLimitLayerBuilder::max_held_per_key)), and a request whose
//! client hangs up gives its slot back (see [held requests](crate::layer#held-requests)).
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, Mode, RateLimitLayer};
//! use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::builder()
//!     .limit(Limit::new(Rule::gcra("smooth", 1, Rate::per_second(20)), key::global()))
//!     .mode(Mode::Wait { max_wait: Duration::from_millis(200) })
//!     .build()?;
//! let app = ServiceBuilder::new()
//!     .layer(limits)
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(()))
//!     }));
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
//! its admitted requests are held so that they leave evenly spaced, and a full queue is
//! refused (nginx's `limit_req` without `nodelay`). Rules on other keys in the same batch (a
//! global limit beside a per-client queue) count a shaped request when it leaves the queue,
//! not when it joins it: [`Reservation::confirm`](crate::Reservation::confirm) counts them.
//! Leaky buckets on several keys of one batch (a per-client queue beside a per-tenant one)
//! all hold the request until the last of them lets it go, so neither lets its traffic
//! leave faster than its rate.

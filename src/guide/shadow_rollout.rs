//! # Rolling out a rule in shadow mode
//!
//! A new limit that is too strict refuses good clients; one that is too loose protects
//! nothing. Before enforcing it, run it in shadow: it is decided with the others and keeps
//! its state as if enforced, but never refuses or holds a request. Its would-be denials
//! are logged (`tracing`, at most once per [`log_interval`](crate::layer::RateLimitLayerBuilder::log_interval)
//! with a count) and told to the layer's [observers](crate::layer::DecisionObserver), where
//! you can count them per rule (with the `metrics` feature, `tollgate_decisions_total`
//! counts them as `shadow_denied`).
//!
//! One rule in shadow beside enforced ones: [`Limit::shadow`](crate::layer::Limit::shadow).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{DecisionEvent, DecisionObserver, Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! /// Counts the would-be denials of the rules in shadow.
//! #[derive(Default)]
//! struct WouldRefuse(AtomicUsize);
//!
//! impl DecisionObserver for WouldRefuse {
//!     fn on_decision(&self, event: &DecisionEvent<'_>) {
//!         for rule in event.rules.iter().filter(|r| r.shadow) {
//!             if rule.outcome.is_some_and(|o| !o.decision.is_admitted()) {
//!                 self.0.fetch_add(1, Ordering::Relaxed); // or a metrics counter per rule
//!             }
//!         }
//!     }
//! }
//!
//! let minute = Duration::from_secs(60);
//! let would_refuse = Arc::new(WouldRefuse::default());
//! let limits = RateLimitLayer::builder()
//!     // Enforced today: 100 a minute per user.
//!     .limit(Limit::new(Rule::fixed_window("search", 100, minute), key::header("user-id")))
//!     // In shadow: 3 a minute. Would it refuse good clients?
//!     .limit(Limit::new(Rule::sliding_log("search-strict", 3, minute), key::header("user-id")).shadow())
//!     .observe(would_refuse.clone())
//!     .build()?;
//! let app = limits.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//!
//! for _ in 0..5 {
//!     let search = Request::get("/search").header("user-id", "42").body(())?;
//!     let response = app.clone().oneshot(search).await?;
//!     // Never refused by the shadow rule…
//!     assert_eq!(response.status(), StatusCode::OK);
//!     // …nor advertised to clients, who should not plan around it.
//!     assert!(!response.headers()["ratelimit-policy"].to_str()?.contains("search-strict"));
//! }
//! // …but it would have refused the last two.
//! assert_eq!(would_refuse.0.load(Ordering::Relaxed), 2);
//! # Ok(()) }
//! ```
//!
//! A request the shadow rule would deny consumes none of its quota, as if it had been
//! refused, so its counts are those enforcing it would produce. When the numbers look
//! right, remove `.shadow()`: the rule keeps its name and parameters, so it starts
//! enforcing with the state it has built up.
//!
//! ## A whole layer in shadow
//!
//! The builder's `.mode(Mode::Shadow)` ([`Mode::Shadow`](crate::layer::Mode::Shadow)) puts
//! every rule of a layer in shadow: for the first rate limiting in front of a service. A
//! request without a key or a failed store is logged and let through too, so a mistake in
//! the configuration cannot refuse anyone yet.

//! # SMS codes: limits on several levels, all or nothing
//!
//! A service that texts login codes limits each phone number to 1 message a minute, 5 an
//! hour and 10 a day, and each client address to 20 an hour. A request refused by any rule
//! must use up none of the others.
//!
//! The rules of one request are one batch: if one rule denies, no rule's state changes, and
//! the denial carries the longest wait. The phone number is in the body, which the layer
//! does not read, so the handler asks the [`Limiter`](crate::Limiter) once it has parsed it:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, Limiter, ManualClock, Rate, Rule, store::{MemoryStore, Store}};
//!
//! /// The rules, built once (a rule's name and parameters are its identity).
//! struct SmsRules {
//!     minute: Rule,
//!     hour: Rule,
//!     day: Rule,
//!     per_address: Rule,
//! }
//!
//! impl SmsRules {
//!     fn new() -> Self {
//!         let minute = Duration::from_secs(60);
//!         Self {
//!             minute: Rule::sliding_log("sms-minute", 1, minute),
//!             hour: Rule::sliding_log("sms-hour", 5, 60 * minute),
//!             day: Rule::sliding_log("sms-day", 10, 24 * 60 * minute),
//!             per_address: Rule::token_bucket("sms-ip", 20, Rate::per_hour(20)),
//!         }
//!     }
//! }
//!
//! /// Sends a code to `phone` if every limit allows it; otherwise says how long to wait.
//! async fn send_code<S: Store>(
//!     limiter: &Limiter<S>,
//!     rules: &SmsRules,
//!     phone: &str,
//!     client_ip: &str,
//! ) -> Result<(), Option<Duration>> {
//!     let (phone, ip) = (phone.as_bytes(), client_ip.as_bytes());
//!     let batch = [
//!         Check::new(&rules.minute, phone),
//!         Check::new(&rules.hour, phone),
//!         Check::new(&rules.day, phone),
//!         Check::new(&rules.per_address, ip),
//!     ];
//!     // A store failure: here, refuse (a code that is never sent is the safe side).
//!     let outcome = limiter.check(&batch).await.map_err(|_| None)?;
//!     match outcome.decision.denial() {
//!         None => Ok(()), // send the message here
//!         Some(denial) => Err(denial.retry_after),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A simulated clock, so this example can spend a day in no time.
//! let clock = ManualClock::new(0);
//! let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
//! let rules = SmsRules::new();
//! let phone = "+8613800000000";
//!
//! assert_eq!(send_code(&limiter, &rules, phone, "198.51.100.7").await, Ok(()));
//! // Again at once: the minute rule refuses, and says when to retry.
//! let refused = send_code(&limiter, &rules, phone, "198.51.100.7").await;
//! assert_eq!(refused, Err(Some(Duration::from_secs(60))));
//! // The refused message used up nothing: 4 of the hour's 5 are left.
//! // (`peek` asks what a request of that cost would get, consuming nothing.)
//! assert!(limiter.peek(&rules.hour, phone, 4).await.unwrap().decision.is_admitted());
//! assert!(!limiter.peek(&rules.hour, phone, 5).await.unwrap().decision.is_admitted());
//!
//! // One a minute for four more minutes: then the hour rule says no, until the first of
//! // the five is an hour old.
//! for _ in 0..4 {
//!     clock.advance(Duration::from_secs(60));
//!     assert_eq!(send_code(&limiter, &rules, phone, "198.51.100.7").await, Ok(()));
//! }
//! clock.advance(Duration::from_secs(60));
//! let refused = send_code(&limiter, &rules, phone, "198.51.100.7").await;
//! assert_eq!(refused, Err(Some(Duration::from_secs(55 * 60))));
//! # }
//! ```
//!
//! The rules are sliding logs, as [choosing an algorithm](super::choosing_an_algorithm)
//! recommends for SMS: never more than 1 message in any 60 seconds, 5 in any 60 minutes, 10
//! in any 24 hours. Where a quota is meant per calendar hour or day, use
//! [`Rule::fixed_window`](crate::Rule::fixed_window) (aligned to the epoch: the day at
//! midnight UTC) or [`Rule::fixed_window_from_first_hit`](crate::Rule::fixed_window_from_first_hit).
//!
//! ## When the key is in the request's head
//!
//! When the key is in the head (a `User-Id` header, the address), the layer does the same
//! with a route table of these four rules, its global and route limits still one batch, as
//! [the layer's example](crate::layer) does for two. `cargo run --example sms` runs the whole
//! case on simulated time, and `cargo run --example axum_routes` serves it over HTTP.

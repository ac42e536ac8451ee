//! # Choosing an algorithm
//!
//! Six algorithms, each an exact integer model (time in microseconds), each taking a cost
//! per request. The README's chart (`cargo run -p tollgate-bench --bin algorithms_chart`)
//! draws them side by side on the same traffic.
//!
//! | constructor | choose it for | memory per key | more than the limit in some window-long interval? | exact range | cost of a decision |
//! |---|---|---|---|---|---|
//! | [`Rule::fixed_window`](crate::Rule::fixed_window) (or [`fixed_window_from_first_hit`](crate::Rule::fixed_window_from_first_hit)) | quotas people read as "5 per hour"; the cheapest | one counter | yes: up to 2 × limit across a boundary | every limit and window up to 2^50 µs | O(1) |
//! | [`Rule::sliding_log`](crate::Rule::sliding_log) | strict limits that must hold in every interval (SMS, logins, paid APIs) | one entry per admitting instant (at most the limit) | never | every limit and window up to 2^50 µs | O(log n), n the entries in one window |
//! | [`Rule::sliding_window`](crate::Rule::sliding_window) | a smoother fixed window in O(1) memory | two counters | can: the estimate assumes the previous window's requests were evenly spread; sustained traffic gets `limit − 1` per window | to the µs while limit × window (µs) ≤ 2^52; beyond, the previous window's weight moves in steps, never lighter than exact | O(1) |
//! | [`Rule::token_bucket`](crate::Rule::token_bucket) (or [`token_bucket_stepped`](crate::Rule::token_bucket_stepped)) | a burst, then a sustained rate; sizes and costs (downloads) | two integers | yes, by design: capacity + rate × window | smooth: while capacity × period / gcd(amount, period) ≤ 2^52, beyond it the rate is rounded down by under 1 µs per token; stepped: always | O(1) |
//! | [`Rule::leaky_bucket`](crate::Rule::leaky_bucket) | shaping: requests leave evenly spaced (nginx `limit_req`), for a fragile backend | two integers | never: what it admits leaves spaced at the rate | as the smooth token bucket | O(1) |
//! | [`Rule::gcra`](crate::Rule::gcra) | a token bucket in one timestamp: per-client API limits, the high-traffic default | two integers (an instant and its fraction of a µs) | yes, by design: burst + rate × window | as the smooth token bucket (600,000 per second is 3 units every 5 µs, exactly) | O(1) |
//!
//! Where a configuration cannot be exact, it rounds towards admitting less, never more. On
//! Redis every rule of a request is decided in one call: a `GET` and, when it admits, a
//! `SET` per rule, plus a sliding log's sorted-set commands.
//!
//! ## A burst across a window boundary
//!
//! Ten requests just before a second ends and ten just after: the fixed window admits all
//! twenty, the sliding log ten, and says exactly when the next one fits.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, ManualClock, Rule, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new(0);
//! let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
//! let fixed = Rule::fixed_window("fixed", 10, Duration::from_secs(1));
//! let log = Rule::sliding_log("log", 10, Duration::from_secs(1));
//!
//! let mut admitted = (0, 0);
//! clock.set_micros(900_000);
//! for _ in 0..10 {
//!     admitted.0 += limiter.check_one(&fixed, "client").await?.is_admitted() as u32;
//!     admitted.1 += limiter.check_one(&log, "client").await?.is_admitted() as u32;
//! }
//! clock.set_micros(1_000_000);
//! for _ in 0..10 {
//!     admitted.0 += limiter.check_one(&fixed, "client").await?.is_admitted() as u32;
//!     admitted.1 += limiter.check_one(&log, "client").await?.is_admitted() as u32;
//! }
//! assert_eq!(admitted, (20, 10));
//!
//! // The log frees a unit when its oldest entry is one window old: at 1.9 s.
//! let denied = limiter.check_one(&log, "client").await?;
//! let retry = denied.decision.denial().and_then(|d| d.retry_after);
//! assert_eq!(retry, Some(Duration::from_millis(900)));
//! clock.set_micros(1_899_999);
//! assert!(!limiter.check_one(&log, "client").await?.is_admitted());
//! clock.set_micros(1_900_000);
//! assert!(limiter.check_one(&log, "client").await?.is_admitted());
//! # Ok(()) }
//! ```
//!
//! ## Large quotas
//!
//! Every amount from 1 to 10^9 per any period from 1 ms to 366 days builds for every
//! algorithm; only a bucket that would take more than 2^52 µs (about 142 years) to fill is
//! refused, as [`Rule::checked`](crate::Rule::checked) says (`token_bucket("slow",
//! 1_000_000_000, Rate::per_day(1))`, say).

//! # Login lockout
//!
//! Password guessing is slowed by a limit on attempts and stopped by a lockout: a
//! [`Penalty`](crate::Penalty) locks the address (or account) out after repeated refusals;
//! an administrator lifts it with [`Limiter::reset`](crate::Limiter::reset).
//!
//! ## Every attempt counts: in the layer
//!
//! 5 attempts a minute per address; 3 refusals within 10 minutes lock the address out for
//! 15 minutes.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::layer::{Limit, RateLimitLayer};
//! use tollgate::{key, Limiter, Penalty, Rule, store::MemoryStore};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let minute = Duration::from_secs(60);
//! let limits = RateLimitLayer::builder()
//!     .route("POST /login", [Limit::new(
//!         Rule::fixed_window("login", 5, minute)
//!             .with_penalty(Penalty::lock_for(15 * minute).after(3).within(10 * minute)),
//!         key::peer_ip(),
//!     )])
//!     .build()?;
//! let app = limits.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
//! }));
//! let login = || -> Result<Request<()>, Box<dyn std::error::Error>> {
//!     let mut request = Request::post("/login").body(())?;
//!     request.extensions_mut().insert("198.51.100.7:5000".parse::<SocketAddr>()?);
//!     Ok(request)
//! };
//!
//! let mut statuses = Vec::new();
//! for _ in 0..9 {
//!     statuses.push(app.clone().oneshot(login()?).await?.status().as_u16());
//! }
//! // 5 attempts, 3 refusals, then locked: refused whatever the minute's count says.
//! assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429]);
//! let locked = app.clone().oneshot(login()?).await?;
//! let retry_after: u64 = locked.headers()["retry-after"].to_str()?.parse()?;
//! assert!(retry_after > 14 * 60, "the lock's remaining time: {retry_after} s");
//! # Ok(()) }
//! ```
//!
//! This counts every attempt, successful or not (an office behind one NAT shares it). See
//! [one layer or two](crate::layer#one-layer-or-two) for how it combines with a global limit.
//!
//! ## Only failed attempts count: with the limiter
//!
//! To count failures only, ask the [`Limiter`](crate::Limiter) in the handler:
//! [`peek`](crate::Limiter::peek) (which consumes nothing) says whether the account is
//! locked, [`check`](crate::Limiter::check) counts a wrong password. Here the sixth failure
//! within 15 minutes locks the account for an hour.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Check, DenyReason, Limiter, ManualClock, Penalty, Rule, store::{MemoryStore, Store}};
//!
//! #[derive(Debug, PartialEq)]
//! enum Login {
//!     Welcome,
//!     WrongPassword,
//!     Locked(Option<Duration>),
//! }
//!
//! async fn login<S: Store>(limiter: &Limiter<S>, failures: &Rule, user: &str, password_ok: bool) -> Login {
//!     // A locked account is refused before its password is looked at.
//!     let Ok(peeked) = limiter.peek(failures, user, 1).await else {
//!         return Login::Locked(None); // the store failed: refuse (and log it)
//!     };
//!     if let Some(lock) = peeked.decision.denial().filter(|d| d.reason == DenyReason::Locked) {
//!         return Login::Locked(lock.retry_after);
//!     }
//!     if password_ok {
//!         return Login::Welcome;
//!     }
//!     // Count the failure. One failure too many is a denial, and the penalty locks.
//!     match limiter.check(&[Check::new(failures, user.as_bytes())]).await {
//!         Ok(outcome) => match outcome.decision.denial() {
//!             Some(denial) => Login::Locked(denial.retry_after),
//!             None => Login::WrongPassword,
//!         },
//!         Err(_) => Login::WrongPassword,
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let minute = Duration::from_secs(60);
//! let failures = Rule::fixed_window_from_first_hit("login-failures", 5, 15 * minute)
//!     .with_penalty(Penalty::lock_for(60 * minute));
//! let clock = ManualClock::new(0);
//! let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
//!
//! // Logging in successfully, as often as you like, counts nothing.
//! for _ in 0..10 {
//!     assert_eq!(login(&limiter, &failures, "ann", true).await, Login::Welcome);
//! }
//! // Five wrong passwords are answered as such; the sixth locks the account.
//! for _ in 0..5 {
//!     assert_eq!(login(&limiter, &failures, "ann", false).await, Login::WrongPassword);
//! }
//! assert!(matches!(login(&limiter, &failures, "ann", false).await, Login::Locked(Some(_))));
//! // Locked: even the right password waits for the lock to end, an hour from now.
//! assert_eq!(login(&limiter, &failures, "ann", true).await, Login::Locked(Some(60 * minute)));
//! // Other accounts are not affected.
//! assert_eq!(login(&limiter, &failures, "bob", true).await, Login::Welcome);
//!
//! // Ann calls support, who unblock her account.
//! limiter.reset(&failures, "ann").await?;
//! assert_eq!(login(&limiter, &failures, "ann", true).await, Login::Welcome);
//! # Ok(()) }
//! ```
//!
//! Lock accounts *and* addresses (two rules in one batch): an account lock alone lets an
//! attacker try one password on many accounts, an address lock alone lets a botnet spread
//! its guesses. An account lock also lets anyone lock a user out; a short lock, or one per
//! (account, address) pair, limits that.

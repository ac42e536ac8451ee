//! [`Rule`]: a named algorithm, an optional penalty and a default cost.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, Refill, SlidingLog, SlidingWindow, TokenBucket,
    WindowAnchor,
};
use crate::error::ConfigError;
use crate::penalty::Penalty;
use crate::rate::Rate;

/// The longest rule name; names appear in store keys and response headers.
pub(crate) const MAX_RULE_NAME_LEN: usize = 64;

/// A named limit: which algorithm, with which quota, what a request costs by default, and
/// whether abuse locks the key out.
///
/// A configuration that cannot work (a zero limit, a zero period, an invalid name) is
/// reported by [`checked`](Self::checked) and by the layer's `build`, so literals need no `?`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Penalty, Rate, Rule};
///
/// // 1 SMS per minute per phone number.
/// let per_minute = Rule::fixed_window("sms-minute", 1, Duration::from_secs(60));
/// // Bursts of 100, 10 per second sustained; 20 denials in a minute lock for 10 minutes.
/// let api = Rule::token_bucket("api", 100, Rate::per_second(10))
///     .with_penalty(Penalty::lock_for(Duration::from_secs(600)).after(20).within(Duration::from_secs(60)));
/// assert_eq!(api.name(), "api");
/// assert!(api.checked().is_ok());
/// ```
///
/// # One name, one configuration
///
/// Stores keep state by rule name and key, so a name stands for one configuration: a layer's
/// `build` refuses a name bound to two unequal rules. Share a limit between routes by giving
/// them the same `Rule`; give different limits different names.
///
/// # Reconfiguring a rule
///
/// Stores keep beside each state the [`fingerprint`](Self::fingerprint) of the configuration
/// that wrote it. When a rule changes under the same name (a deploy, a rolling deploy
/// sharing one Redis), the other configuration's state is read neither as one's own nor as
/// empty (a fresh quota for every client). Each state says how many units were in use when
/// it was last written and when its writer would have been back to empty; another
/// configuration counts those units as its own, up to its capacity, until that instant (a
/// request that does not fit is denied with Retry-After exactly then). The penalty (denial
/// count and lock) is kept apart and survives unchanged.
///
/// This is conservative rather than exact: over any interval, both configurations together
/// never admit more than each alone would in it, added, less the smaller capacity (no second
/// burst); a debt is carried only up to the capacity. One formula serves every pair of algorithms, where an
/// exact conversion would need one per pair and direction, in Rust and in Lua.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, Rate, Rule, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new(0);
/// let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()));
/// let old = Rule::fixed_window("per-user", 1, Duration::from_secs(60));
/// let new = Rule::token_bucket("per-user", 1, Rate::per_minute(1));
/// assert_ne!(old.fingerprint(), new.fingerprint());
/// assert!(limiter.check_one(&old, b"alice").await?.is_admitted());
/// // The bucket counts the window's unit until the window ends, not as a fresh quota.
/// assert!(!limiter.check_one(&new, b"alice").await?.is_admitted());
/// clock.advance(Duration::from_secs(60));
/// assert!(limiter.check_one(&new, b"alice").await?.is_admitted());
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Rule {
    name: Arc<str>,
    algorithm: Algorithm,
    /// `algorithm.fingerprint()`, computed once: stores compare it on every request.
    fingerprint: u64,
    /// [`name_digest`] of the name, computed once.
    name_digest: u64,
    penalty: Option<Penalty>,
    cost: u64,
    /// Why this rule cannot work, if it cannot (see [`Rule::checked`]).
    problem: Option<Arc<ConfigError>>,
}

impl Rule {
    /// A rule named `name` running `algorithm`, its name checked as every constructor's.
    pub(crate) fn new(name: impl AsRef<str>, algorithm: Algorithm) -> Self {
        Self::with(name, Ok(algorithm))
    }

    /// The rule, or one recording why it cannot work (with a placeholder algorithm that
    /// every store and the layer refuse).
    fn with(name: impl AsRef<str>, algorithm: Result<impl Into<Algorithm>, ConfigError>) -> Self {
        let name = name.as_ref();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
        let valid = (1..=MAX_RULE_NAME_LEN).contains(&name.len()) && name.chars().all(valid_char);
        let name_problem = (!valid).then(|| {
            let rule = format!("1 to {MAX_RULE_NAME_LEN} characters of A-Z a-z 0-9 - _ . :");
            ConfigError::new(format!("the name must be {rule}"))
        });
        let (algorithm, algorithm_problem) = match algorithm {
            Ok(algorithm) => (algorithm.into(), None),
            Err(e) => (Algorithm::FixedWindow(FixedWindow::UNUSABLE), Some(e)),
        };
        let problem = ConfigError::collect(name_problem.into_iter().chain(algorithm_problem))
            .map(|e| Arc::new(e.within(format_args!("rule {name:?}"))));
        Self {
            name: Arc::from(name),
            name_digest: name_digest(name.as_bytes()),
            fingerprint: algorithm.fingerprint(),
            algorithm,
            penalty: None,
            cost: 1,
            problem,
        }
    }

    /// [`checked`](Self::checked) without taking the rule.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match &self.problem {
            None => Ok(()),
            Some(problem) => Err(ConfigError::clone(problem)),
        }
    }

    /// Whether [`validate`](Self::validate) passes, without building its error.
    pub(crate) fn is_valid(&self) -> bool {
        self.problem.is_none()
    }

    /// The rule if it can work; if not, every reason, each naming the rule. A
    /// [`Limiter`](crate::Limiter) or store refuses a batch with an invalid rule
    /// ([`StoreError::InvalidBatch`](crate::StoreError)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Rule;
    ///
    /// let limit: u64 = "0".parse().unwrap_or(0); // from a configuration file, say
    /// let err = Rule::fixed_window("sms-minute", limit, Duration::from_secs(60)).checked().unwrap_err();
    /// assert!(err.to_string().contains("rule \"sms-minute\": fixed window limit must be at least 1"));
    /// ```
    pub fn checked(self) -> Result<Self, ConfigError> {
        self.validate().map(|()| self)
    }

    /// Fixed window aligned to the epoch: at most `limit` units in each `window`
    /// (`fixed_window("x", 5, 1 h)` admits 5 per clock hour), windows being
    /// `[k·window, (k+1)·window)`, so every key's windows turn over at the same instants.
    /// Up to 2 × `limit` pass within a window-long interval that straddles a boundary.
    pub fn fixed_window(name: impl AsRef<str>, limit: u64, window: Duration) -> Self {
        Self::with(name, FixedWindow::new(limit, window, WindowAnchor::Epoch))
    }

    /// Fixed window that starts at a key's first request: at most `limit` units in the
    /// `window` that follows it, then a new window starts at the next request (Redis's
    /// `SET key 1 EX window` / `INCR` pattern). The same boundary burst as
    /// [`fixed_window`](Self::fixed_window).
    pub fn fixed_window_from_first_hit(
        name: impl AsRef<str>,
        limit: u64,
        window: Duration,
    ) -> Self {
        Self::with(
            name,
            FixedWindow::new(limit, window, WindowAnchor::FirstHit),
        )
    }

    /// Sliding log: never more than `limit` units in any interval of length `window`.
    ///
    /// Every admission is logged with its time and cost and counts for `window`: one entry
    /// per admitting instant (at most `limit` per key).
    pub fn sliding_log(name: impl AsRef<str>, limit: u64, window: Duration) -> Self {
        Self::with(name, SlidingLog::new(limit, window))
    }

    /// Sliding window counter: admits while
    /// `⌈previous × (window − elapsed) / window⌉ + current + cost ≤ limit`, windows aligned
    /// to the epoch; the estimate assumes the previous window's requests were spread evenly.
    ///
    /// **Under sustained traffic it admits `limit − 1` per window, not `limit`**: the previous
    /// window's weight rounds up to at least one unit until the current window ends (with
    /// `limit` 1: one request per two windows). A burst after a quiet window gets the full
    /// `limit`. Use `limit + 1` for "`limit` per window, sustained", or a
    /// [`sliding_log`](Self::sliding_log), which is exact.
    ///
    /// Exact to the microsecond while `limit × window (µs)` ≤ 2^52 (50,000 per day is). Beyond,
    /// the previous window's weight moves in steps of about `window × limit / 2^52` µs, rounded
    /// so that it is never lighter than the exact one; Retry-After stays exact for that weight.
    pub fn sliding_window(name: impl AsRef<str>, limit: u64, window: Duration) -> Self {
        Self::with(name, SlidingWindow::new(limit, window))
    }

    /// Token bucket: bursts of up to `capacity` units, refilled continuously at `refill`
    /// (`token_bucket("x", 100, Rate::per_second(10))` admits 100 at once, then 10 per second).
    /// A new key starts full. The refill is exact, or rounded down by less than 1 µs per
    /// token where it cannot be ([`Rate`'s exactness](Rate#exactness)).
    pub fn token_bucket(name: impl AsRef<str>, capacity: u64, refill: Rate) -> Self {
        Self::with(name, TokenBucket::new(capacity, refill, Refill::Smooth))
    }

    /// Token bucket refilled in steps: the rate's whole amount at the end of each period
    /// (`Rate::per_second(10)` adds 10 tokens once a second). Always exact.
    ///
    /// Periods count from the request that found the bucket full (a full bucket's state is
    /// dropped), so a key's steps restart from its next request after each refill to full.
    pub fn token_bucket_stepped(name: impl AsRef<str>, capacity: u64, refill: Rate) -> Self {
        Self::with(name, TokenBucket::new(capacity, refill, Refill::Stepped))
    }

    /// Leaky bucket (shaping): requests queue (up to `capacity` units, the one being served
    /// included) and leave at `drain`, each held until the units before it have drained
    /// ([`Decision::Delay`](crate::Decision::Delay)); one that does not fit is denied: nginx's
    /// `limit_req` without `nodelay`. The drain is exact or rounded like a token bucket's.
    ///
    /// In a batch with other leaky buckets (a per-user queue beside a per-tenant one), the
    /// request passes when the last of their queues releases it, and each queue counts the
    /// wait until then as queued water (a queue without room for it denies the batch). So no
    /// bucket lets requests leave faster than `drain`; the price is that idle time.
    pub fn leaky_bucket(name: impl AsRef<str>, capacity: u64, drain: Rate) -> Self {
        Self::with(name, LeakyBucket::new(capacity, drain))
    }

    /// GCRA: bursts of up to `burst` units, `rate` sustained
    /// (`gcra("x", 5, Rate::per_second(5))` admits 5 at once, then one every 200 ms). One
    /// instant per key is stored, with its fraction of a µs; the rate is exact or rounded like
    /// a token bucket's refill (see [`token_bucket`](Self::token_bucket)).
    pub fn gcra(name: impl AsRef<str>, burst: u64, rate: Rate) -> Self {
        Self::with(name, Gcra::new(burst, rate))
    }

    /// Adds a penalty lockout.
    pub fn with_penalty(mut self, penalty: Penalty) -> Self {
        if penalty.lock_duration().is_zero() && self.problem.is_none() {
            self.problem = Some(Arc::new(ConfigError::new(format!(
                "rule {:?}: a penalty that locks for 0 never locks: give Penalty::lock_for a duration",
                self.name()
            ))));
        }
        self.penalty = Some(penalty);
        self
    }

    /// Sets the cost of a request when the caller gives none (default 1).
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared (a metric label, a map's key, without a copy).
    pub(crate) fn shared_name(&self) -> std::sync::Arc<str> {
        self.name.clone()
    }

    /// [`name_digest`] of the name.
    pub(crate) fn name_digest(&self) -> u64 {
        self.name_digest
    }

    /// The algorithm and its quota.
    pub(crate) fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The fingerprint of the algorithm and its parameters (not the name, penalty or cost):
    /// the same in every process and version, shared by two rules exactly when they read and
    /// write state alike. See [Reconfiguring a rule](#reconfiguring-a-rule).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The penalty lockout, if any.
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_ref()
    }

    /// The default cost of a request.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// A rule name folded into 64 bits (FNV-1a): what a store's hasher takes in place of the
/// name's bytes.
pub(crate) fn name_digest(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An unusable rule's placeholder algorithm is not its configuration.
        let algorithm: &dyn fmt::Debug = match &self.problem {
            None => &self.algorithm,
            Some(problem) => problem,
        };
        f.debug_struct("Rule")
            .field("name", &&*self.name)
            .field("algorithm", algorithm)
            .field("penalty", &self.penalty)
            .field("cost", &self.cost)
            .finish()
    }
}

/// For the crate's property tests: a rule named `r` of one of the six algorithms (both
/// token-bucket refills, picked by `kind % 7`) with small numbers.
#[cfg(test)]
pub(crate) fn sample(kind: u8, quota: u64, period: u64) -> Rule {
    let window = std::time::Duration::from_micros(period);
    let rate = Rate::new(quota.div_ceil(2), window);
    match kind % 7 {
        0 => Rule::fixed_window("r", quota, window),
        1 => Rule::sliding_log("r", quota, window),
        2 => Rule::sliding_window("r", quota, window),
        3 => Rule::token_bucket("r", quota, rate),
        4 => Rule::token_bucket_stepped("r", quota, rate),
        5 => Rule::leaky_bucket("r", quota, rate),
        _ => Rule::gcra("r", quota, rate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule name must be non-empty, at most 64 characters and without spaces.
    #[test]
    fn names_are_validated() {
        let w = Duration::from_secs(1);
        assert!(Rule::fixed_window("", 1, w).validate().is_err());
        assert!(Rule::fixed_window("a b", 1, w).validate().is_err());
        assert!(Rule::fixed_window("x".repeat(65), 1, w).validate().is_err());
        assert!(Rule::fixed_window("sms-minute.v2:eu_1", 1, w)
            .validate()
            .is_ok());
    }

    /// A rule whose rate is zero, has no period or cannot be kept exactly fails validation.
    #[test]
    fn rates_that_cannot_be_exact_are_rejected() {
        assert!(Rule::token_bucket("t", 10, Rate::per_second(0))
            .validate()
            .is_err());
        assert!(Rule::token_bucket("t", 1 << 40, Rate::per_day(1))
            .validate()
            .is_err());
        assert!(Rule::gcra("g", 1, Rate::new(1, Duration::ZERO))
            .validate()
            .is_err());
    }

    /// Validation reports every problem of a rule at once, each naming the rule.
    #[test]
    fn every_problem_of_a_rule_names_it() {
        let err = Rule::fixed_window("a b", 0, Duration::ZERO)
            .validate()
            .unwrap_err();
        let problems: Vec<&str> = err.problems().collect();
        assert_eq!(problems.len(), 2, "{err}");
        assert!(
            problems[0].starts_with("rule \"a b\": the name must be"),
            "{err}"
        );
        assert!(
            problems[1].starts_with("rule \"a b\": fixed window limit must be at least 1"),
            "{err}"
        );
        assert!(Rule::fixed_window("a b", 0, Duration::ZERO)
            .checked()
            .is_err());
    }
}

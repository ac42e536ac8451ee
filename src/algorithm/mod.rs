//! The six algorithms as pure, clock-free models.
//!
//! Each model is a configuration plus a state type with two operations:
//! [`Algorithm::evaluate`] says what a request of some cost would get at an instant without
//! changing anything, and [`Algorithm::apply`] records an admission. Stores keep the state;
//! the models know nothing about maps or Redis (the Lua scripts in `lua/` are their twins,
//! kept in step by the shared vectors in `tests/vectors/`).
//!
//! All time is integer microseconds and all quantities are integers. Where a rate does not
//! divide evenly (3 per second), the models scale quantities by the period instead of
//! rounding time, so the arithmetic is exact. Configurations are validated so that every
//! intermediate product stays below 2^50, which keeps the Lua twins (double precision)
//! exact too.
//!
//! A state whose [`Algorithm::expires_at`] has passed is the same as no state at all, which is
//! why stores may delete it.

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::time::Duration;

pub use fixed_window::{FixedWindow, WindowAnchor};
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use token_bucket::{Refill, TokenBucket};

use crate::error::ConfigError;

/// The largest scaled quantity a configuration may produce (see the module docs).
pub(crate) const MAX_SCALED: u64 = 1 << 50;

/// What a model says about one request against one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eval {
    /// Admit (perhaps after a delay) or reject.
    pub verdict: Verdict,
    /// Units still available after this request (if admitted) or now (if rejected).
    pub remaining: u64,
    /// Microseconds until the state is back to empty (the full quota is available again).
    pub reset_micros: u64,
}

/// The admission part of an [`Eval`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted; the request should be held for `delay_micros` first (non-zero only for the
    /// leaky bucket, which shapes traffic).
    Admit {
        /// Microseconds to hold the request before forwarding it.
        delay_micros: u64,
    },
    /// Rejected. `retry_micros` is the exact wait until the same request would be admitted,
    /// or `None` when it never can be (its cost exceeds the rule's capacity).
    Reject {
        /// Microseconds until a retry succeeds, if one ever can.
        retry_micros: Option<u64>,
    },
}

impl Eval {
    fn admit(delay_micros: u64, remaining: u64, reset_micros: u64) -> Self {
        Self {
            verdict: Verdict::Admit { delay_micros },
            remaining,
            reset_micros,
        }
    }

    fn reject(retry_micros: Option<u64>, remaining: u64, reset_micros: u64) -> Self {
        Self {
            verdict: Verdict::Reject { retry_micros },
            remaining,
            reset_micros,
        }
    }

    /// Whether the request is admitted (with or without a delay).
    pub fn is_admitted(&self) -> bool {
        matches!(self.verdict, Verdict::Admit { .. })
    }
}

/// One of the six algorithms with its configuration.
///
/// Build one through the [`Rule`](crate::Rule) constructors, or through each algorithm's
/// `new`, which validate the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Algorithm {
    /// Counter per window; see [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// Exact log of admissions; see [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// Weighted previous and current counters; see [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// Tokens refilled over time; see [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// A queue drained at a constant rate (shaping); see [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// Generic cell rate algorithm; see [`Gcra`].
    Gcra(Gcra),
}

/// The state one rule keeps for one key. Opaque: stores hold it, models read and write it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State(pub(crate) Inner);

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Inner {
    #[default]
    Empty,
    FixedWindow(fixed_window::WindowState),
    SlidingLog(sliding_log::LogState),
    SlidingWindow(sliding_window::CountersState),
    TokenBucket(token_bucket::BucketState),
    LeakyBucket(leaky_bucket::LevelState),
    Gcra(gcra::TatState),
}

/// Dispatches to the model of each variant, with expired or foreign state read as fresh.
macro_rules! dispatch {
    ($self:ident, $state:expr, $now:ident, |$model:ident, $s:ident| $body:expr) => {
        match $self {
            Algorithm::FixedWindow($model) => dispatch!(@one $model, $state, $now, FixedWindow, $s, $body),
            Algorithm::SlidingLog($model) => dispatch!(@one $model, $state, $now, SlidingLog, $s, $body),
            Algorithm::SlidingWindow($model) => dispatch!(@one $model, $state, $now, SlidingWindow, $s, $body),
            Algorithm::TokenBucket($model) => dispatch!(@one $model, $state, $now, TokenBucket, $s, $body),
            Algorithm::LeakyBucket($model) => dispatch!(@one $model, $state, $now, LeakyBucket, $s, $body),
            Algorithm::Gcra($model) => dispatch!(@one $model, $state, $now, Gcra, $s, $body),
        }
    };
    (@one $model:ident, $state:expr, $now:ident, $variant:ident, $s:ident, $body:expr) => {{
        let fresh;
        let $s = match $state {
            Inner::$variant(s) if $model.expires_at(s) > $now => s,
            _ => {
                fresh = $model.fresh($now);
                &fresh
            }
        };
        $body
    }};
}

impl Algorithm {
    /// What a request of `cost` units would get at `now` (µs) given `state`; changes nothing.
    pub fn evaluate(&self, state: &State, now: u64, cost: u64) -> Eval {
        dispatch!(self, &state.0, now, |model, s| model.evaluate(s, now, cost))
    }

    /// Records the admission of a request of `cost` units at `now`. Call only after
    /// [`evaluate`](Self::evaluate) admitted it with the same arguments.
    pub fn apply(&self, state: &mut State, now: u64, cost: u64) {
        self.apply_at(state, now, now, cost);
    }

    /// Records a reservation decided at `now` for a request admitted at `at` (≥ `now`):
    /// the units are taken at `at`, and nothing that still counts at `now` is forgotten, so
    /// requests arriving between `now` and `at` are not over-admitted. Call only after
    /// [`evaluate`](Self::evaluate) admitted it at `at` with the same cost.
    pub fn apply_at(&self, state: &mut State, now: u64, at: u64, cost: u64) {
        match self {
            Algorithm::FixedWindow(m) => {
                apply_with(m, state, now, at, cost, Inner::FixedWindow, |i| match i {
                    Inner::FixedWindow(s) => Some(s),
                    _ => None,
                })
            }
            Algorithm::SlidingLog(m) => {
                apply_with(m, state, now, at, cost, Inner::SlidingLog, |i| match i {
                    Inner::SlidingLog(s) => Some(s),
                    _ => None,
                })
            }
            Algorithm::SlidingWindow(m) => {
                apply_with(m, state, now, at, cost, Inner::SlidingWindow, |i| match i {
                    Inner::SlidingWindow(s) => Some(s),
                    _ => None,
                })
            }
            Algorithm::TokenBucket(m) => {
                apply_with(m, state, now, at, cost, Inner::TokenBucket, |i| match i {
                    Inner::TokenBucket(s) => Some(s),
                    _ => None,
                })
            }
            Algorithm::LeakyBucket(m) => {
                apply_with(m, state, now, at, cost, Inner::LeakyBucket, |i| match i {
                    Inner::LeakyBucket(s) => Some(s),
                    _ => None,
                })
            }
            Algorithm::Gcra(m) => apply_with(m, state, now, at, cost, Inner::Gcra, |i| match i {
                Inner::Gcra(s) => Some(s),
                _ => None,
            }),
        }
    }

    /// The instant (µs) from which `state` is the same as no state; 0 for no state.
    pub fn expires_at(&self, state: &State) -> u64 {
        match (self, &state.0) {
            (Algorithm::FixedWindow(m), Inner::FixedWindow(s)) => m.expires_at(s),
            (Algorithm::SlidingLog(m), Inner::SlidingLog(s)) => m.expires_at(s),
            (Algorithm::SlidingWindow(m), Inner::SlidingWindow(s)) => m.expires_at(s),
            (Algorithm::TokenBucket(m), Inner::TokenBucket(s)) => m.expires_at(s),
            (Algorithm::LeakyBucket(m), Inner::LeakyBucket(s)) => m.expires_at(s),
            (Algorithm::Gcra(m), Inner::Gcra(s)) => m.expires_at(s),
            _ => 0,
        }
    }

    /// The quota a client sees: the most units admitted at once, and the period over which
    /// that quota is restored (used for `RateLimit-Policy` headers).
    pub fn quota(&self) -> (u64, Duration) {
        let (q, w) = match self {
            Algorithm::FixedWindow(m) => (m.limit(), m.window_micros()),
            Algorithm::SlidingLog(m) => (m.limit(), m.window_micros()),
            Algorithm::SlidingWindow(m) => (m.limit(), m.window_micros()),
            Algorithm::TokenBucket(m) => (m.capacity(), m.fill_micros()),
            Algorithm::LeakyBucket(m) => (m.capacity(), m.drain_micros()),
            Algorithm::Gcra(m) => (m.burst(), m.fill_micros()),
        };
        (q, Duration::from_micros(w))
    }
}

/// The common shape of the six models, used by [`Algorithm`]'s dispatch.
pub(crate) trait Model {
    type State;
    /// The state of a key nobody has used, as of `now`.
    fn fresh(&self, now: u64) -> Self::State;
    fn evaluate(&self, s: &Self::State, now: u64, cost: u64) -> Eval;
    /// Records an admission at `at`, decided at `now` (`at` > `now` for a reservation).
    /// `s` is live at `now` but may have expired by `at`.
    fn apply(&self, s: &mut Self::State, now: u64, at: u64, cost: u64);
    fn expires_at(&self, s: &Self::State) -> u64;
}

fn apply_with<M: Model>(
    model: &M,
    state: &mut State,
    now: u64,
    at: u64,
    cost: u64,
    wrap: fn(M::State) -> Inner,
    unwrap: fn(&mut Inner) -> Option<&mut M::State>,
) {
    // Live at `now`, not at `at`: what still counts before a reservation's instant must stay.
    let live = unwrap(&mut state.0).is_some_and(|s| model.expires_at(s) > now);
    if !live {
        state.0 = wrap(model.fresh(at));
    }
    if let Some(s) = unwrap(&mut state.0) {
        model.apply(s, now, at, cost);
    }
}

/// The evaluation at `now` of a window state that starts later, at `start`: a reservation
/// took units from a window after the current one, and the state keeps one window, so the
/// current window's count is gone. To never over-admit, the current window is closed:
/// nothing more passes before `start` (a cost of 0 still does), and a request waits for
/// `start` plus whatever it would wait then (`later`, its evaluation at `start`). This
/// errs towards denying, only after a reservation across a window boundary.
pub(crate) fn closed_until(start: u64, now: u64, cost: u64, later: Eval) -> Eval {
    let wait = start - now;
    let reset = later.reset_micros + wait;
    if cost == 0 {
        return Eval::admit(0, 0, reset);
    }
    let retry = match later.verdict {
        Verdict::Admit { .. } => Some(wait),
        Verdict::Reject { retry_micros } => retry_micros.map(|r| r + wait),
    };
    Eval::reject(retry, 0, reset)
}

/// Rejects zero and over-large quantities with a message naming the parameter.
pub(crate) fn check_range(what: &str, value: u64, max: u64) -> Result<u64, ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(format!("{what} must be at least 1")));
    }
    if value > max {
        return Err(ConfigError::new(format!(
            "{what} is {value}, more than the supported {max}"
        )));
    }
    Ok(value)
}

/// `a * b`, failing when the product leaves the exact range.
pub(crate) fn check_product(what: &str, a: u64, b: u64) -> Result<u64, ConfigError> {
    match a.checked_mul(b) {
        Some(p) if p <= MAX_SCALED => Ok(p),
        _ => Err(ConfigError::new(format!(
            "{what} is too large to compute exactly ({a} × {b} exceeds 2^50); use a shorter period or a smaller quantity"
        ))),
    }
}

//! The six algorithms as pure, clock-free models.
//!
//! Each model is a configuration plus a state: [`Algorithm::evaluate`] says what a request
//! would get without changing anything, [`Algorithm::apply`] records an admission. Stores keep
//! the state; the Lua scripts in `lua/` are the models' twins, kept in step by
//! `tests/vectors/`.
//!
//! Time is integer microseconds, quantities integers. Where a rate does not divide evenly,
//! quantities are scaled by the rate's period instead of rounding time. Parameters stay within
//! 2^50 and scaled quantities within 2^52, so the Lua twins (doubles, exact below 2^53) are
//! exact too; beyond that a model rounds so that it never admits more (see [`Rate`] and
//! [`SlidingWindow`]).
//!
//! A state past its [`Algorithm::expires_at`] is the same as none, so stores may delete it.
//! State written under another [`Algorithm::fingerprint`] is never read as one's own (see
//! [`Rule`](crate::Rule#reconfiguring-a-rule)).

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod share;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub(crate) use fixed_window::{FixedWindow, WindowAnchor};
pub(crate) use gcra::Gcra;
pub(crate) use leaky_bucket::LeakyBucket;
pub(crate) use sliding_log::SlidingLog;
pub(crate) use sliding_window::SlidingWindow;
pub(crate) use token_bucket::{Refill, TokenBucket};

use crate::clock::duration_to_micros_ceil;
use crate::error::ConfigError;
use crate::rate::Rate;

/// The largest parameter (a quota, an amount, a period in µs) a configuration may hold, and the
/// longest wait a reservation may take (see the module docs).
pub(crate) const MAX_SCALED: u64 = 1 << 50;

/// The largest scaled quantity (a quota times a period in µs) a configuration may produce:
/// with an instant (below 2^51 µs until 2041, 2^52 until 2112) added, it stays below 2^53.
pub(crate) const MAX_PRODUCT: u64 = 1 << 52;

/// What a model says about one request against one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eval {
    /// Admit (perhaps after a delay) or reject.
    pub(crate) verdict: Verdict,
    /// Units still available after this request (if admitted) or now (if rejected).
    pub(crate) remaining: u64,
    /// Microseconds until the state is back to empty (the full quota is available again).
    pub(crate) reset_micros: u64,
}

/// The admission part of an [`Eval`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Admitted; the request should be held for `delay_micros` first (non-zero only for the
    /// leaky bucket, which shapes traffic).
    Admit { delay_micros: u64 },
    /// Rejected. `retry_micros` is the exact wait until the same request would be admitted,
    /// or `None` when it never can be (its cost exceeds the rule's capacity).
    Reject { retry_micros: Option<u64> },
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
    pub(crate) fn is_admitted(&self) -> bool {
        matches!(self.verdict, Verdict::Admit { .. })
    }
}

/// One of the six algorithms with its configuration, validated by each model's `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Algorithm {
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

/// Each model is the configuration of its own variant.
macro_rules! into_algorithm {
    ($($model:ident),+) => {$(
        impl From<$model> for Algorithm {
            fn from(model: $model) -> Self {
                Algorithm::$model(model)
            }
        }
    )+};
}
into_algorithm!(
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra
);

/// What any configuration can read of another's state (see
/// [`Rule`](crate::Rule#reconfiguring-a-rule)). Units in use only fall as time passes, so
/// holding `used` until `until` never counts less than the writer would have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Carried {
    pub(crate) used: u64,
    pub(crate) until: u64,
}

impl Carried {
    /// The units still held at `now` against a capacity of `capacity`.
    pub(crate) fn held(&self, now: u64, capacity: u64) -> u64 {
        if now < self.until {
            self.used.min(capacity)
        } else {
            0
        }
    }
}

/// What [`Algorithm::admit`] says of an admission it recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// What [`Algorithm::evaluate`] said.
    pub(crate) eval: Eval,
    /// [`Algorithm::expires_at`] of the state it left.
    pub(crate) expires_at: u64,
    /// [`Algorithm::mark`] of the admission (at `now`, held for the eval's delay).
    pub(crate) mark: u64,
}

/// An admission [`Algorithm::refund`] gives back: `cost` units recorded at `at`, the
/// [`mark`](Algorithm::mark) it left and the water its [`hold`](Algorithm::hold) added.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refund {
    at: u64,
    cost: u64,
    mark: u64,
    hold: u64,
}

/// The state one rule keeps for one key. Opaque: stores hold it, models read and write it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct State(pub(crate) Inner);

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

/// Runs `$body` with `$m` bound to the model of whichever variant `$alg` is.
macro_rules! each_model {
    ($alg:expr, $m:ident => $body:expr) => {
        match $alg {
            Algorithm::FixedWindow($m) => $body,
            Algorithm::SlidingLog($m) => $body,
            Algorithm::SlidingWindow($m) => $body,
            Algorithm::TokenBucket($m) => $body,
            Algorithm::LeakyBucket($m) => $body,
            Algorithm::Gcra($m) => $body,
        }
    };
}

impl Algorithm {
    /// What a request of `cost` units would get at `now` (µs) given `state`; changes nothing.
    pub(crate) fn evaluate(&self, state: &State, now: u64, cost: u64) -> Eval {
        each_model!(self, m => evaluate_with(m, &state.0, now, cost))
    }

    /// Records the admission of a request of `cost` units at `now`. Call only after
    /// [`evaluate`](Self::evaluate) admitted it with the same arguments.
    pub(crate) fn apply(&self, state: &mut State, now: u64, cost: u64) {
        each_model!(self, m => if let Some(s) = own_state(m, &mut state.0, now) {
            m.apply(s, now, cost)
        })
    }

    /// [`evaluate`](Self::evaluate), and if that admits, [`apply`](Self::apply) (a cost of 0
    /// changes nothing), with the [`expires_at`](Self::expires_at) and [`mark`](Self::mark) of
    /// the state it leaves: the four calls in one pass. A rejection changes nothing.
    #[inline(always)]
    pub(crate) fn admit(&self, state: &mut State, now: u64, cost: u64) -> Result<Admitted, Eval> {
        each_model!(self, m => admit_with(m, &mut state.0, now, cost))
    }

    /// Records `cost` units taken at `now` whatever the state admits (a cost settled above
    /// the admission's): the state owes the excess until the rule's rate has paid it and
    /// lives until then. A debt beyond [`MAX_PRODUCT`] units or [`MAX_SCALED`] µs of payoff
    /// is forgiven there.
    pub(crate) fn overdraw(&self, state: &mut State, now: u64, cost: u64) {
        let cost = cost.min(MAX_PRODUCT);
        if cost > 0 {
            each_model!(self, m => if let Some(s) = own_state(m, &mut state.0, now) {
                m.overdraw(s, now, cost)
            })
        }
    }

    /// Identifies the admission [`apply`](Self::apply) just recorded at `at`, so that
    /// [`refund`](Self::refund) can tell whether the state still shows it.
    pub(crate) fn mark(&self, state: &State, at: u64) -> u64 {
        each_model!(self, m => mark_with(m, &state.0, at))
    }

    /// Takes back an admission of `cost` units recorded at `at` (identified by `mark` and
    /// [`hold`](Self::hold)), only where that is exact: the result never admits more than the
    /// admissions left in it allow. Returns whether units were given back.
    pub(crate) fn refund(
        &self,
        state: &mut State,
        now: u64,
        at: u64,
        cost: u64,
        (mark, hold): (u64, u64),
    ) -> bool {
        let given = Refund {
            at,
            cost,
            mark,
            hold,
        };
        each_model!(self, m => refund_with(m, &mut state.0, now, given))
    }

    /// Lowers the state so that it holds at most its limit less `parked` units at `at`
    /// (units parked in live leases, see `store::parked`); only the models that can lease
    /// (a token bucket, GCRA) have a ledger to call it for.
    pub(crate) fn cap(&self, state: &mut State, at: u64, parked: u64) {
        each_model!(self, m => if let Some(s) = own_state(m, &mut state.0, at) {
            m.cap(s, at, parked)
        })
    }

    /// Gives back `units` at `now` unconditionally: a lease's unused units, which the cap
    /// kept out of the state (see `store::parked`).
    pub(crate) fn give_back(&self, state: &mut State, now: u64, units: u64) {
        each_model!(self, m => if let Some(s) = own_state(m, &mut state.0, now) {
            m.give_back(s, now, units)
        })
    }

    /// Whether the model can lease: take units early without admitting more
    /// ([`Store::lease`](crate::store::Store::lease)).
    pub(crate) fn can_lease(&self) -> bool {
        matches!(self, Algorithm::TokenBucket(_) | Algorithm::Gcra(_))
    }

    /// The water a leaky bucket's hold of a request from `at` until `until` adds (see
    /// [`LeakyBucket::hold`]); 0 for the other algorithms.
    pub(crate) fn hold(&self, state: &State, at: u64, until: u64) -> u64 {
        match (self, &state.0) {
            (Algorithm::LeakyBucket(m), Inner::LeakyBucket(s)) => m.hold(Some(s), at, until),
            (Algorithm::LeakyBucket(m), _) => m.hold(None, at, until),
            _ => 0,
        }
    }

    /// [`LeakyBucket::evaluate_held`]; `None` for the other algorithms.
    pub(crate) fn evaluate_held(&self, at: u64, cost: u64, until: u64) -> Option<Eval> {
        match self {
            Algorithm::LeakyBucket(m) => Some(m.evaluate_held(at, cost, until)),
            _ => None,
        }
    }

    /// For a leaky bucket: the state after admitting what
    /// [`evaluate_held`](Self::evaluate_held) admitted; `None` for the other algorithms.
    pub(crate) fn held(&self, at: u64, cost: u64, until: u64) -> Option<State> {
        match self {
            Algorithm::LeakyBucket(m) => Some(State(Inner::LeakyBucket(m.held(at, cost, until)))),
            _ => None,
        }
    }

    /// The instant (µs) from which `state` is the same as no state; 0 for no state.
    pub(crate) fn expires_at(&self, state: &State) -> u64 {
        each_model!(self, m => live(m, &state.0, 0).map_or(0, |s| m.expires_at(s)))
    }

    /// See [`Rule::fingerprint`](crate::Rule::fingerprint). It lies in `1 .. 2^52`, so Lua
    /// holds it exactly (0 is "no state"). A truncated SHA-256 of a version tag, the code and
    /// parameters; changing the encoding orphans every stored state, so a test pins it.
    pub(crate) fn fingerprint(&self) -> u64 {
        let mut digest = Sha256::new();
        digest.update(b"tollgate/algorithm/v1");
        for value in self.code_and_params() {
            digest.update(value.to_le_bytes());
        }
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest.finalize()[..8]);
        (u64::from_le_bytes(first) >> 12).max(1)
    }

    /// The algorithm's code (`models[code]` in `lua/*.lua`) and the parameters the models
    /// compute with (rates as enforced): what the [fingerprint](Self::fingerprint) covers.
    pub(crate) fn code_and_params(&self) -> [u64; 5] {
        match self {
            Algorithm::FixedWindow(m) => [1, m.limit, m.window, m.anchor as u64, 0],
            Algorithm::SlidingLog(m) => [2, m.limit, m.window, 0, 0],
            Algorithm::SlidingWindow(m) => [3, m.limit, m.window, m.step, m.steps],
            Algorithm::TokenBucket(m) => {
                let (amount, period) = (m.pace.amount(), m.pace.period_micros());
                [4, m.capacity, amount, period, m.mode as u64]
            }
            Algorithm::LeakyBucket(m) => {
                [5, m.capacity, m.pace.amount(), m.pace.period_micros(), 0]
            }
            Algorithm::Gcra(m) => [6, m.burst, m.pace.period_micros(), m.pace.amount(), 0],
        }
    }

    /// The state this configuration reads at `now` from another's, summarised by `carried`:
    /// a fresh state that has admitted the carried units (up to capacity) and `extra`.
    pub(crate) fn adopt(&self, carried: Carried, now: u64, extra: u64) -> State {
        let mut state = State::default();
        let units = carried.held(now, self.quota().0) + extra;
        if units > 0 {
            self.apply(&mut state, now, units);
        }
        state
    }

    /// [`evaluate`](Self::evaluate) for a key whose state another configuration wrote: the
    /// carried units are held until `carried.until` (rebuilding the state at every instant
    /// does not refill it), so a request that does not fit waits exactly until then.
    pub(crate) fn evaluate_carried(&self, carried: Carried, now: u64, cost: u64) -> Eval {
        let mut eval = self.evaluate(&self.adopt(carried, now, 0), now, cost);
        if carried.held(now, self.quota().0) == 0 {
            return eval;
        }
        let held_for = carried.until - now;
        // Committing writes this configuration's own state: its reset is the model's.
        if eval.is_admitted() && cost > 0 {
            return eval;
        }
        if let Verdict::Reject { retry_micros } = &mut eval.verdict {
            *retry_micros = retry_micros.map(|_| held_for);
        }
        eval.reset_micros = held_for;
        eval
    }

    /// The most units admitted at once.
    pub(crate) fn limit(&self) -> u64 {
        match self {
            Algorithm::FixedWindow(m) => m.limit,
            Algorithm::SlidingLog(m) => m.limit,
            Algorithm::SlidingWindow(m) => m.limit,
            Algorithm::TokenBucket(m) => m.capacity,
            Algorithm::LeakyBucket(m) => m.capacity,
            Algorithm::Gcra(m) => m.burst,
        }
    }

    /// The algorithm's name as a rules file writes it (`"fixed_window"`, `"gcra"`…).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow(_) => "fixed_window",
            Algorithm::SlidingLog(_) => "sliding_log",
            Algorithm::SlidingWindow(_) => "sliding_window",
            Algorithm::TokenBucket(_) => "token_bucket",
            Algorithm::LeakyBucket(_) => "leaky_bucket",
            Algorithm::Gcra(_) => "gcra",
        }
    }

    /// The quota a client sees: the most units admitted at once, and the period over which
    /// that quota is restored (used for `RateLimit-Policy` headers).
    pub(crate) fn quota(&self) -> (u64, Duration) {
        let w = match self {
            Algorithm::FixedWindow(m) => m.window,
            Algorithm::SlidingLog(m) => m.window,
            Algorithm::SlidingWindow(m) => m.window,
            Algorithm::TokenBucket(m) => m.fill_micros(),
            Algorithm::LeakyBucket(m) => m.drain_micros(),
            Algorithm::Gcra(m) => m.fill_micros(),
        };
        (self.limit(), Duration::from_micros(w))
    }
}

/// The common shape of the six models, used by [`Algorithm`]'s dispatch.
pub(crate) trait Model {
    type State;
    /// The state of a key nobody has used, as of `now`.
    fn fresh(&self, now: u64) -> Self::State;
    /// The instant `s` describes: its last admission, which lies in the future when that
    /// admission was a reservation (wait mode).
    fn settled_at(&self, s: &Self::State) -> u64;
    /// Evaluates at `now`, never earlier than `settled_at`.
    fn evaluate(&self, s: &Self::State, now: u64, cost: u64) -> Eval;
    /// Records an admission at `now`, never earlier than `settled_at`.
    fn apply(&self, s: &mut Self::State, now: u64, cost: u64);
    /// [`Algorithm::overdraw`] (`cost` at most [`MAX_PRODUCT`]); `now` may be earlier than
    /// `settled_at`.
    fn overdraw(&self, s: &mut Self::State, now: u64, cost: u64);
    fn expires_at(&self, s: &Self::State) -> u64;
    /// Identifies the admission `apply` just recorded at `at` for `refund`; models whose
    /// refund needs nothing beyond `at` say 0.
    fn mark(&self, _s: &Self::State, _at: u64) -> u64 {
        0
    }
    /// [`Algorithm::refund`] on the model's live state.
    fn refund(&self, s: &mut Self::State, given: Refund) -> bool;
    /// [`Algorithm::cap`]; models that cannot lease keep the state.
    fn cap(&self, _s: &mut Self::State, _at: u64, _parked: u64) {}
    /// [`Algorithm::give_back`]; models that cannot lease keep the state.
    fn give_back(&self, _s: &mut Self::State, _now: u64, _units: u64) {}
    /// Whether `s`, after a refund at `now`, is the same as no state (a first-hit window
    /// whose every unit was given back never started); a refund then leaves none.
    fn is_unused(&self, _s: &Self::State, _now: u64) -> bool {
        false
    }
    /// [`admit_with`] in one pass where the model has one (a smooth token bucket), or
    /// `None` with `inner` unchanged.
    fn admit_in_one_pass(&self, _inner: &mut Inner, _now: u64, _cost: u64) -> Option<Admitted> {
        None
    }
    /// The model's own state inside the stored enum, if it is there.
    fn get(inner: &Inner) -> Option<&Self::State>;
    fn get_mut(inner: &mut Inner) -> Option<&mut Self::State>;
    fn wrap(s: Self::State) -> Inner;
}

/// Implements the [`Model`] accessors for the state variant named like the model.
macro_rules! stored_as {
    ($variant:ident) => {
        fn get(inner: &$crate::algorithm::Inner) -> Option<&Self::State> {
            match inner {
                $crate::algorithm::Inner::$variant(s) => Some(s),
                _ => None,
            }
        }
        fn get_mut(inner: &mut $crate::algorithm::Inner) -> Option<&mut Self::State> {
            match inner {
                $crate::algorithm::Inner::$variant(s) => Some(s),
                _ => None,
            }
        }
        fn wrap(s: Self::State) -> $crate::algorithm::Inner {
            $crate::algorithm::Inner::$variant(s)
        }
    };
}
pub(crate) use stored_as;

/// The model's state in `inner` if it is still live at `now`: an expired state, or another
/// algorithm's (the rule was reconfigured), is the same as none.
fn live<'a, M: Model>(model: &M, inner: &'a Inner, now: u64) -> Option<&'a M::State> {
    M::get(inner).filter(|s| model.expires_at(s) > now)
}

fn evaluate_with<M: Model>(model: &M, inner: &Inner, now: u64, cost: u64) -> Eval {
    evaluate_state(model, live(model, inner, now), now, cost)
}

/// [`evaluate_with`] on the live state `live` (see [`live`]).
fn evaluate_state<M: Model>(model: &M, live: Option<&M::State>, now: u64, cost: u64) -> Eval {
    let eval = evaluate_live(model, live, now, cost);
    // A cost of 0 asks for nothing and passes, even where reservations have taken more than
    // is left now (a GCRA's TAT pushed past the burst, or a sliding window weighing a unit
    // reserved later in the window): an admissible request must stay admissible, or a
    // batch's retry-after would not admit it.
    if cost == 0 && !eval.is_admitted() {
        return Eval::admit(0, eval.remaining, eval.reset_micros);
    }
    eval
}

fn evaluate_live<M: Model>(model: &M, live: Option<&M::State>, now: u64, cost: u64) -> Eval {
    let Some(s) = live else {
        return model.evaluate(&model.fresh(now), now, cost);
    };
    let settled = model.settled_at(s);
    if settled <= now {
        return model.evaluate(s, now, cost);
    }
    // A reservation holds the state until `settled`: nothing is admitted before then (so
    // a reserved future window cannot hide the present one's count), and what would be
    // admitted then is a retry for now.
    let wait = settled - now;
    let at_settled = model.evaluate(s, settled, cost);
    let retry = match at_settled.verdict {
        Verdict::Admit { .. } => Some(wait),
        Verdict::Reject { retry_micros } => retry_micros.map(|r| r + wait),
    };
    Eval::reject(retry, 0, at_settled.reset_micros + wait)
}

/// [`evaluate_with`], then, if that admits, [`Model::apply`], [`Model::expires_at`] and
/// [`mark_with`] on the state it leaves: the state's liveness found once for all four.
#[inline]
fn admit_with<M: Model>(
    model: &M,
    inner: &mut Inner,
    now: u64,
    cost: u64,
) -> Result<Admitted, Eval> {
    if cost == 0 {
        // Nothing to record: the state stays as it is, expired or not.
        let eval = evaluate_with(model, inner, now, cost);
        if !eval.is_admitted() {
            return Err(eval);
        }
        return Ok(Admitted {
            eval,
            expires_at: live(model, inner, 0).map_or(0, |s| model.expires_at(s)),
            mark: mark_with(model, inner, now),
        });
    }
    if let Some(admitted) = model.admit_in_one_pass(inner, now, cost) {
        return Ok(admitted);
    }
    let live = live(model, inner, now);
    let is_live = live.is_some();
    let eval = evaluate_state(model, live, now, cost);
    if !eval.is_admitted() {
        return Err(eval);
    }
    if !is_live {
        *inner = M::wrap(model.fresh(now));
    }
    // The state is the model's own here (live, or just made fresh).
    let Some(s) = M::get_mut(inner) else {
        return Err(eval);
    };
    model.apply(s, now, cost);
    Ok(Admitted {
        eval,
        expires_at: model.expires_at(s),
        mark: model.mark(s, now),
    })
}

/// The model's live state in `inner`, made fresh at `now` where there is none (see [`live`]).
fn own_state<'a, M: Model>(model: &M, inner: &'a mut Inner, now: u64) -> Option<&'a mut M::State> {
    if live(model, inner, now).is_none() {
        *inner = M::wrap(model.fresh(now));
    }
    M::get_mut(inner)
}

/// An admission's exact mark where the state drains at `amount` scaled units a µs: the
/// scaled units from `at` to `end` plus `rest` (`u64::MAX` past the range). Draining leaves
/// it; whatever joins raises it, by less than a µs's worth too.
pub(crate) fn scaled_mark(at: u64, end: u64, amount: u64, rest: u64) -> u64 {
    end.saturating_sub(at)
        .checked_mul(amount)
        .and_then(|w| w.checked_add(rest))
        .unwrap_or(u64::MAX)
}

fn mark_with<M: Model>(model: &M, inner: &Inner, at: u64) -> u64 {
    M::get(inner).map_or(0, |s| model.mark(s, at))
}

fn refund_with<M: Model>(model: &M, inner: &mut Inner, now: u64, given: Refund) -> bool {
    // An expired state (or another algorithm's) holds no admission to give back.
    if given.cost == 0 || live(model, inner, now).is_none() {
        return false;
    }
    let Some(s) = M::get_mut(inner) else {
        return false;
    };
    if !model.refund(s, given) {
        return false;
    }
    if model.is_unused(s, now) {
        *inner = Inner::Empty;
    }
    true
}

/// Rejects a parameter of 0 or above [`MAX_SCALED`] with a message naming it (`what`).
pub(crate) fn check_range(what: impl fmt::Display, value: u64) -> Result<u64, ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(format!("{what} must be at least 1")));
    }
    if value > MAX_SCALED {
        return Err(ConfigError::new(format!(
            "{what} is {value}, more than the supported {MAX_SCALED}"
        )));
    }
    Ok(value)
}

/// A window model's limit and window (in µs), each checked by [`check_range`]; `model`
/// names them (`"fixed window"`).
pub(crate) fn check_window(
    model: &str,
    limit: u64,
    window: Duration,
) -> Result<(u64, u64), ConfigError> {
    let limit = check_range(format_args!("{model} limit"), limit)?;
    let window = duration_to_micros_ceil(window);
    let window = check_range(format_args!("{model} length (µs)"), window)?;
    Ok((limit, window))
}

/// A rate's amount and period, each checked by [`check_range`]; `what` names the rate
/// (`"token bucket refill"`).
pub(crate) fn check_rate(what: &str, rate: Rate) -> Result<(), ConfigError> {
    check_range(format_args!("{what} amount"), rate.amount())?;
    check_range(format_args!("{what} period (µs)"), rate.period_micros())?;
    Ok(())
}

/// `a * b`, failing when the product leaves the exact range.
pub(crate) fn check_product(what: &str, a: u64, b: u64) -> Result<u64, ConfigError> {
    match a.checked_mul(b) {
        Some(p) if p <= MAX_PRODUCT => Ok(p),
        _ => Err(ConfigError::new(format!(
            "{what} is too large to compute exactly ({a} × {b} exceeds 2^52); use a shorter period or a smaller quantity"
        ))),
    }
}

/// The rate a continuous model with `quota` units of room computes with: `rate` in lowest
/// terms, or rounded down so that `quota × period` stays within [`MAX_PRODUCT`].
pub(crate) fn scaled_rate(what: &str, quota: u64, rate: Rate) -> Result<Rate, ConfigError> {
    rate.within_period(MAX_PRODUCT / quota.max(1)).ok_or_else(|| {
        ConfigError::new(format!(
            "{what} of {quota} takes more than 2^52 µs (about 142 years) to fill at {} per {} µs; use a smaller quantity or a faster rate",
            rate.amount(),
            rate.period_micros()
        ))
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;

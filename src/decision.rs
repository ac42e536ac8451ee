//! What a check decides: [`Decision`], per-rule [`RuleOutcome`]s and the batch [`Outcome`].

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

/// Whether a request may pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward the request now.
    Allow,
    /// Forward the request after holding it this long (leaky-bucket shaping).
    Delay(Duration),
    /// Reject the request.
    Deny(Denial),
}

impl Decision {
    /// Whether the request may pass, now or after a delay.
    pub fn is_admitted(&self) -> bool {
        !matches!(self, Decision::Deny(_))
    }

    /// The denial, if the request is denied.
    pub fn denial(&self) -> Option<&Denial> {
        match self {
            Decision::Deny(d) => Some(d),
            _ => None,
        }
    }
}

/// Why and for how long a request is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// Why.
    pub reason: DenyReason,
    /// The wait, exact to the microsecond, until the same request would be admitted (for a
    /// client alone on its key); `None` when no wait helps ([`DenyReason::CostExceedsCapacity`]).
    pub retry_after: Option<Duration>,
}

/// Why a request is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// The rule's quota is used up.
    Limited,
    /// The key is locked out by a penalty after repeated denials.
    Locked,
    /// The request costs more than the rule can ever admit at once; retrying cannot help.
    CostExceedsCapacity,
}

/// The quota of one rule as a client sees it (for `RateLimit` headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// The most units admitted at once (the window limit or bucket capacity).
    pub limit: u64,
    /// Units still available (after this request, if it was admitted).
    pub remaining: u64,
    /// Time until the full quota is available again.
    pub reset: Duration,
}

/// The decision of one rule in a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleOutcome {
    /// What this rule alone says. In a denied batch, a rule that would have admitted still
    /// says `Allow` here, but consumed nothing.
    pub decision: Decision,
    /// The rule's quota after the batch.
    pub info: RateLimitInfo,
}

/// The decision of a whole batch, and each rule's part in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Deny beats Delay beats Allow; a denial carries the longest retry-after of the denying
    /// rules (`None` if any can never admit).
    pub decision: Decision,
    /// One entry per checked rule, in the order of the batch.
    pub rules: RuleOutcomes,
    /// What the store needs to give an admitted batch's units back; `None` if there is none.
    pub(crate) admission: Option<Admission>,
}

impl Outcome {
    /// Whether the request may pass, now or after a delay.
    pub fn is_admitted(&self) -> bool {
        self.decision.is_admitted()
    }

    /// A batch's outcome from its rules', with nothing to give back (for a
    /// [`Store`](crate::store::Store) outside this crate).
    pub fn new(rules: RuleOutcomes) -> Self {
        combine(rules, |_| false)
    }

    /// The outcome of the sub-batch of the rules at `indices`, in that order.
    pub(crate) fn select(&self, indices: &[usize]) -> Outcome {
        Outcome {
            decision: self.decision,
            rules: indices
                .iter()
                .filter_map(|&i| self.rules.get(i).copied())
                .collect(),
            admission: self.admission.as_ref().map(|a| a.select(indices)),
        }
    }

    /// The outcome with every unit it took named as `store`'s (a pending rule took none).
    #[cfg(any(test, feature = "redis"))]
    pub(crate) fn taken_by(mut self, store: StoreId) -> Outcome {
        if let Some(admission) = &mut self.admission {
            for taken in admission.taken.iter_mut().filter(|t| !t.pending) {
                taken.store = store;
            }
        }
        self
    }

    /// The outcome with an admitting `rule` decided elsewhere (a lease) inserted at `i`.
    pub(crate) fn with_rule_at(mut self, i: usize, rule: RuleOutcome) -> Outcome {
        let i = i.min(self.rules.len());
        self.rules.0.insert(i, rule);
        if let Some(admission) = &mut self.admission {
            let i = i.min(admission.taken.len());
            admission.taken.insert(i, Taken::default());
        }
        self
    }

    /// Whether [pending](crate::store::Store::check) rules still count it at its release.
    pub(crate) fn needs_confirmation(&self) -> bool {
        self.admission
            .as_ref()
            .is_some_and(|a| a.pending().next().is_some())
    }

    /// Index of the rule that decided a denial (the one with the longest wait), if denied.
    pub fn deciding_rule(&self) -> Option<usize> {
        let Decision::Deny(batch) = self.decision else {
            return None;
        };
        self.rules
            .iter()
            .position(|r| r.decision == Decision::Deny(batch))
    }
}

/// The per-rule outcomes of a batch ([`Outcome::rules`]), in order: derefs to
/// `[RuleOutcome]`, inline up to two rules. Built by collecting, extending or from a `Vec`.
///
/// ```
/// use tollgate::{Decision, RateLimitInfo, RuleOutcome, RuleOutcomes};
/// use std::time::Duration;
///
/// let info = RateLimitInfo { limit: 5, remaining: 4, reset: Duration::from_secs(60) };
/// let rules: RuleOutcomes = [RuleOutcome { decision: Decision::Allow, info }].into_iter().collect();
/// assert_eq!(rules.len(), 1);
/// assert_eq!(rules[0].info.remaining, 4);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleOutcomes(SmallVec<[RuleOutcome; RuleOutcomes::INLINE]>);

impl RuleOutcomes {
    /// How many outcomes are held without a heap allocation.
    pub(crate) const INLINE: usize = 2;

    /// No outcomes.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends the outcome of the next rule of the batch.
    pub(crate) fn push(&mut self, outcome: RuleOutcome) {
        self.0.push(outcome);
    }
}

impl Deref for RuleOutcomes {
    type Target = [RuleOutcome];

    fn deref(&self) -> &[RuleOutcome] {
        &self.0
    }
}

impl DerefMut for RuleOutcomes {
    fn deref_mut(&mut self) -> &mut [RuleOutcome] {
        &mut self.0
    }
}

impl FromIterator<RuleOutcome> for RuleOutcomes {
    fn from_iter<I: IntoIterator<Item = RuleOutcome>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl Extend<RuleOutcome> for RuleOutcomes {
    fn extend<I: IntoIterator<Item = RuleOutcome>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl From<Vec<RuleOutcome>> for RuleOutcomes {
    fn from(rules: Vec<RuleOutcome>) -> Self {
        Self(SmallVec::from_vec(rules))
    }
}

impl<'a> IntoIterator for &'a RuleOutcomes {
    type Item = &'a RuleOutcome;
    type IntoIter = std::slice::Iter<'a, RuleOutcome>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The batch's decision ([`Outcome::decision`]); the items `is_shadow` names take no part.
pub(crate) fn combine(
    rules: impl Into<RuleOutcomes>,
    is_shadow: impl Fn(usize) -> bool,
) -> Outcome {
    let rules = rules.into();
    let mut decision = Decision::Allow;
    for (_, rule) in rules.iter().enumerate().filter(|(i, _)| !is_shadow(*i)) {
        decision = match (decision, rule.decision) {
            (Decision::Deny(a), Decision::Deny(b)) => Decision::Deny(longer(a, b)),
            (deny @ Decision::Deny(_), _) | (_, deny @ Decision::Deny(_)) => deny,
            (Decision::Delay(a), Decision::Delay(b)) => Decision::Delay(a.max(b)),
            (Decision::Allow, other) | (other, Decision::Allow) => other,
        };
    }
    Outcome {
        decision,
        rules,
        admission: None,
    }
}

fn longer(a: Denial, b: Denial) -> Denial {
    match (a.retry_after, b.retry_after) {
        (None, _) => a,
        (_, None) => b,
        (Some(x), Some(y)) if y > x => b,
        _ => a,
    }
}

/// What a store recorded for an admitted batch, so the units can go back to the store that
/// took them ([`Taken`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admission {
    /// Per rule of the batch, in order.
    pub(crate) taken: SmallVec<[Taken; 2]>,
}

/// One rule's part of an [`Admission`]: who took its units, when (µs), the model's mark;
/// or, `pending`, nothing taken yet.
#[derive(Debug, Clone, Copy, Eq, Default)]
pub(crate) struct Taken {
    /// The store that took the units: a store gives back only its own.
    pub(crate) store: StoreId,
    pub(crate) at: u64,
    pub(crate) mark: u64,
    pub(crate) pending: bool,
    /// The water a leaky bucket's hold added (see `LeakyBucket::hold`); 0 otherwise.
    pub(crate) hold: u64,
    /// Units parked in a lease ([`Store::lease`](crate::store::Store::lease)), `mark` its
    /// id: a refund ends the lease.
    pub(crate) lease: bool,
}

/// The name of the store (and clones) that took units; 0 is none. 32 bits keep [`Taken`]
/// at 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub(crate) struct StoreId(u32);

impl StoreId {
    /// A name no other store of this process has (until 2^32 stores were made).
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed).max(1))
    }
}

/// Equal when the same units were taken alike by whichever store (for differential tests).
impl PartialEq for Taken {
    fn eq(&self, other: &Self) -> bool {
        let Self {
            store: _,
            at,
            mark,
            pending,
            hold,
            lease,
        } = *self;
        (at, mark, pending, hold, lease)
            == (other.at, other.mark, other.pending, other.hold, other.lease)
    }
}

impl Taken {
    /// Units `store` took at `at`, leaving the state `mark`.
    pub(crate) fn at(store: StoreId, at: u64, mark: u64) -> Self {
        Self {
            store,
            at,
            mark,
            ..Self::default()
        }
    }

    /// A rule left to the request's release: nothing taken yet.
    pub(crate) fn pending() -> Self {
        Self {
            pending: true,
            ..Self::default()
        }
    }
}

impl Admission {
    pub(crate) fn new(taken: impl IntoIterator<Item = Taken>) -> Self {
        Self {
            taken: taken.into_iter().collect(),
        }
    }

    /// The admission of a batch of one (a push, not a collect: the hot path's).
    pub(crate) fn one(taken: Taken) -> Self {
        let mut all = SmallVec::new();
        all.push(taken);
        Self { taken: all }
    }

    /// The `i`-th rule's part; nothing to give back (cost 0) reads as at 0.
    pub(crate) fn taken(&self, i: usize) -> Taken {
        self.taken.get(i).copied().unwrap_or_default()
    }

    /// The indices of the rules still to be counted at the release, in order.
    pub(crate) fn pending(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.taken.len()).filter(|&i| self.taken[i].pending)
    }

    /// The admission of the sub-batch of the rules at `indices` (in that order).
    pub(crate) fn select(&self, indices: &[usize]) -> Admission {
        Admission {
            taken: indices.iter().map(|&i| self.taken(i)).collect(),
        }
    }
}

//! [`Reservation`]: an admitted request that has not passed yet, and owns what it took.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::log::{process_log, Event, EventLog};
use crate::store::check::{Check, Health, Refusal, Store};
use crate::stored::KeyBytes;
use crate::Rule;

/// An admitted request that has not passed yet, owning the units its rules took. Made by
/// [`Limiter::reserve`](crate::Limiter::reserve); the tower layer holds requests with it.
///
/// [`confirm`](Self::confirm) it when the request is about to pass; [`cancel`](Self::cancel)
/// or drop it when it will not: its units go back as [`Store::refund`] allows. After a
/// confirmation, dropping it keeps the units, `cancel` still gives them back, and
/// [`settle`](Self::settle) charges what the request turned out to cost.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Check, Decision, Limiter, ManualClock, Rate, Rule, store::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(0)));
/// let rule = Rule::gcra("api", 1, Rate::per_second(10));
/// let batch = [Check::new(&rule, b"k")];
/// let wait = Duration::from_millis(250);
/// let mut first = limiter.reserve(&batch, wait).await?;
/// assert_eq!(first.confirm().await?.decision, Decision::Allow);
///
/// let held = limiter.reserve(&batch, wait).await?;
/// assert_eq!(held.outcome().decision, Decision::Delay(Duration::from_millis(100)));
/// // Its client went away: the slot at 100 ms goes to the next request.
/// drop(held);
/// let mut next = limiter.reserve(&batch, wait).await?;
/// assert_eq!(next.outcome().decision, Decision::Delay(Duration::from_millis(100)));
/// let third = limiter.reserve(&batch, wait).await?;
/// assert_eq!(third.outcome().decision, Decision::Delay(Duration::from_millis(200)));
/// let fourth = limiter.reserve(&batch, wait).await?;
/// assert!(!fourth.outcome().is_admitted()); // 300 ms is too long
///
/// // Waits until due, then passes.
/// assert_eq!(next.confirm().await?.decision, Decision::Allow);
/// # Ok(()) }
/// ```
#[must_use = "a reservation dropped before it is confirmed gives its units back"]
pub struct Reservation<S: Store + Clone> {
    store: S,
    batch: Arc<dyn Batch>,
    outcome: Outcome,
    max_wait: Duration,
    reserved_at: Instant,
    due: Instant,
    state: Stage,
    log: Arc<EventLog>,
}

/// Where a reservation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Admitted, not released: dropping it gives its units back.
    Held,
    /// The waiting rules are being counted: dropped now, it keeps its units (never twice).
    Confirming,
    /// Released: dropping it keeps the units; `cancel` gives them back.
    Passed,
    /// Nothing left to give back: denied, given back, or unknown after a store failure.
    Spent,
}

/// The batch a reservation was checked with, owned beyond the caller's borrow.
pub(crate) trait Batch: Send + Sync + 'static {
    /// The checks, in the order they were decided.
    fn checks(&self) -> SmallVec<[Check<'_>; 4]>;
}

/// A batch copied from a caller's checks.
pub(crate) struct Copied {
    keys: Vec<u8>,
    /// Per check: its rule, where its key ends in `keys`, its cost, what its refusal does.
    items: SmallVec<[(Rule, usize, u64, Refusal); 2]>,
}

impl Copied {
    pub(crate) fn new(batch: &[Check<'_>]) -> Self {
        let mut keys = Vec::with_capacity(batch.iter().map(|c| c.key().len()).sum());
        let items = batch
            .iter()
            .map(|c| {
                keys.extend_from_slice(c.key());
                (c.rule.clone(), keys.len(), c.cost, c.refusal)
            })
            .collect();
        Self { keys, items }
    }
}

impl Batch for Copied {
    fn checks(&self) -> SmallVec<[Check<'_>; 4]> {
        let mut start = 0;
        self.items
            .iter()
            .map(|&(ref rule, end, cost, refusal)| {
                let key = self.keys.get(start..end).unwrap_or_default();
                start = end;
                Check {
                    rule,
                    key: KeyBytes::Kept(key),
                    cost,
                    refusal,
                }
            })
            .collect()
    }
}

impl<S: Store + Clone> Reservation<S> {
    /// The reservation of `batch`, which the store answered with `outcome`, logging failed
    /// give-backs through `log` (the process's by default).
    pub(crate) fn of(
        store: S,
        batch: Arc<dyn Batch>,
        outcome: Outcome,
        max_wait: Duration,
        log: Option<Arc<EventLog>>,
    ) -> Self {
        let reserved_at = Instant::now();
        Self {
            store,
            batch,
            due: due_after(&outcome, reserved_at),
            state: Stage::of(&outcome),
            outcome,
            max_wait,
            reserved_at,
            log: log.unwrap_or_else(process_log),
        }
    }

    /// The store's answer ([`Delay`](Decision::Delay) until the request is due); after
    /// [`confirm`](Self::confirm), the answer at the release.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// When the request may pass (on tokio's clock, so a paused test clock moves it).
    pub fn due(&self) -> Instant {
        self.due
    }

    /// Waits until the request is due, counts the pending rules, and answers
    /// [`Allow`](Decision::Allow), or [`Deny`](Decision::Deny) if others took their room
    /// (the other rules' units then go back). If they can count it only later, within the
    /// wait left, the whole batch is reserved anew so its leaky buckets release it when it
    /// passes. Asked again, it answers the same. On a store error the units stay taken.
    pub async fn confirm(&mut self) -> Result<Outcome, StoreError> {
        if !self.outcome.is_admitted() {
            return Ok(self.outcome.clone());
        }
        loop {
            if Instant::now() < self.due {
                tokio::time::sleep_until(self.due).await;
            }
            self.released();
            self.pass();
            if self.state != Stage::Held {
                return Ok(self.outcome.clone());
            }
            let pending: SmallVec<[usize; 4]> = self.pending().collect();
            self.state = Stage::Confirming;
            let counted = self.count(&pending).await;
            // On a store error the units stay taken: whether the store counted is unknown.
            self.state = Stage::Passed;
            let counted = counted?;
            let later = matches!(counted.decision, Decision::Delay(_));
            let given = self.merge(&pending, counted);
            // Awaited, so that the next request sees the units back.
            if let Some(task) = given.and_then(|given| self.refund_detached(given)) {
                let _ = task.await;
            }
            if later {
                self.reserve_again().await?;
            }
            if self.state != Stage::Held {
                return Ok(self.outcome.clone());
            }
        }
    }

    /// The waiting rules reserved a later instant than the queues hold the request for.
    async fn reserve_again(&mut self) -> Result<(), StoreError> {
        // Dropped meanwhile, it keeps what the store may have taken.
        self.state = Stage::Confirming;
        let checks = self.batch.checks();
        // Given back first, so that the queues' slots are free to be taken again.
        unrefunded(&self.log, self.store.refund(&checks, &self.outcome).await);
        let max_wait = self.max_wait.saturating_sub(self.reserved_at.elapsed());
        let outcome = self.store.check(&checks, max_wait).await;
        self.state = Stage::Spent;
        let outcome = outcome?;
        self.due = due_after(&outcome, Instant::now());
        self.state = Stage::of(&outcome);
        self.outcome = outcome;
        Ok(())
    }

    /// Gives the units back now and says whether the store took them. Dropping it before
    /// confirmation does the same without waiting.
    pub async fn cancel(mut self) -> Result<(), StoreError> {
        if !matches!(self.state, Stage::Held | Stage::Passed) {
            return Ok(());
        }
        self.state = Stage::Spent;
        self.store.refund(&self.batch.checks(), &self.outcome).await
    }

    /// Settles what the request cost once known (bytes served): one cost per check, in
    /// order. Each rule gives back what it took beyond its cost ([`Store::refund`]) and takes
    /// the shortfall without a check ([`Store::overdraw`]) as a debt the key's next requests
    /// pay at the rule's rate, however far above its limit (a fixed window carries it into
    /// later windows; only a debt of 2^52 units or more than 2^50 µs is capped).
    ///
    /// Reserve with an estimate: an upper bound keeps requests in flight within the limit; a
    /// lower one admits more at once and charges the rest here (as the layer's
    /// [`Limit::cost_from_response`](crate::layer::Limit::cost_from_response) does).
    ///
    /// Settle after [`confirm`](Self::confirm): rules still waiting for the release took
    /// nothing and are left out. Afterwards the reservation holds nothing. A store outside
    /// this crate settles nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Check, Limiter, ManualClock, Rate, Rule, store::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::with_clock(ManualClock::new(0)));
    /// // 100 MB, refilled at 10 MB a second.
    /// let rule = Rule::token_bucket("export-mb", 100, Rate::per_second(10));
    /// let export = [Check::new(&rule, b"user-7").with_cost(1)];
    ///
    /// // Exports of unknown size: 1 MB each at admission, what they wrote once written.
    /// for written in [80, 50] {
    ///     let mut reservation = limiter.reserve(&export, Duration::ZERO).await?;
    ///     assert!(reservation.confirm().await?.is_admitted());
    ///     reservation.settle(&[written]).await?;
    /// }
    /// // 20 MB were left for the second export's 50: 30 MB of debt, which 3 s of refill
    /// // pay before the next 1 MB takes a tenth of a second.
    /// let next = limiter.check(&export).await?;
    /// let denial = next.decision.denial().expect("the debt is not paid yet");
    /// assert_eq!(denial.retry_after, Some(Duration::from_millis(3_100)));
    /// # Ok(()) }
    /// ```
    pub async fn settle(mut self, costs: &[u64]) -> Result<(), StoreError> {
        let Some(settled) = self.settlement(costs)? else {
            return Ok(());
        };
        self.settle_in(&settled).await
    }

    /// [`settle`](Self::settle) without waiting ([`run_detached`]), logging a failure.
    pub(crate) fn settle_detached(mut self, costs: &[u64]) {
        let settled = match self.settlement(costs) {
            Ok(Some(settled)) => settled,
            Ok(None) => return,
            Err(error) => return tracing::warn!(%error, "could not settle the cost of a request"),
        };
        // Spent: the task owns the reservation, and its drop gives nothing back.
        run_detached(async move { unrefunded(&self.log, self.settle_in(&settled).await) });
    }

    /// What settling at `costs` changes per rule, `None` if nothing; spends the reservation.
    fn settlement(&mut self, costs: &[u64]) -> Result<Option<Settled>, StoreError> {
        let checks = self.batch.checks();
        if costs.len() != checks.len() || self.outcome.rules.len() != checks.len() {
            return Err(StoreError::InvalidBatch(format!(
                "{} costs settle a batch of {} checks",
                costs.len(),
                checks.len()
            )));
        }
        if !matches!(self.state, Stage::Held | Stage::Passed) {
            return Ok(None);
        }
        self.state = Stage::Spent;
        let Some(admission) = &self.outcome.admission else {
            return Ok(None);
        };
        let mut settled = Settled::new();
        for (i, (check, &cost)) in checks.iter().zip(costs).enumerate() {
            // A shadow rule that would have denied took nothing; a pending one, nothing yet.
            let took = self
                .outcome
                .rules
                .get(i)
                .is_some_and(|r| r.decision.is_admitted())
                && !admission.taken(i).pending;
            if took && cost != check.cost {
                let owed = cost > check.cost;
                settled.push((i, cost.abs_diff(check.cost), owed));
            }
        }
        Ok((!settled.is_empty()).then_some(settled))
    }

    /// Gives back and takes what `settled` says through [`Store::refund`] and
    /// [`Store::overdraw`].
    async fn settle_in(&self, settled: &Settled) -> Result<(), StoreError> {
        let checks = self.batch.checks();
        let (back, given) = settled_part(&checks, &self.outcome, settled, false);
        if !back.is_empty() {
            self.store.refund(&back, &given).await?;
        }
        let (owed, _) = settled_part(&checks, &self.outcome, settled, true);
        if !owed.is_empty() {
            self.store.overdraw(&owed).await?;
        }
        Ok(())
    }

    /// The rules that wait for the release.
    pub(crate) fn pending(&self) -> impl Iterator<Item = usize> + '_ {
        self.outcome.admission.iter().flat_map(|a| a.pending())
    }

    /// The store's health, as the limiter sees it now.
    pub(crate) fn health(&self) -> Health {
        self.store.health()
    }

    /// Makes the request due now (shadow mode holds nothing).
    pub(crate) fn release_now(&mut self) {
        self.due = Instant::now();
    }

    /// The request passes now, with nothing left to count.
    pub(crate) fn pass(&mut self) {
        if self.state == Stage::Held && self.pending().next().is_none() {
            self.state = Stage::Passed;
        }
    }

    /// The delay is served: the rules that delayed the request pass it now.
    fn released(&mut self) {
        for rule in self.outcome.rules.iter_mut() {
            if matches!(rule.decision, Decision::Delay(_)) {
                rule.decision = Decision::Allow;
            }
        }
        if self.outcome.is_admitted() {
            self.outcome.decision = Decision::Allow;
        }
    }

    /// Counts the rules at `pending` now, with what is left of the wait.
    async fn count(&self, pending: &[usize]) -> Result<Outcome, StoreError> {
        let checks = self.batch.checks();
        let rest: SmallVec<[Check<'_>; 4]> = pending
            .iter()
            .filter_map(|&i| checks.get(i).copied())
            .collect();
        if rest.len() != pending.len() || self.outcome.rules.len() != checks.len() {
            return Err(StoreError::InvalidBatch(
                "a reservation's batch changed under it".into(),
            ));
        }
        let max_wait = self.max_wait.saturating_sub(self.reserved_at.elapsed());
        self.store.check(&rest, max_wait).await
    }

    /// Takes in what counting `pending` answered; on a denial, returns the rest to give back.
    fn merge(&mut self, pending: &[usize], counted: Outcome) -> Option<Outcome> {
        for (&i, rule) in pending.iter().zip(&counted.rules) {
            if let Some(slot) = self.outcome.rules.get_mut(i) {
                *slot = *rule;
            }
        }
        let before = self.outcome.admission.take();
        let (admission, given) = if counted.is_admitted() {
            match (counted.admission, before) {
                (Some(taken), Some(mut merged)) => {
                    for (k, &i) in pending.iter().enumerate() {
                        if let Some(slot) = merged.taken.get_mut(i) {
                            *slot = taken.taken(k);
                        }
                    }
                    (Some(merged), None)
                }
                // A store that records nothing to give back.
                (_, before) => (before, None),
            }
        } else {
            // Denied at the release: what the other rules took goes back.
            self.state = Stage::Spent;
            let mut given = self.outcome.clone();
            given.admission = before;
            (None, Some(given))
        };
        let rules = std::mem::take(&mut self.outcome.rules);
        let checks = self.batch.checks();
        self.outcome =
            crate::decision::combine(rules, |i| checks.get(i).is_some_and(|c| c.in_shadow()));
        self.outcome.admission = admission;
        if let (Decision::Delay(_), Stage::Passed) = (self.outcome.decision, self.state) {
            self.due = due_after(&self.outcome, Instant::now());
            self.state = Stage::Held;
        }
        given
    }

    /// Gives `outcome`'s units back without waiting ([`run_detached`]): the task, if the
    /// store did not answer at once.
    fn refund_detached(&self, outcome: Outcome) -> Option<tokio::task::JoinHandle<()>> {
        let (store, batch, log) = (self.store.clone(), self.batch.clone(), self.log.clone());
        run_detached(async move { unrefunded(&log, store.refund(&batch.checks(), &outcome).await) })
    }
}

impl Stage {
    /// Where a reservation answered `outcome` stands.
    fn of(outcome: &Outcome) -> Self {
        match (outcome.is_admitted(), &outcome.admission) {
            (true, Some(_)) => Stage::Held,
            (true, None) => Stage::Passed,
            (false, _) => Stage::Spent,
        }
    }
}

/// When a request answered `outcome` at `now` may pass.
fn due_after(outcome: &Outcome, now: Instant) -> Instant {
    match outcome.decision {
        Decision::Delay(delay) => now.checked_add(delay).unwrap_or(now),
        _ => now,
    }
}

/// Logs (rate-limited by `log`) the failure of giving units back or taking a debt, if any.
fn unrefunded(log: &Arc<EventLog>, result: Result<(), StoreError>) {
    let Err(error) = result else {
        return;
    };
    if let Some(suppressed) = log.admit(Event::RefundFailure) {
        tracing::warn!(%error, suppressed, "could not refund the units of a request, or take what it owes");
    }
}

/// Per rule a settlement changes: its index, the units, and whether they are owed (taken).
type Settled = SmallVec<[(usize, u64, bool); 4]>;

/// The checks a settlement gives back (`owed` false) or takes, with their part of `outcome`.
/// A settled request passed, so a leaky bucket's hold stays: only the units go back.
fn settled_part<'a>(
    checks: &[Check<'a>],
    outcome: &Outcome,
    settled: &Settled,
    owed: bool,
) -> (SmallVec<[Check<'a>; 4]>, Outcome) {
    let part = settled.iter().filter(|&&(.., o)| o == owed);
    let indices: SmallVec<[usize; 4]> = part.clone().map(|&(i, ..)| i).collect();
    let checks = part
        .filter_map(|&(i, units, _)| {
            checks.get(i).map(|c| Check {
                cost: units,
                refusal: Refusal::Enforced,
                ..*c
            })
        })
        .collect();
    let mut part = outcome.select(&indices);
    if let Some(admission) = part.admission.as_mut().filter(|_| !owed) {
        admission.taken.iter_mut().for_each(|taken| taken.hold = 0);
    }
    (checks, part)
}

/// Runs `work` at once if ready on the first poll, else on a tokio task, which it returns
/// (a caller that awaits it and is dropped meanwhile leaves the work running); outside a
/// runtime, work that must wait is left undone.
pub(crate) fn run_detached(
    work: impl Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let mut work = Box::pin(work);
    let mut cx = Context::from_waker(Waker::noop());
    if work.as_mut().poll(&mut cx).is_ready() {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().inspect_err(|_| {
        tracing::debug!("no tokio runtime here: work that must wait is left undone");
    });
    runtime.ok().map(|runtime| runtime.spawn(work))
}

impl<S: Store + Clone> Drop for Reservation<S> {
    fn drop(&mut self) {
        if self.state == Stage::Held {
            self.state = Stage::Spent;
            self.refund_detached(self.outcome.clone());
        }
    }
}

impl<S: Store + Clone> fmt::Debug for Reservation<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("outcome", &self.outcome)
            .field("due", &self.due)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{store::MemoryStore, Limiter, ManualClock, Rate};

    fn limiter() -> Limiter<MemoryStore> {
        Limiter::new(MemoryStore::with_clock(ManualClock::new(1_000_000)))
    }

    /// A confirmed reservation's units are the request's: dropping it keeps them, while
    /// `cancel` gives them back.
    #[tokio::test(start_paused = true)]
    async fn after_confirm_drop_keeps_and_cancel_gives_back() {
        let limiter = limiter();
        let rule = Rule::fixed_window("w", 1, Duration::from_secs(60));
        let batch = [Check::new(&rule, b"k")];
        let mut kept = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
        assert!(kept.confirm().await.unwrap().is_admitted());
        drop(kept);
        assert!(!limiter.check(&batch).await.unwrap().is_admitted());

        limiter.reset(&rule, b"k").await.unwrap();
        let mut given = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
        assert!(given.confirm().await.unwrap().is_admitted());
        given.cancel().await.unwrap();
        assert!(limiter.check(&batch).await.unwrap().is_admitted());
    }

    /// A denied reservation holds nothing, and confirming it answers its denial.
    #[tokio::test(start_paused = true)]
    async fn a_denied_reservation_answers_its_denial() {
        let limiter = limiter();
        let rule = Rule::gcra("g", 1, Rate::per_second(1));
        let batch = [Check::new(&rule, b"k")];
        let mut first = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
        assert!(first.confirm().await.unwrap().is_admitted());
        let mut denied = limiter.reserve(&batch, Duration::ZERO).await.unwrap();
        assert!(!denied.confirm().await.unwrap().is_admitted());
        drop(denied);
        assert!(!limiter.check(&batch).await.unwrap().is_admitted());
    }

    /// `confirm` waits until the request is due on tokio's clock.
    #[tokio::test(start_paused = true)]
    async fn confirm_waits_until_due() {
        let limiter = limiter();
        let rule = Rule::gcra("g", 1, Rate::per_second(10));
        let batch = [Check::new(&rule, b"k")];
        let wait = Duration::from_secs(1);
        drop(limiter.reserve(&batch, wait).await.unwrap().confirm().await);
        let mut held = limiter.reserve(&batch, wait).await.unwrap();
        let started = Instant::now();
        assert_eq!(held.confirm().await.unwrap().decision, Decision::Allow);
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }
}

//! Fallback's own tests: local decisions, divided quotas, refunds where the units were
//! taken, and the wrappers' forwarding.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use crate::store::breaker::tests::Flaky;
use crate::store::Breaker;
use crate::{ManualClock, Rate};

fn down(flaky: &Flaky, down: bool) {
    flaky.down.store(down, Ordering::SeqCst);
}

/// While the primary is away the local store enforces the rules, and once it is back
/// the primary decides again.
#[tokio::test(start_paused = true)]
async fn while_the_primary_is_away_the_local_store_enforces_the_rules() {
    let flaky = Flaky::default();
    let store = Fallback::with_local(
        Breaker::new(flaky.clone()).failures(2),
        MemoryStore::with_clock(ManualClock::new(0)),
    );
    let rule = Rule::fixed_window("r", 3, Duration::from_secs(60));
    let batch = [Check::new(&rule, b"k")];
    assert!(store
        .check(&batch, Duration::ZERO)
        .await
        .unwrap()
        .is_admitted());
    assert_eq!(store.health(), Health::Healthy);

    down(&flaky, true);
    let mut admitted = Vec::new();
    for _ in 0..4 {
        let outcome = store.check(&batch, Duration::ZERO).await.unwrap();
        admitted.push(outcome.is_admitted());
    }
    // The local store counts from zero: three pass, the fourth is limited.
    assert_eq!(admitted, [true, true, true, false]);
    assert_eq!(store.health(), Health::Degraded);
    assert!(store.is_falling_back());
    assert_eq!(store.primary.health(), Health::Failing);

    // Back: the primary decides again (it counted one), once the breaker probes.
    down(&flaky, false);
    tokio::time::advance(crate::store::breaker::DEFAULT_OPEN_FOR).await;
    let outcome = store.check(&batch, Duration::ZERO).await.unwrap();
    assert!(outcome.is_admitted());
    assert_eq!(outcome.rules[0].info.remaining, 1);
    assert_eq!(store.health(), Health::Healthy);
}

/// Local decisions divide each rule's quota and burst by the number of instances.
#[tokio::test(start_paused = true)]
async fn quotas_are_divided_by_the_instances_in_local_decisions() {
    let flaky = Flaky::default();
    down(&flaky, true);
    let store = Fallback::with_local(
        Breaker::new(flaky.clone()),
        MemoryStore::with_clock(ManualClock::new(0)),
    )
    .instances(4);
    let window = Rule::fixed_window("w", 10, Duration::from_secs(60));
    let gcra = Rule::gcra("g", 8, Rate::per_second(40));
    let mut admitted = [0, 0];
    for _ in 0..20 {
        for (n, rule) in admitted.iter_mut().zip([&window, &gcra]) {
            let outcome = store
                .check(&[Check::new(rule, b"k")], Duration::ZERO)
                .await
                .unwrap();
            *n += usize::from(outcome.is_admitted());
        }
    }
    // 10 / 4 → 2 per window; a burst of 8 / 4 → 2 at once.
    assert_eq!(admitted, [2, 2]);
    // The GCRA's enforced rate: 10 per second.
    let [_, _, period, amount, _] = divide(&gcra, 4).unwrap().algorithm().code_and_params();
    assert_eq!(amount * 4, 40 * period / 1_000_000);
}

/// What `n` instances, each on its own local store while the primary is away, admit
/// together of `rule` for one key, asked `tries` times each.
async fn admitted_by_instances(rule: &Rule, n: u64, tries: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let flaky = Flaky::default();
        down(&flaky, true);
        let store = Fallback::with_local(
            Breaker::new(flaky.clone()),
            MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000)),
        )
        .instances(n);
        for _ in 0..tries {
            let batch = [Check::new(rule, b"k")];
            let outcome = store.check(&batch, Duration::ZERO).await.unwrap();
            admitted += usize::from(outcome.is_admitted());
        }
    }
    admitted
}

/// The instances' local shares never add up to more than one quota: a quota smaller
/// than the number of instances leaves some instances no share at all.
#[tokio::test(start_paused = true)]
async fn the_instances_together_admit_at_most_one_quota() {
    let window = Rule::fixed_window("w", 2, Duration::from_secs(60));
    assert!(admitted_by_instances(&window, 3, 5).await <= 2);
    let bucket = Rule::gcra("g", 2, Rate::per_minute(2));
    assert!(admitted_by_instances(&bucket, 3, 5).await <= 2);
}

/// A rule whose divided rate cannot be built (its period times the instances is too
/// long) is reduced another way or given no share, never used undivided.
#[tokio::test(start_paused = true)]
async fn a_rule_that_cannot_be_divided_is_never_used_whole() {
    let year = Rate::new(10, Duration::from_secs(366 * 86_400));
    let bucket = Rule::token_bucket("t", 10, year);
    assert!(admitted_by_instances(&bucket, 40, 20).await <= 10);
    let gcra = Rule::gcra("g", 10, year);
    assert!(admitted_by_instances(&gcra, 40, 20).await <= 10);
}

/// Units the local store admitted are refunded to the local store, not the primary.
#[tokio::test(start_paused = true)]
async fn a_local_admission_is_refunded_locally() {
    let flaky = Flaky::default();
    down(&flaky, true);
    let store = Fallback::with_local(
        Breaker::new(flaky.clone()).failures(1),
        MemoryStore::with_clock(ManualClock::new(0)),
    );
    let rule = Rule::gcra("g", 1, Rate::per_second(10));
    let batch = [Check::new(&rule, b"k")];
    let wait = Duration::from_secs(1);
    assert_eq!(
        store.check(&batch, wait).await.unwrap().decision,
        crate::Decision::Allow
    );
    let held = store.check(&batch, wait).await.unwrap();
    let calls = flaky.calls();
    store.refund(&batch, &held).await.unwrap();
    assert_eq!(flaky.calls(), calls, "the primary did not take these units");
    let next = store.check(&batch, wait).await.unwrap();
    assert_eq!(
        next.decision,
        crate::Decision::Delay(Duration::from_millis(100))
    );
}

/// Nested fallbacks give each unit back to the store that took it: a held request the
/// inner fallback's local store admitted (its primary away, the outer's primary answering)
/// is refunded there, not in the outer fallback's local store.
#[tokio::test(start_paused = true)]
async fn a_nested_fallbacks_units_go_back_to_the_store_that_took_them() {
    let flaky = Flaky::default();
    down(&flaky, true);
    let clock = ManualClock::new(0);
    let (inner_local, outer_local) = (
        MemoryStore::with_clock(clock.clone()),
        MemoryStore::with_clock(clock.clone()),
    );
    let inner = Fallback::with_local(Breaker::new(flaky.clone()).failures(1), inner_local);
    let store = Fallback::with_local(inner, outer_local.clone());
    let rule = Rule::gcra("g", 1, Rate::per_second(10));
    let batch = [Check::new(&rule, b"k")];
    let wait = Duration::from_secs(1);
    // The outer local store holds a reservation of its own on the key, with the same marks.
    for _ in 0..2 {
        outer_local.check(&batch, wait).await.unwrap();
    }
    let decision = |o: Outcome| o.decision;
    assert_eq!(
        decision(store.check(&batch, wait).await.unwrap()),
        crate::Decision::Allow
    );
    let held = store.check(&batch, wait).await.unwrap();
    store.refund(&batch, &held).await.unwrap();
    let tenth = Duration::from_millis(100);
    let next = store.check(&batch, wait).await.unwrap();
    assert_eq!(
        next.decision,
        crate::Decision::Delay(tenth),
        "given back where taken"
    );
    let outer = outer_local.check(&batch, wait).await.unwrap();
    assert_eq!(
        outer.decision,
        crate::Decision::Delay(2 * tenth),
        "not given back here"
    );
}

/// A held request the local store admitted, with a rule left to its release, is refunded
/// locally without asking the primary (away, its breaker open) for anything: the rule left
/// pending took nothing anywhere.
#[tokio::test(start_paused = true)]
async fn a_local_refund_with_a_pending_rule_asks_nothing_of_the_primary() {
    let flaky = Flaky::default();
    down(&flaky, true);
    let store = Fallback::with_local(
        Breaker::new(flaky.clone()).failures(1),
        MemoryStore::with_clock(ManualClock::new(0)),
    );
    let queue = Rule::leaky_bucket("q", 2, Rate::per_second(10));
    let window = Rule::fixed_window("w", 5, Duration::from_secs(60));
    let batch = [Check::new(&queue, b"tenant"), Check::new(&window, b"user")];
    let wait = Duration::from_secs(1);
    assert_eq!(
        store.check(&batch, wait).await.unwrap().decision,
        crate::Decision::Allow
    );
    let held = store.check(&batch, wait).await.unwrap();
    assert!(held.needs_confirmation(), "{held:?}");
    let calls = flaky.calls();
    store.refund(&batch, &held).await.unwrap();
    assert_eq!(flaky.calls(), calls, "nothing asked of the primary");
    let next = store.check(&batch, wait).await.unwrap();
    assert_eq!(next.decision, held.decision, "the queue's place given back");
}

/// A store with a probe of its own, for the wrappers' forwarding.
#[derive(Clone, Default)]
struct Probed(MemoryStore);

impl Store for Probed {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        self.0.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.0.lease(check, term, ending).await
    }
    fn try_check_now(
        &self,
        batch: &[Check<'_>],
        wait: Duration,
    ) -> Option<Result<Outcome, StoreError>> {
        self.0.try_check_now(batch, wait)
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.0.peek(check).await
    }
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        self.0.reset(rule, key).await
    }
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        Some(std::future::ready(Ok(())))
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.0.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.0.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.0.count_denials(batch, ago).await
    }
    fn health(&self) -> crate::store::Health {
        self.0.health()
    }
}

/// The crate's wrappers lose none of the store's methods: a store that answers at once
/// still does behind a breaker and a fallback (closed, primary up), and its probe is
/// still there to ask.
#[test]
fn wrappers_forward_the_answer_at_once_and_the_probe() {
    let rule = Rule::gcra("g", 2, Rate::per_second(10));
    let batch = [Check::new(&rule, b"k")];
    let breaker = Breaker::new(Probed::default());
    assert!(breaker.try_check_now(&batch, Duration::ZERO).is_some());
    assert!(breaker.probe().is_some());
    let fallback = Fallback::with_local(Probed::default(), MemoryStore::new());
    assert!(fallback.try_check_now(&batch, Duration::ZERO).is_some());
    assert!(fallback.probe().is_some());
    let both = Fallback::with_local(Breaker::new(Probed::default()), MemoryStore::new());
    let outcome = both.try_check_now(&batch, Duration::ZERO);
    assert!(outcome.is_some_and(|o| o.is_ok_and(|o| o.is_admitted())));
    assert!(both.probe().is_some());
}

/// A primary whose calls fail while `failing`, and whose probe (a `PING`) always answers:
/// a server that is up but refuses the calls.
#[derive(Clone, Default)]
struct Refusing {
    inner: MemoryStore,
    failing: Arc<AtomicBool>,
    probes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Refusing {
    fn gate(&self) -> Result<(), StoreError> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(StoreError::Unavailable("refused".into())),
            false => Ok(()),
        }
    }
}

impl Store for Refusing {
    async fn check(&self, batch: &[Check<'_>], wait: Duration) -> Result<Outcome, StoreError> {
        self.gate()?;
        self.inner.check(batch, wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.gate()?;
        self.inner.lease(check, term, ending).await
    }
    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.gate()?;
        self.inner.peek(check).await
    }
    async fn reset(&self, rule: &Rule, key: &StoredKey<'_>) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.reset(rule, key).await
    }
    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        Some(std::future::ready(Ok(())))
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.inner.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.count_denials(batch, ago).await
    }
    fn health(&self) -> crate::store::Health {
        self.inner.health()
    }
}

async fn let_tasks_run() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A primary that never says it is unwell (no breaker here) is probed by a polled
/// `health`, once it has not failed for a breaker's `open_for`: while requests keep
/// failing it stays degraded, however well it answers the probe, and once they stop its
/// answer ends the fallback with no request.
#[tokio::test(start_paused = true)]
async fn a_polled_fallback_probes_a_primary_once_it_stops_failing() {
    let primary = Refusing::default();
    let store = Fallback::new(primary.clone());
    let rule = Rule::fixed_window("r", 100, Duration::from_secs(60));
    let batch = [Check::new(&rule, b"k")];
    primary.failing.store(true, Ordering::SeqCst);
    for _ in 0..20 {
        assert!(store.check(&batch, Duration::ZERO).await.is_ok());
        assert_eq!(store.health(), Health::Degraded);
        tokio::time::advance(Duration::from_millis(100)).await;
        let_tasks_run().await;
    }
    assert_eq!(
        primary.probes.load(Ordering::SeqCst),
        0,
        "probed while failing"
    );
    // No request from here on: polled only.
    primary.failing.store(false, Ordering::SeqCst);
    let mut polls = 0;
    while store.health() != Health::Healthy {
        polls += 1;
        assert!(polls <= 10, "still degraded after {polls} polls");
        tokio::time::advance(Duration::from_millis(100)).await;
        let_tasks_run().await;
    }
    assert!(
        polls >= 4,
        "probed before the primary was quiet for open_for"
    );
    assert_eq!(primary.probes.load(Ordering::SeqCst), 1);
    assert!(store.check(&batch, Duration::ZERO).await.is_ok());
    assert!(!store.is_falling_back());
}

/// Every call the primary fails is answered locally and says so: a peek (the admin's view
/// of a key) or a count of denials the primary refuses puts the fallback in charge, its
/// health degraded, as a failed decision does; the primary's next answer to one ends it.
#[tokio::test(start_paused = true)]
async fn a_failed_peek_or_count_of_denials_is_answered_locally_and_says_so() {
    for call in ["peek", "count_denials", "overdraw"] {
        let primary = Refusing::default();
        let store = Fallback::new(primary.clone());
        let rule = Rule::fixed_window("r", 100, Duration::from_secs(60));
        let check = Check::new(&rule, b"k");
        let ask = || async {
            match call {
                "peek" => store.peek(check).await.map(drop),
                "count_denials" => store.count_denials(&[check], Duration::ZERO).await,
                _ => store.overdraw(&[check]).await,
            }
        };
        primary.failing.store(true, Ordering::SeqCst);
        assert!(ask().await.is_ok(), "{call}: answered locally");
        assert!(store.is_falling_back(), "{call}");
        assert_eq!(store.health(), Health::Degraded, "{call}");

        primary.failing.store(false, Ordering::SeqCst);
        assert!(ask().await.is_ok(), "{call}");
        assert!(!store.is_falling_back(), "{call}: the primary answered");
    }
}

use std::sync::atomic::AtomicUsize;

use super::*;
use crate::store::MemoryStore;

/// A memory store that can be taken down (fails at once) or made to hang.
#[derive(Clone, Default)]
pub(crate) struct Flaky {
    pub(crate) inner: MemoryStore,
    pub(crate) down: Arc<AtomicBool>,
    pub(crate) hang: Arc<AtomicBool>,
    pub(crate) calls: Arc<AtomicUsize>,
}

impl Flaky {
    async fn gate(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("down".into()));
        }
        Ok(())
    }

    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Store for Flaky {
    async fn check(&self, batch: &[Check<'_>], max_wait: Duration) -> Result<Outcome, StoreError> {
        self.gate().await?;
        self.inner.check(batch, max_wait).await
    }
    async fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> Result<Outcome, StoreError> {
        self.gate().await?;
        self.inner.lease(check, term, ending).await
    }

    async fn peek(&self, check: Check<'_>) -> Result<RuleOutcome, StoreError> {
        self.gate().await?;
        self.inner.peek(check).await
    }

    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.refund(batch, outcome).await
    }

    async fn reset(&self, rule: &Rule, key: &crate::StoredKey<'_>) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.reset(rule, key).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.inner.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.inner.count_denials(batch, ago).await
    }
    fn health(&self) -> crate::store::Health {
        self.inner.health()
    }
}

fn rule() -> Rule {
    Rule::fixed_window("r", 1000, Duration::from_secs(60))
}

/// The breaker opens after the configured consecutive failures, and while open fails at
/// once without calling the store.
#[tokio::test(start_paused = true)]
async fn opens_after_consecutive_failures_and_then_skips_the_store() {
    let flaky = Flaky::default();
    let breaker = Breaker::new(flaky.clone())
        .failures(3)
        .open_for(Duration::from_secs(1));
    let rule = rule();
    let batch = [Check::new(&rule, b"k")];
    assert!(breaker.check(&batch, Duration::ZERO).await.is_ok());
    flaky.down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        assert!(matches!(
            breaker.check(&batch, Duration::ZERO).await,
            Err(StoreError::Unavailable(_))
        ));
        assert_eq!(breaker.state(), CLOSED);
    }
    assert!(matches!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::Unavailable(_))
    ));
    assert_eq!(breaker.state(), OPEN);
    assert_eq!(breaker.health(), Health::Failing);
    let calls = flaky.calls();
    for _ in 0..100 {
        assert_eq!(
            breaker.check(&batch, Duration::ZERO).await,
            Err(StoreError::CircuitOpen)
        );
    }
    assert_eq!(flaky.calls(), calls, "an open breaker sends nothing");
}

/// A success resets the count of consecutive failures.
#[tokio::test(start_paused = true)]
async fn a_success_resets_the_count_of_consecutive_failures() {
    let flaky = Flaky::default();
    let breaker = Breaker::new(flaky.clone()).failures(2);
    let rule = rule();
    let batch = [Check::new(&rule, b"k")];
    for _ in 0..5 {
        flaky.down.store(true, Ordering::SeqCst);
        assert!(breaker.check(&batch, Duration::ZERO).await.is_err());
        flaky.down.store(false, Ordering::SeqCst);
        assert!(breaker.check(&batch, Duration::ZERO).await.is_ok());
    }
    assert_eq!(breaker.state(), CLOSED);
}

/// A store without a probe of its own: one request at a time is the probe.
#[tokio::test(start_paused = true)]
async fn one_probe_at_a_time_and_its_answer_closes_or_reopens() {
    let flaky = Flaky::default();
    let breaker = Breaker::new(flaky.clone())
        .failures(1)
        .open_for(Duration::from_secs(1));
    let rule = rule();
    let batch = [Check::new(&rule, b"k")];
    flaky.down.store(true, Ordering::SeqCst);
    assert!(breaker.check(&batch, Duration::ZERO).await.is_err());
    assert_eq!(breaker.state(), OPEN);

    // Not before `open_for`.
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::CircuitOpen)
    );

    // The probe fails: open for another second.
    tokio::time::advance(Duration::from_millis(1)).await;
    let calls = flaky.calls();
    assert!(matches!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::Unavailable(_))
    ));
    assert_eq!(flaky.calls(), calls + 1);
    assert_eq!(breaker.state(), OPEN);
    assert_eq!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::CircuitOpen)
    );

    // A probe that hangs: every other call fails at once meanwhile.
    tokio::time::advance(Duration::from_secs(1)).await;
    flaky.hang.store(true, Ordering::SeqCst);
    let probing = breaker.clone();
    let probe_rule = rule.clone();
    let probe = tokio::spawn(async move {
        probing
            .check(&[Check::new(&probe_rule, b"k")], Duration::ZERO)
            .await
    });
    tokio::task::yield_now().await;
    assert_eq!(breaker.state(), HALF_OPEN);
    let calls = flaky.calls();
    for _ in 0..50 {
        assert_eq!(
            breaker.check(&batch, Duration::ZERO).await,
            Err(StoreError::CircuitOpen)
        );
    }
    assert_eq!(
        flaky.calls(),
        calls,
        "no call but the probe reaches the store"
    );

    // Its caller goes away: the next call probes at once, succeeds and closes.
    probe.abort();
    assert!(probe.await.is_err());
    assert_eq!(breaker.state(), OPEN);
    flaky.hang.store(false, Ordering::SeqCst);
    flaky.down.store(false, Ordering::SeqCst);
    assert!(breaker.check(&batch, Duration::ZERO).await.is_ok());
    assert_eq!(breaker.state(), CLOSED);
    assert_eq!(breaker.health(), Health::Healthy);
}

/// [`Flaky`] with a probe of its own, which can be made slow (as a store's timeout).
#[derive(Clone, Default)]
struct Pinged {
    flaky: Flaky,
    slow: Arc<AtomicBool>,
    probes: Arc<AtomicUsize>,
}

impl Pinged {
    fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }
}

impl Store for Pinged {
    fn check(
        &self,
        batch: &[Check<'_>],
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.flaky.check(batch, max_wait)
    }
    fn lease(
        &self,
        check: Check<'_>,
        term: Duration,
        ending: Option<(&Outcome, u64)>,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.flaky.lease(check, term, ending)
    }

    fn peek(
        &self,
        check: Check<'_>,
    ) -> impl Future<Output = Result<RuleOutcome, StoreError>> + Send {
        self.flaky.peek(check)
    }

    fn reset(
        &self,
        rule: &Rule,
        key: &crate::StoredKey<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.flaky.reset(rule, key)
    }

    fn probe(&self) -> Option<impl Future<Output = Result<(), StoreError>> + Send + 'static> {
        let (down, slow) = (self.flaky.down.clone(), self.slow.clone());
        self.probes.fetch_add(1, Ordering::SeqCst);
        Some(async move {
            if slow.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            if down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            Ok(())
        })
    }
    async fn refund(&self, batch: &[Check<'_>], outcome: &Outcome) -> Result<(), StoreError> {
        self.flaky.refund(batch, outcome).await
    }
    async fn overdraw(&self, batch: &[Check<'_>]) -> Result<(), StoreError> {
        self.flaky.overdraw(batch).await
    }
    async fn count_denials(&self, batch: &[Check<'_>], ago: Duration) -> Result<(), StoreError> {
        self.flaky.count_denials(batch, ago).await
    }
    fn health(&self) -> crate::store::Health {
        self.flaky.health()
    }
}

async fn let_tasks_run() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// An open breaker probes a store that has a probe itself, one probe at a time once
/// `open_for` ends, and no request waits for it.
#[tokio::test(start_paused = true)]
async fn a_store_with_a_probe_is_probed_by_the_breaker_and_no_request_waits() {
    let store = Pinged::default();
    let breaker = Breaker::new(store.clone())
        .failures(1)
        .open_for(Duration::from_secs(1));
    let rule = rule();
    let batch = [Check::new(&rule, b"k")];
    store.flaky.down.store(true, Ordering::SeqCst);
    assert!(breaker.check(&batch, Duration::ZERO).await.is_err());
    assert_eq!(breaker.state(), OPEN);
    let calls = store.flaky.calls();

    // Not before `open_for`.
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::CircuitOpen)
    );
    let_tasks_run().await;
    assert_eq!(store.probes(), 0);

    // Due: the call that finds it so fails at once; the breaker's probe fails and
    // opens it for another second.
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::CircuitOpen)
    );
    let_tasks_run().await;
    assert_eq!(store.probes(), 1);
    assert_eq!(breaker.state(), OPEN);
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(
        breaker.check(&batch, Duration::ZERO).await,
        Err(StoreError::CircuitOpen)
    );
    let_tasks_run().await;
    assert_eq!(store.probes(), 1);

    // A probe that takes the timeout: one at a time, every call fails at once meanwhile.
    tokio::time::advance(Duration::from_millis(1)).await;
    store.slow.store(true, Ordering::SeqCst);
    store.flaky.down.store(false, Ordering::SeqCst);
    for _ in 0..50 {
        assert_eq!(
            breaker.check(&batch, Duration::ZERO).await,
            Err(StoreError::CircuitOpen)
        );
        let_tasks_run().await;
    }
    assert_eq!(breaker.state(), HALF_OPEN);
    assert_eq!(store.probes(), 2, "one probe at a time");
    assert_eq!(store.flaky.calls(), calls, "no request reaches the store");

    // Its answer closes the breaker; requests go to the store again.
    tokio::time::advance(Duration::from_secs(5)).await;
    let_tasks_run().await;
    assert_eq!(breaker.state(), CLOSED);
    assert_eq!(breaker.health(), Health::Healthy);
    assert!(breaker.check(&batch, Duration::ZERO).await.is_ok());
    assert_eq!(store.flaky.calls(), calls + 1);

    // With no request at all, polling `health` probes once due (a replica out of
    // service while failing comes back).
    store.slow.store(false, Ordering::SeqCst);
    store.flaky.down.store(true, Ordering::SeqCst);
    assert!(breaker.check(&batch, Duration::ZERO).await.is_err());
    assert_eq!(breaker.state(), OPEN);
    store.flaky.down.store(false, Ordering::SeqCst);
    assert_eq!(breaker.health(), Health::Failing);
    let_tasks_run().await;
    assert_eq!(store.probes(), 2, "not before `open_for`");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker.health(), Health::Failing);
    let_tasks_run().await;
    assert_eq!(store.probes(), 3);
    assert_eq!(breaker.state(), CLOSED);
    assert_eq!(breaker.health(), Health::Healthy);
}

/// A malformed batch is the caller's error, not a store failure, and never opens the
/// breaker.
#[tokio::test(start_paused = true)]
async fn a_malformed_batch_is_not_a_store_failure() {
    let flaky = Flaky::default();
    let breaker = Breaker::new(flaky.clone()).failures(1);
    let rule = rule();
    let twice = [Check::new(&rule, b"k"), Check::new(&rule, b"k")];
    for _ in 0..3 {
        assert!(matches!(
            breaker.check(&twice, Duration::ZERO).await,
            Err(StoreError::InvalidBatch(_))
        ));
    }
    assert_eq!(breaker.state(), CLOSED);
}

/// Readiness recovers with no traffic: a fallback over a breaker is degraded while the
/// primary is away and healthy again once the breaker's own probe (started by polling
/// `health`, as `/ready` does) gets an answer; a later failure degrades it again, and a
/// fallback without a breaker, whose primary never says it is unwell, waits for a request.
#[tokio::test(start_paused = true)]
async fn a_polled_fallback_over_a_breaker_recovers_with_no_request() {
    use crate::store::Fallback;

    let store = Pinged::default();
    let fallback = Fallback::new(
        Breaker::new(store.clone())
            .failures(1)
            .open_for(Duration::from_secs(1)),
    );
    let rule = rule();
    let batch = [Check::new(&rule, b"k")];
    for _ in 0..2 {
        store.flaky.down.store(true, Ordering::SeqCst);
        assert!(fallback.check(&batch, Duration::ZERO).await.is_ok());
        assert_eq!(fallback.health(), Health::Degraded);
        store.flaky.down.store(false, Ordering::SeqCst);
        let calls = store.flaky.calls();
        // Polled, with no request: healthy within `open_for` and the probe.
        let mut polls = 0;
        while fallback.health() != Health::Healthy {
            polls += 1;
            assert!(
                polls <= 11,
                "still {:?} after {polls} polls",
                fallback.health()
            );
            tokio::time::advance(Duration::from_millis(100)).await;
            let_tasks_run().await;
        }
        assert!(polls >= 9, "healthy before the breaker's probe was due");
        assert_eq!(store.flaky.calls(), calls, "no request reached the store");
    }

    let bare = Flaky::default();
    let fallback = Fallback::new(bare.clone());
    bare.down.store(true, Ordering::SeqCst);
    assert!(fallback.check(&batch, Duration::ZERO).await.is_ok());
    bare.down.store(false, Ordering::SeqCst);
    assert_eq!(fallback.health(), Health::Degraded);
    assert!(fallback.check(&batch, Duration::ZERO).await.is_ok());
    assert_eq!(fallback.health(), Health::Healthy);
}

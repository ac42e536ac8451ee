//! MemoryStore and RedisStore (the Lua twin) on the same scripts of reservations,
//! confirmations and cancellations, across the merged features: every outcome is the
//! same.

use std::time::Duration;

use crate::support::redis_server::RedisServer;
use crate::support::still::Still;
use tollgate::{
    store::{MemoryStore, Store},
    Check, Limiter, ManualClock, Rate, Reservation, Rule,
};

const T0: u64 = crate::support::EPOCH;
const US: Duration = Duration::from_micros(1);
/// The unit of the scripts that confirm: tokio's timer, which ends a reservation's
/// wait, has a resolution of 1 ms.
const MS: Duration = Duration::from_millis(1);

pub(super) enum Op {
    /// At a time after T0: the items (rule index, key, cost, shadow), max_wait.
    Check(u64, Vec<(usize, &'static str, u64, bool)>, u64),
    /// At a time after T0: cancel the reservation of the op at this index (a check, or a
    /// confirmation of one).
    Refund(u64, usize),
    /// At a time after T0: confirm the reservation of the op at this index (a check, or
    /// a confirmation of one) (`Reservation::confirm`, which waits for the release of
    /// the request it holds).
    Confirm(u64, usize),
}

/// The index of the check behind op `i` (a check, or a confirmation or refund of one).
fn check_behind(ops: &[Op], i: usize) -> usize {
    match &ops[i] {
        Op::Check(..) => i,
        Op::Confirm(_, j) | Op::Refund(_, j) => check_behind(ops, *j),
    }
}

fn batch<'r>(rules: &'r [Rule], items: &[(usize, &'static str, u64, bool)]) -> Vec<Check<'r>> {
    items
        .iter()
        .map(|&(r, k, cost, shadow)| {
            let mut check = Check::new(&rules[r], k.as_bytes()).with_cost(cost);
            if shadow {
                check.refusal = tollgate::Refusal::Shadow;
            }
            check
        })
        .collect()
}

/// Runs `ops`, whose times and waits are in `unit`s, on `limiter`: the store on `clock`,
/// set to each op's time, and tokio's paused clock following it (never back), so that a
/// reservation's wait and what is left of its `max_wait` are the script's.
async fn run<S: Store + Clone>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    unit: Duration,
    rules: &[Rule],
    ops: &[Op],
) -> Vec<String> {
    let start = tokio::time::Instant::now();
    let units = |n: u64| Duration::from_micros(unit.as_micros() as u64 * n);
    let mut seen = Vec::new();
    // Per op, the reservation of a check (until it is cancelled).
    let mut held: Vec<Option<Reservation<S>>> = Vec::new();
    for op in ops {
        let (Op::Check(t, ..) | Op::Refund(t, _) | Op::Confirm(t, _)) = op;
        clock.set_micros(T0 + units(*t).as_micros() as u64);
        let now = tokio::time::Instant::now();
        if start + units(*t) > now {
            tokio::time::advance(start + units(*t) - now).await;
        }
        match op {
            Op::Check(_, items, max_wait) => {
                let batch = batch(rules, items);
                let reservation = limiter.reserve(&batch, units(*max_wait)).await.unwrap();
                let outcome = reservation.outcome();
                seen.push(format!("{:?} {:?}", outcome.decision, outcome.rules));
                held.push(Some(reservation));
            }
            Op::Confirm(_, i) => {
                let i = check_behind(ops, *i);
                let Some(reservation) = held[i].as_mut() else {
                    panic!("op {i} holds no reservation to confirm")
                };
                let outcome = reservation.confirm().await.unwrap();
                seen.push(format!(
                    "confirmed: {:?} {:?}",
                    outcome.decision, outcome.rules
                ));
                held.push(None);
            }
            Op::Refund(_, i) => {
                let i = check_behind(ops, *i);
                let Some(reservation) = held[i].take() else {
                    panic!("op {i} holds no reservation to cancel")
                };
                reservation.cancel().await.unwrap();
                seen.push("cancelled".into());
                held.push(None);
            }
        }
    }
    seen
}

/// Memory and a Redis server, on the script `ops` in `unit`s.
pub(super) async fn same(name: &str, unit: Duration, rules: &[Rule], ops: &[Op]) {
    let clock = ManualClock::new(T0);
    let memory = run(
        &Limiter::new(MemoryStore::with_clock(clock.clone())),
        &clock,
        unit,
        rules,
        ops,
    )
    .await;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = Still::connect(&server.url()).await;
    let redis = run(
        &Limiter::new(store.with_clock(clock.clone())),
        &clock,
        unit,
        rules,
        ops,
    )
    .await;
    for (i, m) in memory.iter().enumerate() {
        println!("{name} {i}: {m}");
    }
    for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
        assert_eq!(
            m, r,
            "{name}: op {i}: memory (left) and Redis (right) differ"
        );
    }
}

/// Memory and a 3-node Cluster, whose cross-slot batches are decided slot by slot
/// (realigned to the release, refunded when a later slot denies).
pub(super) async fn same_on_cluster(name: &str, unit: Duration, rules: &[Rule], ops: &[Op]) {
    let clock = ManualClock::new(T0);
    let memory = run(
        &Limiter::new(MemoryStore::with_clock(clock.clone())),
        &clock,
        unit,
        rules,
        ops,
    )
    .await;
    let cluster = crate::support::redis_server::RedisCluster::start();
    let clock = ManualClock::new(T0);
    let store = Still::connect(&cluster.url()).await;
    let redis = run(
        &Limiter::new(store.with_clock(clock.clone())),
        &clock,
        unit,
        rules,
        ops,
    )
    .await;
    for (i, m) in memory.iter().enumerate() {
        println!("{name} {i}: {m}");
    }
    for (i, (m, r)) in memory.iter().zip(&redis).enumerate() {
        assert_eq!(
            m, r,
            "{name}: op {i}: memory (left) and Cluster (right) differ"
        );
    }
}

/// Cross-slot batches with a queue, shadow items, waits and cancellations: each slot's
/// part is decided, realigned and given back as MemoryStore decides the whole batch.
#[tokio::test(start_paused = true)]
async fn cross_slot_batches_with_queues_shadows_and_refunds() {
    let rules = [
        Rule::leaky_bucket("lb", 5, rate(1, 100)),
        Rule::fixed_window("fw", 3, US * 1000),
        Rule::sliding_log("sl", 3, US * 1000),
        Rule::gcra("g", 2, rate(3, 5)),
        Rule::token_bucket("tb", 3, rate(1, 100)),
    ];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "a", 2, false)], 0),
        Check(
            0,
            vec![(1, "b", 1, false), (0, "a", 1, false), (2, "c", 1, false)],
            0,
        ),
        Check(
            1,
            vec![(1, "b", 1, false), (2, "c", 1, true), (0, "a", 1, false)],
            0,
        ),
        Refund(2, 2),
        Check(
            3,
            vec![(3, "d", 2, false), (4, "e", 1, false), (0, "a", 1, true)],
            0,
        ),
        Check(4, vec![(3, "d", 1, false), (4, "e", 1, false)], 500),
        Refund(5, 5),
        Check(6, vec![(3, "d", 1, false), (4, "e", 1, false)], 500),
        Check(
            7,
            vec![(1, "b", 1, false), (2, "c", 2, false), (0, "a", 1, false)],
            2000,
        ),
        Refund(8, 8),
        Check(9, vec![(1, "b", 1, false), (2, "c", 1, false)], 0),
        Check(
            1200,
            vec![(1, "b", 3, false), (2, "c", 3, false), (4, "e", 3, true)],
            0,
        ),
    ];
    same_on_cluster("cross-slot", US, &rules, &ops).await;
}

/// Rules on other keys than a leaky bucket are pending while it holds
/// the request and count it at its release; denied there, the queue's slot goes back.
fn shaped_with_shared_rules() -> (Vec<Rule>, Vec<Op>) {
    let rules = vec![
        Rule::leaky_bucket("queue", 5, rate_ms(1, 100)),
        Rule::fixed_window("window", 2, MS * 1000),
        Rule::token_bucket("bucket", 3, rate_ms(1, 300)),
        Rule::sliding_log("log", 2, MS * 600),
        Rule::gcra("g", 2, rate_ms(1, 200)),
    ];
    use Op::*;
    let ops = vec![
        // 0, 1: a's queue holds its second request 100 ms; the window is pending.
        Check(900, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
        Check(950, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
        // 2: b takes the window's last unit in [0, 1000).
        Check(960, vec![(0, "b", 1, false), (1, "all", 1, false)], 0),
        // 3: a's request passes at 1000, counted in [1000, 2000).
        Confirm(1000, 1),
        // 4, 5: c queues behind its first; a shared bucket and a log on another key.
        Check(
            1100,
            vec![
                (0, "c", 1, false),
                (2, "shared", 1, false),
                (3, "l", 1, false),
            ],
            0,
        ),
        Check(
            1110,
            vec![
                (0, "c", 2, false),
                (2, "shared", 1, false),
                (3, "l", 1, false),
            ],
            0,
        ),
        // 6: d takes the bucket and log while c's request is held; a trial rule on
        // another key counts on arrival.
        Check(
            1150,
            vec![
                (2, "shared", 2, false),
                (3, "l", 1, false),
                (4, "t", 1, true),
            ],
            0,
        ),
        // 7: at c's release the log is full: denied, c's queue slot given back.
        Confirm(1200, 5),
        // 8: so c's next request queues only behind its first.
        Check(1210, vec![(0, "c", 1, false), (4, "g", 1, false)], 0),
        Confirm(1300, 8),
        // 10, 11: wait mode: a pending GCRA reserves a later slot at the release.
        Check(1300, vec![(0, "e", 1, false), (4, "g", 1, false)], 0),
        Check(1310, vec![(0, "e", 1, false), (4, "g", 1, false)], 1000),
        Confirm(1400, 11),
        Confirm(1600, 12),
        Refund(1600, 12),
        Check(1700, vec![(4, "g", 1, false)], 0),
    ];
    (rules, ops)
}

/// [`shaped_with_shared_rules`] on MemoryStore and a Redis server: the same answers.
#[tokio::test(start_paused = true)]
async fn shaped_requests_with_shared_rules_confirmed_at_release() {
    let (rules, ops) = shaped_with_shared_rules();
    same("shaped", MS, &rules, &ops).await;
}

/// Queues in two slots: the one that holds the request longer decides its release, and
/// the other slot's rules (its empty queue too) are pending until then.
fn queues_in_two_places() -> (Vec<Rule>, Vec<Op>) {
    let rules = vec![
        Rule::leaky_bucket("q", 5, rate_ms(1, 100)),
        Rule::leaky_bucket("tq", 5, rate_ms(1, 100)),
        Rule::fixed_window("tfw", 1, MS * 1000),
    ];
    use Op::*;
    let ops = vec![
        Check(900, vec![(0, "a", 1, false)], 0),
        Check(
            950,
            vec![(0, "a", 1, false), (1, "t", 1, false), (2, "t", 1, false)],
            0,
        ),
        Check(1000, vec![(2, "t", 1, false)], 0),
        Confirm(1000, 1),
        Check(1020, vec![(1, "t", 1, false), (0, "b", 1, false)], 0),
        Check(
            1030,
            vec![(1, "t", 2, false), (0, "b", 1, false), (2, "u", 1, false)],
            0,
        ),
        Confirm(1200, 5),
    ];
    (rules, ops)
}

/// [`queues_in_two_places`] on MemoryStore and a Redis server: the same answers.
#[tokio::test(start_paused = true)]
async fn queues_in_two_places_leave_the_other_rules_pending() {
    let (rules, ops) = queues_in_two_places();
    same("two queues", MS, &rules, &ops).await;
}

/// [`queues_in_two_places`] on MemoryStore and a Redis Cluster: the same answers.
#[tokio::test(start_paused = true)]
async fn queues_in_two_places_leave_the_other_rules_pending_on_cluster() {
    let (rules, ops) = queues_in_two_places();
    same_on_cluster("two queues (cluster)", MS, &rules, &ops).await;
}

/// [`shaped_with_shared_rules`] on MemoryStore and a Redis Cluster: the same answers.
#[tokio::test(start_paused = true)]
async fn shaped_requests_with_shared_rules_confirmed_at_release_on_cluster() {
    let (rules, ops) = shaped_with_shared_rules();
    same_on_cluster("shaped (cluster)", MS, &rules, &ops).await;
}

fn rate(amount: u64, us: u64) -> Rate {
    Rate::new(amount, US * us as u32)
}

fn rate_ms(amount: u64, ms: u64) -> Rate {
    Rate::new(amount, MS * ms as u32)
}

/// GCRA at a rate with a fraction of a µs per unit: cancelled reservations give back
/// (or keep, behind a later one) the same units on both stores.
#[tokio::test(start_paused = true)]
async fn gcra_refunds_with_fractions() {
    let rules = [Rule::gcra("g", 2, rate(3, 5))];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "k", 1, false)], 0),
        Check(0, vec![(0, "k", 1, false)], 0),
        Check(0, vec![(0, "k", 1, false)], 100),
        Check(0, vec![(0, "k", 2, false)], 100),
        Refund(1, 2),
        Check(1, vec![(0, "k", 1, false)], 100),
        Refund(1, 3),
        Check(2, vec![(0, "k", 1, false)], 100),
        Check(2, vec![(0, "k", 1, false)], 100),
    ];
    same("gcra", US, &rules, &ops).await;
}

/// A sliding log gives back a reservation's entries amid later entries and after
/// pruning, alike on both stores.
#[tokio::test(start_paused = true)]
async fn sliding_log_refunds_amid_later_entries_and_pruning() {
    let rules = [Rule::sliding_log("l", 3, US * 100)];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "k", 1, false)], 0),
        Check(10, vec![(0, "k", 2, false)], 0),
        Check(20, vec![(0, "k", 1, false)], 500),
        Check(30, vec![(0, "k", 1, false)], 500),
        Refund(40, 2),
        Check(50, vec![(0, "k", 1, false)], 500),
        Check(150, vec![(0, "k", 1, false)], 500),
        Refund(150, 3),
        Check(160, vec![(0, "k", 3, false)], 500),
        Check(400, vec![(0, "k", 1, false)], 0),
    ];
    same("sliding log", US, &rules, &ops).await;
}

/// A leaky bucket reconfigured between two drain rates (its level carried over) behind
/// another queue's release: a cancelled reservation gives back alike on both stores.
#[tokio::test(start_paused = true)]
async fn carried_leaky_bucket_behind_another_release() {
    let rules = [
        Rule::leaky_bucket("queue", 10, rate(1, 100)),
        Rule::leaky_bucket("shaper", 10, rate(1, 200)),
        Rule::leaky_bucket("shaper", 10, rate(1, 100)),
        Rule::fixed_window("window", 2, US * 1000),
    ];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "k", 6, false)], 0),
        Check(0, vec![(1, "k", 5, false)], 0),
        Check(
            0,
            vec![(0, "k", 1, false), (2, "k", 1, false), (3, "k", 1, false)],
            0,
        ),
        Refund(10, 2),
        Check(
            20,
            vec![(0, "k", 1, false), (2, "k", 1, false), (3, "k", 1, false)],
            0,
        ),
        Check(30, vec![(2, "k", 1, false)], 0),
    ];
    same("carried leaky bucket", US, &rules, &ops).await;
}

/// A leaky bucket on trial beside a waiting GCRA: what the trial item took goes back
/// with the reservation, alike on both stores.
#[tokio::test(start_paused = true)]
async fn shadow_leaky_bucket_behind_a_reservation() {
    let rules = [
        Rule::gcra("g", 1, rate(1, 100)),
        Rule::leaky_bucket("lb", 3, rate(1, 50)),
    ];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "k", 1, false), (1, "k", 2, true)], 0),
        Check(1, vec![(0, "k", 1, false), (1, "k", 1, true)], 500),
        Check(2, vec![(1, "k", 1, false)], 0),
        Refund(3, 1),
        Check(4, vec![(1, "k", 1, false)], 0),
        Check(5, vec![(0, "k", 1, false), (1, "k", 3, true)], 500),
        Refund(6, 5),
        Check(7, vec![(1, "k", 1, false)], 0),
    ];
    same("shadow leaky bucket", US, &rules, &ops).await;
}

/// A reservation cancelled after its rule was reconfigured (and used) in between gives
/// back the same on both stores.
#[tokio::test(start_paused = true)]
async fn refund_after_a_reconfiguration_in_between() {
    let rules = [
        Rule::token_bucket("b", 4, rate(1, 100)),
        Rule::token_bucket("b", 5, rate(1, 100)),
        Rule::leaky_bucket("q", 4, rate(1, 100)),
        Rule::leaky_bucket("q", 5, rate(1, 100)),
    ];
    use Op::*;
    let ops = [
        Check(0, vec![(0, "k", 4, false)], 0),
        Check(0, vec![(0, "k", 1, false)], 1000),
        Check(1, vec![(1, "k", 1, false)], 1000),
        Check(2, vec![(0, "k", 1, false)], 1000),
        Refund(3, 1),
        Check(4, vec![(0, "k", 1, false)], 1000),
        Check(0, vec![(2, "k", 3, false)], 0),
        Check(10, vec![(3, "k", 1, false)], 0),
        Check(20, vec![(2, "k", 1, false)], 0),
        Refund(30, 8),
        Check(40, vec![(2, "k", 1, false)], 0),
    ];
    same("reconfigured refunds", US, &rules, &ops).await;
}

/// A denied cross-slot batch with a queue: the rules of the other slots are judged where
/// one node judges them, at the queue's release, whether the queue itself denies or a rule
/// pending to its release does. So the batch's Retry-After is the exact wait (a retry
/// then is admitted), and each rule reports what it says there.
#[tokio::test(start_paused = true)]
async fn a_denied_cross_slot_batch_retries_after_the_queues_release() {
    let rules = [
        Rule::leaky_bucket("q", 3, rate(1, 100)),
        Rule::fixed_window("w", 1, US * 200),
        Rule::sliding_log("l", 1, US * 1000),
    ];
    use Op::*;
    let ops = [
        // 0, 1: a's queue is full until 300; the window on "all" is full until 200.
        Check(0, vec![(0, "a", 3, false)], 0),
        Check(0, vec![(1, "all", 1, false)], 0),
        // 2: a's queue has room again at 100 and releases at 300, in the window's next
        // one: the batch waits for the queue alone.
        Check(50, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
        // 3: and is admitted then.
        Check(100, vec![(0, "a", 1, false), (1, "all", 1, false)], 0),
        // 4, 5, 6: the window on "x" and the log on "m" are full; b's queue releases at 300.
        Check(100, vec![(1, "x", 1, false)], 0),
        Check(100, vec![(2, "m", 1, false)], 0),
        Check(100, vec![(0, "b", 2, false)], 0),
        // 7: the log denies at b's release; the window on "x" admits there.
        Check(
            100,
            vec![(0, "b", 1, false), (2, "m", 1, false), (1, "x", 1, false)],
            0,
        ),
    ];
    same_on_cluster("denied cross-slot", US, &rules, &ops).await;
}

/// A refund too late for its window (the state has moved two windows on) gives nothing
/// back on both stores, and leaves what another configuration of the rule reads as it was.
#[tokio::test(start_paused = true)]
async fn a_late_refund_leaves_what_another_configuration_reads() {
    let ms = Duration::from_millis;
    let rules = [
        Rule::sliding_window("sw", 5, ms(100)),
        Rule::sliding_window("sw", 3, ms(100)),
        Rule::fixed_window("fw", 5, ms(100)),
        Rule::fixed_window("fw", 3, ms(100)),
    ];
    use Op::*;
    let ops = [
        Check(10, vec![(0, "k", 1, false)], 0),
        Check(150, vec![(0, "k", 3, false)], 0),
        Check(250, vec![(0, "k", 1, false)], 0),
        Refund(290, 0),
        Check(295, vec![(1, "k", 1, false)], 0),
        Check(10, vec![(2, "j", 1, false)], 0),
        Check(150, vec![(2, "j", 2, false)], 0),
        Refund(160, 5),
        Check(170, vec![(3, "j", 2, false)], 0),
    ];
    same("late refunds", MS, &rules, &ops).await;
}

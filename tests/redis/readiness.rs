//! Readiness recovers on its own: after Redis comes back, a limiter over
//! `Fallback<Breaker<RedisStore>>` reports healthy within the breaker's probe interval
//! with no request at all, only its health polled (as a `/ready` endpoint does).

use std::time::{Duration, Instant};

use crate::support::redis_server::RedisServer;
use tollgate::store::{Breaker, Fallback, Health, RedisStore};
use tollgate::{Limiter, Rule};

const TIMEOUT: Duration = Duration::from_millis(100);
const OPEN_FOR: Duration = Duration::from_millis(500);

/// `CLIENT PAUSE` (what the `ready` example tells users to try; Redis 7 refuses `DEBUG
/// SLEEP` by default) degrades the limiter; once the pause ends, polling `health` alone
/// brings it back within `open_for` plus the probe's round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_recovers_with_no_traffic_once_redis_answers_again() {
    let server = RedisServer::start();
    let redis = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_timeout(TIMEOUT);
    let limiter = Limiter::new(Fallback::new(
        Breaker::new(redis).failures(1).open_for(OPEN_FOR),
    ));
    let rule = Rule::fixed_window("ready", 100, Duration::from_secs(60));
    assert_eq!(limiter.health(), Health::Healthy);

    let pause = Duration::from_millis(1500);
    server.must(&["CLIENT", "PAUSE", &pause.as_millis().to_string(), "ALL"]);
    let paused = Instant::now();
    // One request times out on Redis, opens the breaker and is decided locally.
    let outcome = limiter
        .check_one(&rule, b"k")
        .await
        .expect("decided locally");
    assert!(outcome.is_admitted());
    assert_eq!(limiter.health(), Health::Degraded);

    // No request from here on: only polls, every 20 ms.
    let mut last_degraded = paused;
    while limiter.health() != Health::Healthy {
        last_degraded = Instant::now();
        assert!(
            paused.elapsed() < pause + Duration::from_secs(5),
            "still {:?} {:?} after the pause ended",
            limiter.health(),
            paused.elapsed().saturating_sub(pause)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after_pause = last_degraded.saturating_duration_since(paused + pause);
    assert!(
        after_pause <= OPEN_FOR + TIMEOUT + Duration::from_millis(300),
        "healthy {after_pause:?} after the pause ended"
    );
    // Redis decides again (a fresh key: the timed-out call may have run once the pause
    // ended, as the store's docs say).
    let outcome = limiter.check_one(&rule, b"fresh").await.expect("decided");
    assert_eq!(outcome.rules[0].info.remaining, 99);
    assert_eq!(
        server.must(&["EXISTS", "tollgate:{fresh}:ready"]).trim(),
        "1"
    );
}

/// Polls `limiter`'s health every 20 ms, with no request, until it is healthy; how long
/// that took. Gives up after 10 s: a limiter that stays degraded with Redis answering fails.
async fn polled_until_healthy<S: tollgate::store::Store>(limiter: &Limiter<S>) -> Duration {
    let from = Instant::now();
    while limiter.health() != Health::Healthy {
        assert!(
            from.elapsed() < Duration::from_secs(10),
            "still {} with Redis answering and no request",
            limiter.health()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    from.elapsed()
}

/// An outage shorter than the breaker's threshold (one request failed of the three that
/// open it) degrades the limiter, and readiness still recovers by itself once Redis answers
/// again, whether Redis froze (the request timed out) or restarted (the connection broke):
/// the breaker never opened, so the fallback probes Redis itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_recovers_after_fewer_failures_than_open_the_breaker() {
    let mut server = RedisServer::start();
    let redis = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_timeout(TIMEOUT);
    let limiter = Limiter::new(Fallback::new(Breaker::new(redis).open_for(OPEN_FOR)));
    let rule = Rule::fixed_window("ready", 100, Duration::from_secs(60));
    assert!(limiter
        .check_one(&rule, b"k")
        .await
        .expect("decided")
        .is_admitted());

    for outage in ["frozen", "restarted"] {
        match outage {
            "frozen" => server.pause(),
            _ => server.kill(),
        }
        let outcome = limiter
            .check_one(&rule, b"k")
            .await
            .expect("decided locally");
        assert!(outcome.is_admitted());
        assert_eq!(limiter.health(), Health::Degraded, "{outage}");
        match outage {
            "frozen" => server.resume(),
            _ => server.restart(),
        }
        let took = polled_until_healthy(&limiter).await;
        eprintln!("{outage}: healthy {took:?} after Redis answered again");
        // Redis decides again.
        let fresh = format!("fresh-{outage}");
        let outcome = limiter.check_one(&rule, &fresh).await.expect("decided");
        assert_eq!(outcome.rules[0].info.remaining, 99, "{outage}");
        let key = format!("tollgate:{{{fresh}}}:ready");
        assert_eq!(server.must(&["EXISTS", &key]).trim(), "1", "{outage}");
    }
}

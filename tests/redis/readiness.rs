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

//! RedisStore against a real redis-server started by the test: the shared vectors, script
//! reloads, one script call per batch, key hygiene, peek / reset, and failures as values.

use std::time::Duration;

use crate::support::redis_server::{RedisCluster, RedisServer};
use crate::support::vectors::{load_all, run_on_store, BASE_MICROS};
use tollgate::{
    store::{RedisOptions, RedisStore, Store},
    Check, Decision, DenyReason, Limiter, ManualClock, Penalty, Rate, Rule, StoreError,
};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .expect("connect to the test redis-server")
}

async fn prefixed(url: &str, prefix: &str) -> RedisStore {
    RedisStore::connect_with(url, RedisOptions::new().prefix(prefix))
        .await
        .expect("connect to the test redis-server")
}

/// Every shared vector scenario on a store of `url` with `options`, each under its own key
/// prefix and clock.
async fn run_all_vectors(url: &str, options: RedisOptions) {
    let all = load_all();
    assert!(all.len() >= 60, "only {} scenarios", all.len());
    for (n, (file, scenario)) in all.iter().enumerate() {
        let options = options.clone().prefix(format!("v{n}"));
        let store = RedisStore::connect_with(url, options)
            .await
            .expect("connect");
        run_on_store(file, scenario, |clock| store.with_clock(clock)).await;
    }
}

/// Every shared test vector holds for a standalone Redis.
#[tokio::test]
async fn vectors_hold_for_redis_standalone() {
    let server = RedisServer::start();
    run_all_vectors(&server.url(), RedisOptions::new()).await;
}

/// The script route (`EVALSHA`), forced where functions are available: the fallback for
/// servers before Redis 7 and users allowed scripts only.
#[tokio::test]
async fn vectors_hold_for_redis_standalone_through_the_script() {
    let server = RedisServer::start();
    server.must(&["CONFIG", "RESETSTAT"]);
    run_all_vectors(&server.url(), RedisOptions::new().functions(false)).await;
    assert_eq!(server.calls("fcall"), 0);
    assert!(server.calls("evalsha") > 0);
}

/// Every shared test vector holds for a Redis cluster.
#[tokio::test]
async fn vectors_hold_for_redis_cluster() {
    let cluster = RedisCluster::start();
    run_all_vectors(&cluster.url(), RedisOptions::new()).await;
}

/// A script flush between requests is invisible: the script reloads and the count is kept.
#[tokio::test]
async fn script_flush_between_requests_is_invisible() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server).await);
    let rule = Rule::fixed_window("flush", 3, Duration::from_secs(60));
    assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    assert_eq!(server.must(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let outcome = limiter
        .check_one(&rule, b"k")
        .await
        .expect("reloaded on NOSCRIPT");
    assert!(outcome.is_admitted());
    assert_eq!(outcome.rules[0].info.remaining, 1);
}

/// `FUNCTION FLUSH` (or a restart) loses the library: the next call finds it missing, loads
/// it again and is decided, invisibly; `FLUSHALL` keeps functions but drops the state.
#[tokio::test]
async fn function_flush_between_requests_is_invisible() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server).await);
    let rule = Rule::fixed_window("flush", 3, Duration::from_secs(60));
    assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    assert!(
        server.calls("fcall") > 0,
        "Redis 7 takes the function library"
    );
    assert_eq!(server.must(&["FUNCTION", "FLUSH"]).trim(), "OK");
    let outcome = limiter
        .check_one(&rule, b"k")
        .await
        .expect("reloaded when the function was not found");
    assert!(outcome.is_admitted());
    assert_eq!(outcome.rules[0].info.remaining, 1);
    assert_eq!(server.calls("evalsha"), 0, "still through FCALL");
    assert_eq!(server.must(&["FUNCTION", "FLUSH"]).trim(), "OK");
    assert_eq!(server.must(&["FLUSHALL"]).trim(), "OK");
    let outcome = limiter.check_one(&rule, b"k").await.expect("reloaded");
    assert_eq!(outcome.rules[0].info.remaining, 2);
}

/// Many requests at once on one store go out in fewer calls than requests (coalesced), and
/// each is still decided exactly: a limit of 100 over 400 concurrent requests admits 100.
/// A request whose batch fails inside Redis (its key holds a set, not tollgate's state)
/// fails alone; the requests coalesced with it are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_requests_are_each_decided_and_an_error_fails_only_its_own() {
    let server = RedisServer::start();
    let limiter = Limiter::new(prefixed(&server.url(), "c").await);
    let rule = std::sync::Arc::new(Rule::fixed_window("w", 100, Duration::from_secs(60)));
    // A key whose state is a set: the script's GET of it fails (WRONGTYPE).
    server.must(&["SADD", "c:{bad}:w", "x"]);
    server.must(&["CONFIG", "RESETSTAT"]);
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let (limiter, rule) = (limiter.clone(), rule.clone());
        tasks.push(tokio::spawn(async move {
            let key: &[u8] = if i % 10 == 0 { b"bad" } else { b"hot" };
            limiter.check_one(&rule, key).await
        }));
    }
    let (mut admitted, mut denied, mut failed) = (0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(o) if o.is_admitted() => admitted += 1,
            Ok(_) => denied += 1,
            Err(StoreError::Unavailable(m)) => {
                assert!(m.contains("WRONGTYPE"), "{m}");
                failed += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((admitted, denied, failed), (100, 260, 40));
    let calls = server.script_calls();
    assert!(
        calls < 400,
        "{calls} calls for 400 requests: nothing coalesced"
    );
    let peek = limiter.peek(&rule, b"hot", 0).await.unwrap();
    assert_eq!(peek.info.remaining, 0);

    // The same without coalescing: one call per request.
    let single = Limiter::new(prefixed(&server.url(), "s").await.with_coalescing(false));
    server.must(&["CONFIG", "RESETSTAT"]);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (single, rule) = (single.clone(), rule.clone());
        tasks.push(tokio::spawn(async move {
            single.check_one(&rule, b"hot").await
        }));
    }
    for task in tasks {
        assert!(task.await.unwrap().unwrap().is_admitted());
    }
    assert_eq!(server.script_calls(), 50);
}

/// A batch of several rules on one key is one script call.
#[tokio::test]
async fn a_batch_of_three_rules_is_one_script_call() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server).await);
    let minute = Rule::fixed_window("m", 100, Duration::from_secs(60));
    let log = Rule::sliding_log("l", 100, Duration::from_secs(60));
    let bucket = Rule::token_bucket("b", 100, Rate::per_second(10));
    server.must(&["CONFIG", "RESETSTAT"]);
    const N: u64 = 25;
    for i in 0..N {
        let key = format!("user-{}", i % 5);
        let batch = [
            Check::new(&minute, key.as_bytes()),
            Check::new(&log, key.as_bytes()),
            Check::new(&bucket, key.as_bytes()),
        ];
        assert!(limiter.check(&batch).await.unwrap().is_admitted());
    }
    assert_eq!(server.script_calls(), N, "one script call per request");
    assert_eq!(server.calls("eval"), 0);
}

/// Redis keys follow the documented layout, the user's key escaped inside its hash tag, and
/// every key expires.
#[tokio::test]
async fn keys_carry_ttls_and_the_documented_layout() {
    let server = RedisServer::start();
    let limiter = Limiter::new(prefixed(&server.url(), "app").await);
    let window = Rule::fixed_window("w", 5, Duration::from_secs(60));
    let log = Rule::sliding_log("log", 5, Duration::from_secs(10));
    let key: &[u8] = b"\xfe\xff{odd}";
    limiter
        .check(&[Check::new(&window, key), Check::new(&log, key)])
        .await
        .unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.sort();
    // A sliding log keeps its entries in `…/log` and its fingerprint in the rule's key.
    let expected: Vec<Vec<u8>> = vec![
        b"app:{\xfe\xff\\[odd\\]}:log".to_vec(),
        b"app:{\xfe\xff\\[odd\\]}:log/log".to_vec(),
        b"app:{\xfe\xff\\[odd\\]}:w".to_vec(),
    ];
    assert_eq!(keys, expected);
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{key:?}: pttl {ttl}");
    }
}

/// A sliding log in Redis counts every request, even several in one microsecond.
#[tokio::test]
async fn sliding_log_keeps_two_requests_in_one_microsecond() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = Limiter::new(store(&server).await.with_clock(clock.clone()));
    let rule = Rule::sliding_log("sl", 3, Duration::from_secs(1));
    for remaining in [2, 1, 0] {
        let outcome = limiter.check_one(&rule, b"k").await.unwrap();
        assert_eq!(outcome.decision, Decision::Allow);
        assert_eq!(outcome.rules[0].info.remaining, remaining);
    }
    let outcome = limiter.check_one(&rule, b"k").await.unwrap();
    assert!(
        !outcome.is_admitted(),
        "three admissions in one µs all count"
    );
}

/// A peek consumes nothing, and a reset lifts a penalty lock.
#[tokio::test]
async fn peek_consumes_nothing_and_reset_lifts_a_lock() {
    let server = RedisServer::start();
    let clock = ManualClock::new(BASE_MICROS);
    let limiter = Limiter::new(store(&server).await.with_clock(clock.clone()));
    let rule = Rule::fixed_window("login", 1, Duration::from_secs(60))
        .with_penalty(Penalty::lock_for(Duration::from_secs(600)));
    for _ in 0..3 {
        let peek = limiter.peek(&rule, b"eve", 1).await.unwrap();
        assert_eq!(peek.decision, Decision::Allow);
        assert_eq!(peek.info.remaining, 0, "what would remain after it");
    }
    assert!(limiter
        .check_one(&rule, b"eve")
        .await
        .unwrap()
        .is_admitted());
    let denied = limiter.check_one(&rule, b"eve").await.unwrap();
    let denial = denied.decision.denial().copied().expect("denied");
    assert_eq!(denial.reason, DenyReason::Locked);
    assert_eq!(denial.retry_after, Some(Duration::from_secs(600)));
    clock.advance(Duration::from_secs(120));
    let locked = limiter.check_one(&rule, b"eve").await.unwrap();
    assert_eq!(
        locked.decision.denial().map(|d| (d.reason, d.retry_after)),
        Some((DenyReason::Locked, Some(Duration::from_secs(480))))
    );
    limiter.reset(&rule, b"eve").await.unwrap();
    assert!(limiter
        .check_one(&rule, b"eve")
        .await
        .unwrap()
        .is_admitted());
}

/// Without a clock, Redis decides on the server's own time.
#[tokio::test]
async fn server_time_is_used_without_a_clock() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server).await);
    let rule = Rule::gcra("g", 1, Rate::per_second(1));
    let first = std::time::Instant::now();
    assert!(limiter.check_one(&rule, b"k").await.unwrap().is_admitted());
    let denied = limiter.check_one(&rule, b"k").await.unwrap();
    let between = first.elapsed();
    let retry = denied
        .decision
        .denial()
        .and_then(|d| d.retry_after)
        .unwrap();
    // The server's clock moved by at most the time between the two calls.
    assert!(retry <= Duration::from_secs(1), "{retry:?}");
    assert!(
        retry + between >= Duration::from_secs(1),
        "{retry:?} + {between:?}"
    );
}

/// An unreachable or vanished Redis is an error within the timeout, never a panic.
#[tokio::test]
async fn an_unreachable_redis_is_an_error_not_a_panic() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .expect_err("nobody listens");
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout),
        "{err:?}"
    );

    // A store whose server goes away answers errors, within its timeout.
    let server = RedisServer::start();
    let store = store(&server)
        .await
        .with_timeout(Duration::from_millis(500));
    let rule = Rule::fixed_window("f", 1, Duration::from_secs(1));
    drop(server);
    let started = std::time::Instant::now();
    let err = store
        .check(&[Check::new(&rule, b"k")], Duration::ZERO)
        .await
        .expect_err("the server is gone");
    assert!(
        matches!(err, StoreError::Unavailable(_) | StoreError::Timeout),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(store.peek(Check::new(&rule, b"k")).await.is_err());
    assert!(store
        .reset(&rule, &tollgate::StoredKey::of(b"k"))
        .await
        .is_err());
}

/// Rule names may contain `:`, so a sliding log's second key must not be spellable as
/// another rule's key: a log "api" and a rule "api:log" keep their own state.
#[tokio::test]
async fn a_sliding_log_does_not_share_a_key_with_another_rule() {
    let server = RedisServer::start();
    let limiter = Limiter::new(store(&server).await);
    let log = Rule::sliding_log("api", 1, Duration::from_secs(60));
    let window = Rule::fixed_window("api:log", 2, Duration::from_secs(60));
    assert!(limiter.check_one(&log, b"k").await.unwrap().is_admitted());
    let outcome = limiter
        .check_one(&window, b"k")
        .await
        .expect("each rule has its own key");
    assert!(outcome.is_admitted());
    assert_eq!(outcome.rules[0].info.remaining, 1);
    let both = [Check::new(&log, b"k"), Check::new(&window, b"k")];
    let outcome = limiter
        .check(&both)
        .await
        .expect("each rule has its own key");
    assert!(!outcome.is_admitted(), "the log's limit of 1 is used");
    assert_eq!(outcome.rules[1].info.remaining, 1);
}

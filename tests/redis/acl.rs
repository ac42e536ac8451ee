//! The ACL a deployment needs, as the Redis guide writes it: the store works under exactly
//! that user (every algorithm, resets, the deny cache with `+subscribe`), and a user missing
//! any one of its permissions is refused at `connect`, naming the permission (and only
//! permissions the guide's line has, or adds for a deployment), through Sentinel too.

use std::time::Duration;

use crate::support::redis_ha::SentinelGroup;
use crate::support::redis_server::RedisServer;
use tollgate::store::{RedisOptions, RedisStore};
use tollgate::{Limiter, Penalty, Rate, Rule};

/// The ACL line of `src/guide/redis_instances.rs`, its words after the user name.
fn documented_acl() -> Vec<String> {
    let guide = include_str!("../../src/guide/redis_instances.rs");
    let line = guide
        .lines()
        .map(|l| l.trim_start_matches("//!").trim())
        .find(|l| l.starts_with("ACL SETUSER tollgate "))
        .expect("the guide writes the ACL");
    line.split_whitespace().skip(3).map(str::to_owned).collect()
}

/// Creates `user` with `rules` (the password `>CHANGE-ME` made `>secret`) plus `extra`.
fn set_user(server: &RedisServer, user: &str, rules: &[String], extra: &[&str]) -> String {
    let mut args = vec!["ACL", "SETUSER", user, "reset"];
    let rules: Vec<String> = rules
        .iter()
        .map(|r| {
            if r.starts_with('>') {
                ">secret".into()
            } else {
                r.clone()
            }
        })
        .collect();
    args.extend(rules.iter().map(String::as_str));
    args.extend_from_slice(extra);
    server.must(&args);
    format!("redis://{user}:secret@127.0.0.1:{}/", server.port)
}

/// One rule of each algorithm, a penalty, a sliding log, a reset and the deny cache, all
/// under the documented user.
#[tokio::test]
async fn the_documented_acl_is_enough() {
    let server = RedisServer::start();
    let acl = documented_acl();
    assert!(acl.contains(&"~tollgate:*".to_owned()), "{acl:?}");
    let url = set_user(&server, "tollgate", &acl, &["+subscribe"]);
    let store = RedisStore::connect(&url)
        .await
        .expect("connect under the documented ACL")
        .with_deny_cache(100)
        .await
        .expect("the deny cache with +subscribe");
    let limiter = Limiter::new(store);
    let minute = Duration::from_secs(60);
    let rules = [
        Rule::fixed_window("fw", 1, minute),
        Rule::sliding_log("sl", 1, minute),
        Rule::sliding_window("sw", 1, minute),
        Rule::token_bucket("tb", 1, Rate::per_minute(1)),
        Rule::leaky_bucket("lb", 1, Rate::per_minute(1)),
        Rule::gcra("gc", 1, Rate::per_minute(1)),
        Rule::fixed_window("pen", 1, minute).with_penalty(Penalty::lock_for(minute)),
    ];
    for rule in &rules {
        let first = limiter.check_one(rule, b"k").await.expect("decide");
        let second = limiter.check_one(rule, b"k").await.expect("decide");
        assert!(
            first.is_admitted() && !second.is_admitted(),
            "{}",
            rule.name()
        );
        limiter.reset(rule, b"k").await.expect("reset");
        let again = limiter.check_one(rule, b"k").await.expect("decide");
        assert!(again.is_admitted(), "{} after reset", rule.name());
    }
    assert_eq!(server.calls("fcall"), 0, "no +fcall: the script runs");
}

/// Each permission of the documented ACL, taken away alone, is an error at `connect` that
/// names it; without `+subscribe`, the deny cache's error names it; a prefix of one's own
/// is checked when given to `connect`.
#[tokio::test]
async fn a_user_missing_any_permission_is_refused_naming_it() {
    let server = RedisServer::start();
    let acl = documented_acl();
    let needed: Vec<&String> = acl
        .iter()
        .filter(|r| r.starts_with(['+', '~', '&']))
        .collect();
    assert!(needed.len() >= 18, "{needed:?}");
    for (i, missing) in needed.iter().enumerate() {
        let rules: Vec<String> = acl.iter().filter(|r| r != missing).cloned().collect();
        let url = set_user(&server, &format!("u{i}"), &rules, &[]);
        let msg = match RedisStore::connect(&url).await {
            Ok(store) => panic!("connected without {missing}: {store:?}"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(missing.as_str()), "without {missing}: {msg}");
        assert!(!msg.contains("secret"), "{msg}");
        assert_grants_only_the_guides(&msg, &acl);
    }

    let url = set_user(&server, "nosub", &acl, &[]);
    let store = RedisStore::connect(&url).await.expect("connect");
    let msg = match store.with_deny_cache(10).await {
        Ok(store) => panic!("subscribed without +subscribe: {store:?}"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("+subscribe"), "{msg}");

    // The prefix given to connect is the one checked.
    let mine: Vec<String> = acl
        .iter()
        .map(|r| r.replace("tollgate:", "mine:"))
        .collect();
    let url = set_user(&server, "mine", &mine, &[]);
    let msg = RedisStore::connect(&url)
        .await
        .expect_err("tollgate:* is not granted");
    assert!(msg.to_string().contains("~tollgate:*"), "{msg}");
    let store = RedisStore::connect_with(&url, RedisOptions::new().prefix("mine"))
        .await
        .expect("connect with the granted prefix");
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
    let outcome = Limiter::new(store)
        .check_one(&rule, b"k")
        .await
        .expect("decide");
    assert!(outcome.is_admitted());
    assert_eq!(server.must(&["EXISTS", "mine:{k}:r"]).trim(), "1");
}

/// Every `+permission` that `msg` tells to grant is one of the guide's: its line's, or one
/// the guide adds for a deployment (functions, Sentinel, Cluster, the deny cache, `INFO`).
fn assert_grants_only_the_guides(msg: &str, acl: &[String]) {
    let added = [
        "+fcall",
        "+function|load",
        "+role",
        "+cluster|slots",
        "+subscribe",
        "+info",
    ];
    for word in msg.split(|c: char| c.is_whitespace() || "(),;".contains(c)) {
        if word.starts_with('+') && word.len() > 1 {
            assert!(
                acl.iter().any(|a| a == word) || added.contains(&word),
                "{word} is not in the guide: {msg}"
            );
        }
    }
}

/// Through Sentinel, the guide's line plus `+role` (which the guide adds for Sentinel) is
/// enough, and without `+role` the error names it, not the scripting commands.
#[tokio::test]
async fn through_sentinel_a_missing_role_is_named() {
    let group = SentinelGroup::start(None);
    let primary = &group.servers[group.primary().expect("a primary")];
    let acl = documented_acl();
    let url = |user: &str| group.url().replace("://", &format!("://{user}:secret@"));
    set_user(primary, "norole", &acl, &[]);
    let msg = RedisStore::connect(&url("norole"))
        .await
        .expect_err("ROLE is denied")
        .to_string();
    assert!(msg.contains("+role"), "{msg}");
    assert!(!msg.contains("EVALSHA"), "{msg}");
    assert_grants_only_the_guides(&msg, &acl);

    set_user(primary, "withrole", &acl, &["+role"]);
    let store = RedisStore::connect(&url("withrole"))
        .await
        .expect("the guide's line and +role");
    let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
    let outcome = Limiter::new(store).check_one(&rule, b"k").await;
    assert!(outcome.expect("decide").is_admitted());
}

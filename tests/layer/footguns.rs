//! Configurations that cannot do what they say are refused when the layer is built, and
//! the message names the fix.

use std::time::Duration;

use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, store::MemoryStore, Penalty, Rule};

fn layer_with(limit: Limit) -> tollgate::layer::RateLimitLayerBuilder<MemoryStore> {
    RateLimitLayer::builder().limit(limit)
}

fn minute() -> Rule {
    Rule::fixed_window("login", 5, Duration::from_secs(60))
}

/// Trusting every address as a proxy lets every client choose its own key.
#[test]
fn trusting_every_address_is_refused() {
    for everyone in ["0.0.0.0/0", "::/0"] {
        let error = layer_with(Limit::new(minute(), key::client_ip([everyone])))
            .build()
            .unwrap_err()
            .to_string();
        assert!(error.contains(everyone), "{error}");
        assert!(error.contains("your proxies"), "{error}");
        assert!(error.contains("allow_trusting_everyone"), "{error}");
    }
}

/// Where nothing but the proxy reaches the service, trusting every peer is allowed when
/// asked for by name.
#[test]
fn trusting_every_address_is_allowed_by_name() {
    for everyone in ["0.0.0.0/0", "::/0"] {
        let key = key::client_ip([everyone]).allow_trusting_everyone();
        assert!(layer_with(Limit::new(minute(), key)).build().is_ok());
    }
}

/// A penalty that locks for no time never locks.
#[test]
fn a_penalty_that_locks_for_zero_is_refused() {
    let rule = minute().with_penalty(Penalty::lock_for(Duration::ZERO));
    let error = layer_with(Limit::new(rule, key::global()))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("\"login\""), "{error}");
    assert!(error.contains("lock_for"), "{error}");
}

/// A layer that may hold no request refuses every delayed one.
#[test]
fn holding_no_request_is_refused() {
    for builder in [
        layer_with(Limit::new(minute(), key::global())).max_held(0),
        layer_with(Limit::new(minute(), key::global())).max_held_per_key(0),
    ] {
        let error = builder.build().unwrap_err().to_string();
        assert!(error.contains("max_held"), "{error}");
    }
}

/// Networks that together hold every address trust every address, as one network of them
/// would: refused, unless allowed by name.
#[test]
fn trusting_every_address_in_pieces_is_refused() {
    for pieces in [["0.0.0.0/1", "128.0.0.0/1"], ["::/1", "8000::/1"]] {
        let error = layer_with(Limit::new(minute(), key::client_ip(pieces)))
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(pieces[0]) && error.contains(pieces[1]),
            "{error}"
        );
        assert!(error.contains("every address"), "{error}");
        assert!(error.contains("allow_trusting_everyone"), "{error}");
        let allowed = key::client_ip(pieces).allow_trusting_everyone();
        assert!(layer_with(Limit::new(minute(), allowed)).build().is_ok());
    }
}

/// Networks that hold nearly every address trust more than any proxy tier has: all of
/// IPv4 but one address, all but `240.0.0.0/4`, half of it, all of global unicast IPv6
/// are refused, unless allowed by name; private networks and a CDN's ranges are taken.
#[test]
fn trusting_nearly_every_address_is_refused() {
    let all_but_one: Vec<String> = (1..=32u32)
        .map(|len| {
            let base = if len == 1 { 0 } else { u32::MAX << (33 - len) };
            format!("{}/{len}", std::net::Ipv4Addr::from(base))
        })
        .collect();
    let lists: [Vec<String>; 4] = [
        all_but_one,
        ["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4"]
            .map(String::from)
            .into(),
        vec!["2000::/3".to_owned()],
        vec!["0.0.0.0/1".to_owned()],
    ];
    for list in lists {
        let error = layer_with(Limit::new(minute(), key::client_ip(&list)))
            .build()
            .unwrap_err()
            .to_string();
        assert!(error.contains("more public addresses than"), "{error}");
        assert!(error.contains("allow_trusting_everyone"), "{error}");
        let allowed = key::client_ip(&list).allow_trusting_everyone();
        assert!(layer_with(Limit::new(minute(), allowed)).build().is_ok());
    }
    let proxies = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "104.16.0.0/13",
        "2606:4700::/32",
    ];
    let taken = key::client_ip(proxies);
    assert!(layer_with(Limit::new(minute(), taken)).build().is_ok());
}

/// A route whose method no client sends, or whose path is in axum 0.7's syntax, would run
/// unlimited: refused at build, with the pattern to write.
#[test]
fn a_route_that_cannot_mean_what_it_says_is_refused_with_the_fix() {
    for (pattern, fix) in [
        ("POTS /sms/send", "write \"POST\""),
        ("GET /files/:id", "write \"/files/{id}\""),
        ("/*rest", "write \"/{*rest}\""),
    ] {
        let error = RateLimitLayer::builder()
            .route(pattern, [Limit::new(minute(), key::global())])
            .build()
            .unwrap_err()
            .to_string();
        assert!(error.contains(pattern), "{error}");
        assert!(error.contains(fix), "{pattern}: {error}");
    }
}

/// `FailurePolicy::Fallback` over a store whose calls fail in an outage would let every
/// request of the outage through unlimited, with readiness saying healthy: refused, naming
/// the store to build. A store that falls back builds, and so does an in-process store,
/// which is never away (an app generic over its store, as the quickstart is).
#[test]
fn a_fallback_policy_over_a_store_without_a_fallback_is_refused() {
    use tollgate::layer::FailurePolicy;
    use tollgate::store::{Breaker, Fallback};
    use tollgate::Limiter;

    use crate::support::down::Down;

    let limit = || Limit::new(minute(), key::header("user"));
    let with_policy = |policy| {
        let down = RateLimitLayer::builder()
            .limiter(Limiter::new(Down))
            .limit(limit())
            .on_failure(policy)
            .build()
            .map(drop);
        let breaker = RateLimitLayer::builder()
            .limiter(Limiter::new(Breaker::new(Down)))
            .limit(limit())
            .on_failure(policy)
            .build()
            .map(drop);
        [down, breaker]
    };
    for error in with_policy(FailurePolicy::Fallback) {
        let error = error.unwrap_err().to_string();
        assert!(error.contains("FailurePolicy::Fallback"), "{error}");
        assert!(error.contains("store::Fallback::new("), "{error}");
    }
    // The other policies need no fallback.
    for policy in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
        for built in with_policy(policy) {
            assert!(built.is_ok(), "{policy:?}: {:?}", built.err());
        }
    }
    let falls_back = Limiter::new(Fallback::new(Breaker::new(Down)));
    let built = layer_with(limit())
        .limiter(falls_back.clone())
        .on_failure(FailurePolicy::Fallback)
        .build();
    assert!(built.is_ok(), "{:?}", built.err());
    // A breaker around the fallback still falls back.
    let built = layer_with(limit())
        .limiter(Limiter::new(Breaker::new(falls_back.store().clone())))
        .on_failure(FailurePolicy::Fallback)
        .build();
    assert!(built.is_ok(), "{:?}", built.err());
    let in_process = layer_with(limit())
        .on_failure(FailurePolicy::Fallback)
        .build();
    assert!(in_process.is_ok(), "{:?}", in_process.err());
}

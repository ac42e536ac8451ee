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
    // Half of the addresses is a (wide) list of proxies, not everyone.
    let half = key::client_ip(["0.0.0.0/1", "::/1"]);
    assert!(layer_with(Limit::new(minute(), half)).build().is_ok());
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

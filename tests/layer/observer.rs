//! The seam a dashboard builds on: a `DecisionObserver` receives each rule's decision with
//! the key as the store keeps it (long keys as digests) and is kept across reloads;
//! `RateLimitLayer::rules` follows reloads. Tests that drive a layer run one at a time with
//! those of `observe`, whose span test counts spans (see there).
// Each test holds that lock to its end on purpose, awaits included (one thread each).
#![allow(clippy::await_holding_lock)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::layer::{DecisionEvent, DecisionObserver, Limit, Mode, RateLimitLayer};
use tollgate::{key, Penalty, Rate, Rule, StoredKey};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

type Svc = BoxCloneService<Request<String>, Response<String>, Infallible>;

fn service<St: tollgate::store::Store + Clone>(layer: &RateLimitLayer<St>) -> Svc {
    BoxCloneService::new(layer.layer(service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    })))
}

async fn send(svc: &Svc, user: &str) -> StatusCode {
    let request = Request::get("/")
        .header("user-id", user)
        .body(String::new())
        .unwrap();
    svc.clone().oneshot(request).await.unwrap().status()
}

/// What an observer saw: (rule, stored key, rule admitted, batch admitted, shadow).
type Seen = (String, Vec<u8>, bool, bool, bool);

#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl DecisionObserver for Recorder {
    fn on_decision(&self, event: &DecisionEvent<'_>) {
        for d in event.rules {
            self.0.lock().unwrap().push((
                d.rule.name().to_owned(),
                d.key.as_bytes().to_vec(),
                d.outcome.is_some_and(|o| o.decision.is_admitted()),
                d.batch_admitted,
                d.shadow,
            ));
        }
    }
}

impl Recorder {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A window from each user's first request: a window aligned to the clock could turn
/// between two requests of a test (a panic's backtrace takes a while) and forgive the first.
fn per_user(limit: u64) -> Limit {
    Limit::new(
        Rule::fixed_window_from_first_hit("per-user", limit, Duration::from_secs(60)),
        key::header("user-id"),
    )
}

fn audit() -> Limit {
    Limit::new(
        Rule::token_bucket("audit", 10, Rate::per_second(1)),
        key::header("user-id"),
    )
}

fn trial() -> Limit {
    Limit::new(
        Rule::gcra("trial", 1, Rate::per_minute(1)),
        key::header("user-id"),
    )
    .shadow()
}

/// Each rule of each request is observed with its name and the stored key; a key over 128
/// bytes arrives as its 33-byte digest; a rule that admits in a denied batch says so, and a
/// shadow rule is flagged.
#[tokio::test]
async fn an_observer_sees_each_rule_with_its_stored_key() {
    let _serial = crate::observe::serial();
    let seen = Recorder::default();
    let layer = RateLimitLayer::builder()
        .limit(per_user(1))
        .limit(trial())
        .observe(seen.clone())
        .build()
        .unwrap();
    let svc = service(&layer);
    assert_eq!(send(&svc, "alice").await, StatusCode::OK);
    assert_eq!(
        seen.take(),
        vec![
            ("per-user".into(), b"alice".to_vec(), true, true, false),
            ("trial".into(), b"alice".to_vec(), true, true, true),
        ]
    );
    assert_eq!(send(&svc, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        seen.take(),
        vec![
            ("per-user".into(), b"alice".to_vec(), false, false, false),
            ("trial".into(), b"alice".to_vec(), false, false, true),
        ]
    );

    let long = "x".repeat(300);
    assert_eq!(send(&svc, &long).await, StatusCode::OK);
    let digest = StoredKey::of(long.as_bytes());
    assert!(digest.is_digest());
    for (_, key, ..) in seen.take() {
        assert_eq!(key, digest.as_bytes());
        assert_eq!(key.len(), 33);
    }
}

/// An observer that panics cannot take requests down: each request gets the answer its
/// rules decided, and the observer set after it still sees every decision.
#[tokio::test]
async fn a_panicking_observer_takes_no_request_down() {
    let _serial = crate::observe::serial();
    struct Panics;
    impl DecisionObserver for Panics {
        fn on_decision(&self, _: &DecisionEvent<'_>) {
            panic!("an observer's bug");
        }
    }
    let seen = Recorder::default();
    let layer = RateLimitLayer::builder()
        .limit(per_user(1))
        .observe(Panics)
        .observe(seen.clone())
        .build()
        .unwrap();
    let svc = service(&layer);
    assert_eq!(send(&svc, "alice").await, StatusCode::OK);
    assert_eq!(send(&svc, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&svc, "bob").await, StatusCode::OK);
    let admitted: Vec<bool> = seen.take().into_iter().map(|s| s.2).collect();
    assert_eq!(admitted, [true, false, true]);
}

/// A reload swaps the rules, not the observers: the running layer's observer sees the new
/// rules' decisions, and one set on the reloaded builder is not installed.
#[tokio::test]
async fn observers_are_kept_across_a_reload() {
    let _serial = crate::observe::serial();
    let seen = Recorder::default();
    let (layer, handle) = RateLimitLayer::builder()
        .limit(per_user(5))
        .observe(seen.clone())
        .build()
        .unwrap()
        .reloadable();
    let svc = service(&layer);
    send(&svc, "bob").await;
    assert_eq!(seen.take().len(), 1);

    let ignored = Recorder::default();
    let reloaded = handle
        .builder()
        .limit(Limit::new(
            Rule::fixed_window("renamed", 5, Duration::from_secs(60)),
            key::header("user-id"),
        ))
        .observe(ignored.clone());
    handle.reload(reloaded.build().unwrap());
    send(&svc, "bob").await;
    let after: Vec<String> = seen.take().into_iter().map(|s| s.0).collect();
    assert_eq!(after, ["renamed"]);
    assert!(ignored.take().is_empty());
}

/// `rules` lists each rule once with its algorithm, quota, penalty, routes and mode, and a
/// reloadable layer's answer follows its reloads.
#[tokio::test]
async fn the_rules_view_follows_a_reload() {
    let _serial = crate::observe::serial();
    let penalty = Penalty::lock_for(Duration::from_secs(600)).after(3);
    let (layer, handle) = RateLimitLayer::builder()
        .limit(per_user(5))
        .route(
            "POST /login",
            [Limit::new(
                Rule::fixed_window("login", 5, Duration::from_secs(60)).with_penalty(penalty),
                key::header("user-id"),
            )],
        )
        .route("POST /logout", [audit()])
        .route("GET /me", [audit()])
        .build()
        .unwrap()
        .reloadable();
    let rules = layer.rules();
    assert_eq!(rules.len(), 3);
    assert_eq!(rules[0].rule.name(), "per-user");
    assert_eq!(rules[0].algorithm, "fixed_window");
    assert_eq!(
        (rules[0].quota, rules[0].period),
        (5, Duration::from_secs(60))
    );
    assert_eq!(rules[0].routes, ["*"]);
    assert_eq!(rules[1].routes, ["POST /login"]);
    assert_eq!(rules[2].routes, ["POST /logout", "GET /me"]);
    assert_eq!(rules[1].rule.penalty(), Some(&penalty));
    assert_eq!(rules[0].mode, Mode::Enforce);

    handle.reload(
        handle
            .builder()
            .limit(trial())
            .mode(Mode::Shadow)
            .build()
            .unwrap(),
    );
    let rules = layer.rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].rule.name(), rules[0].algorithm),
        ("trial", "gcra")
    );
    assert_eq!(rules[0].mode, Mode::Shadow);
    // The handle's builder decides with the same store the layer's limiter holds.
    assert!(format!("{:?}", layer.limiter()).contains("MemoryStore"));
}

/// A failed store is observed too: the event carries the error, and each rule of the batch
/// with no outcome of its own (the failure policy decided, not a rule).
#[tokio::test]
async fn a_failed_store_is_observed_with_no_rule_outcome() {
    let _serial = crate::observe::serial();
    let seen = Recorder::default();
    let failed: Arc<Mutex<Vec<bool>>> = Arc::default();
    let record = failed.clone();
    let layer = RateLimitLayer::builder()
        .limiter(tollgate::Limiter::new(crate::support::down::Down))
        .limit(per_user(1))
        .observe(seen.clone())
        .observe(crate::support::service::Watch(
            move |event: &DecisionEvent<'_>| {
                record.lock().unwrap().push(event.outcome.is_err());
            },
        ))
        .build()
        .unwrap();
    assert_eq!(send(&service(&layer), "alice").await, StatusCode::OK);
    assert_eq!(*failed.lock().unwrap(), [true]);
    let seen = seen.take();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].2, seen[0].3), (false, false));
}

/// One seam watches decisions, and CI holds the crate to it: one observer trait, no other
/// hook on the builder, and the `metrics` feature read in the layer by its observer's file
/// only (the memory store's eviction count, not a decision, is recorded where it happens).
#[test]
fn decisions_are_watched_through_one_seam() {
    fn sources(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.display().to_string(), text));
            }
        }
    }
    let mut files = Vec::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let lines = || {
        files
            .iter()
            .flat_map(|(p, t)| t.lines().map(move |l| (p, l.trim())))
    };
    let traits: Vec<_> = lines()
        .filter(|(_, l)| l.starts_with("pub trait") && l.contains("Observer"))
        .collect();
    assert_eq!(traits.len(), 1, "{traits:?}");
    let hooks: Vec<_> = lines()
        .filter(|(_, l)| l.starts_with("pub fn on_decision") || l.contains("DecisionFn"))
        .collect();
    assert!(hooks.is_empty(), "{hooks:?}");
    let gated: Vec<_> = lines()
        .filter(|(p, l)| {
            p.contains("layer") && l.starts_with("#[cfg(") && l.contains("\"metrics\"")
        })
        .map(|(p, _)| p.rsplit(['/', '\\']).next().unwrap_or(p))
        .collect();
    assert!(gated.iter().all(|p| *p == "record.rs"), "{gated:?}");
}

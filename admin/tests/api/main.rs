//! The admin router's JSON API and its guards, driven in process, on tollgate's public
//! seam: the activity recorder as the layer's observer, its rules, peek/reset by stored key.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, store::MemoryStore, Penalty, Rule};
use tollgate_admin::{Activity, Admin};
use tower::ServiceExt;

mod door;

const TOKEN: &str = "c3000dbcba30a94e90d4be5861183f6b";

/// Two attempts a minute from a key's first, then locked: a window anchored at the first
/// attempt, so that no test's attempts straddle a clock minute and pass in the next one.
fn login_rule() -> Rule {
    Rule::fixed_window_from_first_hit("login", 2, Duration::from_secs(60))
        .with_penalty(Penalty::lock_for(Duration::from_secs(600)).after(1))
}

/// An app limiting `GET /` by the `user` header, with its admin at `/admin`, and the
/// handle that reloads its rules.
fn app() -> (Router, tollgate::layer::ReloadHandle<MemoryStore>) {
    let activity = Activity::with_top_keys(8);
    let (layer, reload) = RateLimitLayer::builder()
        .limit(Limit::new(login_rule(), key::header("user")))
        .observe(activity.clone())
        .build()
        .unwrap()
        .reloadable();
    let admin = Admin::new(&layer, &activity)
        .bearer_token(TOKEN)
        .router()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .nest_service("/admin", admin);
    (app, reload)
}

fn from_peer(mut request: Request<Body>) -> Request<Body> {
    let peer: SocketAddr = ([203, 0, 113, 7], 4000).into();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(from_peer(request)).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

fn admin(method: &str, path: &str, token: Option<&str>) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(Body::empty()).unwrap()
}

async fn hit(app: &Router, user: &str, times: usize) {
    for _ in 0..times {
        let request = Request::get("/").header("user", user).body(Body::empty());
        send(app, request.unwrap()).await;
    }
}

/// The API lists the rules with their algorithm, quota, penalty, routes and mode, and
/// follows a reload.
#[tokio::test]
async fn rules_are_listed_and_follow_reloads() {
    let (app, reload) = app();
    let (status, rules) = send(&app, admin("GET", "/admin/api/rules", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rules[0]["name"], "login");
    assert_eq!(rules[0]["algorithm"], "fixed_window");
    assert_eq!(
        (rules[0]["limit"].as_u64(), rules[0]["period_ms"].as_u64()),
        (Some(2), Some(60_000))
    );
    assert_eq!(rules[0]["penalty"]["lock_for_ms"], 600_000);
    assert_eq!(rules[0]["routes"], serde_json::json!(["*"]));
    assert_eq!(rules[0]["mode"], "enforce");

    let trial = Rule::fixed_window("trial", 5, Duration::from_secs(1));
    reload.reload(
        reload
            .builder()
            .route("GET /x", [Limit::new(trial, key::global()).shadow()])
            .build()
            .unwrap(),
    );
    let (_, rules) = send(&app, admin("GET", "/admin/api/rules", Some(TOKEN))).await;
    assert_eq!(rules.as_array().map(Vec::len), Some(1));
    assert_eq!(rules[0]["name"], "trial");
    assert_eq!(rules[0]["routes"], serde_json::json!(["GET /x"]));
    assert_eq!(rules[0]["mode"], "shadow");
}

/// Decisions are counted per rule in the current second, and the most denied keys are
/// listed with their denials, an error bound and the count of distinct keys.
#[tokio::test]
async fn decisions_and_top_keys_are_counted() {
    let (app, _reload) = app();
    hit(&app, "mallory", 6).await;
    hit(&app, "eve", 3).await;
    hit(&app, "alice", 1).await;
    let (_, decisions) = send(&app, admin("GET", "/admin/api/decisions", Some(TOKEN))).await;
    let sum = |series: &str| -> u64 {
        let values = decisions[0][series].as_array().unwrap();
        values.iter().filter_map(Value::as_u64).sum()
    };
    assert_eq!(decisions[0]["rule"], "login");
    assert_eq!((sum("admitted"), sum("delayed"), sum("denied")), (5, 0, 5));

    let (status, top) = send(&app, admin("GET", "/admin/api/top?n=5", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    let top = &top[0];
    assert_eq!(top["denials"].as_u64(), Some(5));
    // Two keys: 2, or 1 the run in 256 their hashes share one of the sketch's registers.
    let distinct = top["distinct_keys"].as_u64();
    assert!(matches!(distinct, Some(1..=2)), "{distinct:?}");
    assert_eq!(top["keys"][0]["key"], "mallory");
    assert_eq!(top["keys"][0]["denials"], 4);
    assert_eq!(top["keys"][0]["error"], 0);
    assert_eq!(top["keys"][1]["key"], "eve");
    assert_eq!(top["error_bound"], 0);
}

/// A key's state shows its lock; unblocking by bearer token lifts it, and the key leaves
/// the top list.
#[tokio::test]
async fn unblock_lifts_a_lock_and_forgets_the_key() {
    let (app, _reload) = app();
    hit(&app, "mallory", 3).await;
    let path = "/admin/api/key?rule=login&key=mallory";
    let (status, state) = send(&app, admin("GET", path, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (state["locked"].as_bool(), state["admitted"].as_bool()),
        (Some(true), Some(false))
    );

    let unblock = "/admin/api/unblock?rule=login&key_hex=6d616c6c6f7279";
    let (status, _) = send(&app, admin("POST", unblock, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, state) = send(&app, admin("GET", path, Some(TOKEN))).await;
    assert_eq!(
        (state["locked"].as_bool(), state["remaining"].as_u64()),
        (Some(false), Some(2))
    );
    let (_, top) = send(&app, admin("GET", "/admin/api/top", Some(TOKEN))).await;
    assert_eq!(top[0]["keys"], serde_json::json!([]));
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    assert_eq!(health["health"], "healthy");
}

/// The page escapes keys: markup sent as a key is shown as text, never as markup.
#[tokio::test]
async fn the_page_escapes_keys() {
    let (app, _reload) = app();
    hit(&app, "<script>alert(1)</script>", 3).await;
    let response = app
        .clone()
        .oneshot(from_peer(admin("GET", "/admin", Some(TOKEN))))
        .await
        .unwrap();
    let status = response.status();
    if status != StatusCode::OK {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        panic!("{status} {}", String::from_utf8_lossy(&body));
    }
    assert!(response.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let page = String::from_utf8_lossy(&body);
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.contains("<script>alert(1)"));
    assert!(page.contains("<svg class=\"chart\""));
}

/// A key over 128 bytes is listed as the store's digest of it (33 bytes, marked
/// `digested`), and that digest looks the key up and unblocks it.
#[tokio::test]
async fn a_long_key_is_listed_and_unblocked_by_its_digest() {
    let (app, _reload) = app();
    let long = "m".repeat(300);
    hit(&app, &long, 3).await;
    let (_, top) = send(&app, admin("GET", "/admin/api/top", Some(TOKEN))).await;
    let listed = &top[0]["keys"][0];
    assert_eq!(listed["digested"], true);
    let digest = listed["key_hex"].as_str().unwrap().to_owned();
    assert_eq!(digest.len(), 66);
    assert!(digest.starts_with("ff"));

    let path = format!("/admin/api/key?rule=login&key_hex={digest}&digested=true");
    let (status, state) = send(&app, admin("GET", &path, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["locked"], true);
    // The same key typed out is the same key, in the same state.
    let typed = format!("/admin/api/key?rule=login&key={long}");
    let (_, same) = send(&app, admin("GET", &typed, Some(TOKEN))).await;
    assert_eq!(
        (&same["key_hex"], &same["locked"]),
        (&state["key_hex"], &state["locked"])
    );

    let unblock = format!("/admin/api/unblock?rule=login&key_hex={digest}&digested=true");
    let (status, _) = send(&app, admin("POST", &unblock, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, state) = send(&app, admin("GET", &path, Some(TOKEN))).await;
    assert_eq!(state["locked"], false);
    // Bytes that are no digest the store keeps are refused.
    let bad = "/admin/api/key?rule=login&key_hex=ff00&digested=true";
    assert_eq!(
        send(&app, admin("GET", bad, Some(TOKEN))).await.0,
        StatusCode::BAD_REQUEST
    );
}

/// An app like [`app`] on `store`, its login rule keyed by `key`, with its admin watching
/// what `admin` adds.
fn app_on<St: tollgate::store::Store + Clone>(
    limiter: tollgate::Limiter<St>,
    key: impl tollgate::key::KeyExtractor + 'static,
    admin: impl FnOnce(Admin<St>) -> Admin<St>,
) -> Router {
    let activity = Activity::new();
    let layer = RateLimitLayer::builder()
        .limiter(limiter)
        .limit(Limit::new(login_rule(), key))
        .observe(activity.clone())
        .build()
        .unwrap();
    let router = admin(Admin::new(&layer, &activity).bearer_token(TOKEN))
        .router()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .nest_service("/admin", router)
}

async fn page(app: &Router, path: &str) -> String {
    let response = app
        .clone()
        .oneshot(from_peer(admin("GET", path, Some(TOKEN))))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// The locked keys are listed with when their lock ends, as the store has them: a key
/// denied but not locked is not listed, and a key unblocked (here or by another instance
/// sharing the store) leaves the list.
#[tokio::test]
async fn locked_keys_are_listed_with_their_end() {
    let store = MemoryStore::new();
    let other_instance = tollgate::Limiter::new(store.clone());
    let app = app_on(tollgate::Limiter::new(store), key::header("user"), |a| a);
    hit(&app, "mallory", 3).await;
    hit(&app, "trudy", 3).await;
    hit(&app, "eve", 2).await;
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let before = before.unwrap().as_millis() as u64;
    let (status, locked) = send(&app, admin("GET", "/admin/api/locked", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(locked[0]["rule"], "login");
    let keys = locked[0]["keys"].as_array().unwrap();
    let names: Vec<&str> = keys.iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!(names, ["mallory", "trudy"], "{locked}");
    let wait = keys[0]["retry_after_ms"].as_u64().unwrap();
    assert!((590_000..=600_000).contains(&wait), "{wait}");
    let until = keys[0]["until_unix_ms"].as_u64().unwrap();
    assert!(
        until >= before + 590_000 && until <= before + 610_000,
        "{until}"
    );

    let html = page(&app, "/admin").await;
    let table = &html[html.find("id=\"locked\"").expect("a locked table")..];
    assert!(table.contains(">mallory</span>") && table.contains("locked until"));

    let unblock = "/admin/api/unblock?rule=login&key=mallory";
    assert_eq!(
        send(&app, admin("POST", unblock, Some(TOKEN))).await.0,
        StatusCode::NO_CONTENT
    );
    other_instance.reset(&login_rule(), "trudy").await.unwrap();
    let (_, locked) = send(&app, admin("GET", "/admin/api/locked", Some(TOKEN))).await;
    assert_eq!(locked[0]["keys"], serde_json::json!([]), "{locked}");
}

/// A user name finds the `address␟user` keys it was denied under, with their lock: the
/// page no longer reports `alice` admitted while `203.0.113.7␟alice` is locked. A name no
/// key was denied under finds nothing rather than a fresh key no request has.
#[tokio::test]
async fn a_part_of_a_key_finds_the_key() {
    let store = MemoryStore::new();
    let per_user_and_address = (key::peer_ip(), key::header("user"));
    let app = app_on(tollgate::Limiter::new(store), per_user_and_address, |a| a);
    hit(&app, "alice", 3).await;
    hit(&app, "bob", 1).await;
    let (status, found) = send(&app, admin("GET", "/admin/api/find?key=alice", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    let keys = found["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{found}");
    assert_eq!(keys[0]["key"], "203.0.113.7\u{241F}alice");
    assert_eq!(keys[0]["rule"], "login");
    assert_eq!(
        (&keys[0]["locked"], &keys[0]["admitted"]),
        (&Value::Bool(true), &Value::Bool(false))
    );
    assert!(
        keys[0]["locked_until_unix_ms"].as_u64().is_some(),
        "{found}"
    );
    let (_, by_address) = send(
        &app,
        admin(
            "GET",
            "/admin/api/find?key=203.0.113.7&rule=login",
            Some(TOKEN),
        ),
    )
    .await;
    let keys = by_address["keys"].as_array().unwrap();
    assert!(
        keys.iter().any(|k| k["key"] == "203.0.113.7\u{241F}alice"),
        "{by_address}"
    );
    // bob was never denied: nothing is known of a key with that part.
    let (_, bob) = send(&app, admin("GET", "/admin/api/find?key=bob", Some(TOKEN))).await;
    assert_eq!(bob["keys"], serde_json::json!([]), "{bob}");

    let html = page(&app, "/admin?rule=login&key=alice").await;
    let result = &html[html.find("id=\"lookup-result\"").expect("a lookup result")..];
    assert!(
        result.contains("<span class=\"part\">203.0.113.7</span><span class=\"sep\">\u{241F}</span><span class=\"part\">alice</span>"),
        "{result}"
    );
    assert!(result.contains(">locked</strong> until"), "{result}");
    assert!(!result.contains(">admitted<"), "{result}");
}

/// A flood of locked throw-away names does not push a real user's lock out: she is still
/// listed locked, and a lookup by her name finds her key locked.
#[tokio::test]
async fn a_flood_of_locks_keeps_every_lock_shown() {
    let per_user_and_address = (key::peer_ip(), key::header("user"));
    let app = app_on(
        tollgate::Limiter::new(MemoryStore::new()),
        per_user_and_address,
        |a| a,
    );
    hit(&app, "alice", 3).await;
    for i in 0..4_000 {
        hit(&app, &format!("throw-away-{i}"), 3).await;
    }
    let (_, found) = send(&app, admin("GET", "/admin/api/find?key=alice", Some(TOKEN))).await;
    let keys = found["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{found}");
    assert_eq!(keys[0]["key"], "203.0.113.7\u{241F}alice");
    assert_eq!(keys[0]["locked"], true, "{found}");
    let path = "/admin/api/locked?n=5000";
    let (_, locked) = send(&app, admin("GET", path, Some(TOKEN))).await;
    let listed =
        locked[0]["keys"].as_array().unwrap().len() + locked[0]["more"].as_u64().unwrap() as usize;
    assert_eq!(listed, 4_001, "{}", locked[0]["more"]);
}

/// A key spelled as a digest is not shown as one, and the digest the page shows, typed
/// into the lookup, finds the digested key, not a key spelled so.
#[tokio::test]
async fn a_digest_typed_finds_the_digested_key() {
    let (app, _reload) = app();
    let long = "m".repeat(300);
    hit(&app, &long, 3).await;
    let (_, top) = send(&app, admin("GET", "/admin/api/top", Some(TOKEN))).await;
    let shown = top[0]["keys"][0]["key"].as_str().unwrap().to_owned();
    assert!(shown.starts_with("sha256:"), "{shown}");
    hit(&app, &shown, 3).await;
    let (_, top) = send(&app, admin("GET", "/admin/api/top", Some(TOKEN))).await;
    let texts: Vec<&str> = top[0]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 2, "{top}");
    assert_ne!(texts[0], texts[1], "{top}");
    let typed = format!("/admin/api/key?rule=login&key={shown}");
    let (_, state) = send(&app, admin("GET", &typed, Some(TOKEN))).await;
    assert_eq!(state["digested"], true, "{state}");
    assert_eq!(state["key"], shown.as_str(), "{state}");
}

/// Given the in-process store, the page and the API say whether it is full (it forgot
/// entries lately to make room for new keys), how many keys it holds, and what it does
/// when full.
#[tokio::test]
async fn a_full_memory_store_is_shown() {
    let store = MemoryStore::new().max_keys(32);
    let watched = store.clone();
    let app = app_on(
        tollgate::Limiter::new(store),
        key::header("user"),
        move |a| a.memory_store(&watched),
    );
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    assert_eq!(health["memory_store"]["full"], false, "{health}");
    for i in 0..300 {
        hit(&app, &format!("user-{i}"), 1).await;
    }
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    let memory = &health["memory_store"];
    assert_eq!(memory["full"], true, "{health}");
    assert!(memory["evicted_recently"].as_u64() > Some(0), "{health}");
    assert!(memory["keys"].as_u64() < Some(300), "{health}");
    assert!(memory["when_full"]
        .as_str()
        .unwrap()
        .contains("locked key is never forgotten"));
    let html = page(&app, "/admin").await;
    assert!(
        html.contains("In-process store: <strong class=\"bad\" id=\"memory\">full</strong>"),
        "{html}"
    );
}

/// A store full of locked keys denies new keys: the page and the API count those
/// refusals, and the store is shown full.
#[tokio::test]
async fn a_memory_store_refusing_new_keys_is_shown() {
    let store = MemoryStore::new().max_keys(1);
    let watched = store.clone();
    let limiter = tollgate::Limiter::new(store.clone());
    let app = app_on(limiter.clone(), key::header("user"), move |a| {
        a.memory_store(&watched)
    });
    let rule = login_rule();
    for i in 0..10_000 {
        if store.stats().refusals > 0 {
            break;
        }
        for _ in 0..3 {
            let _ = limiter.check_one(&rule, format!("k{i}")).await;
        }
    }
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    let memory = &health["memory_store"];
    assert_eq!(memory["full"], true, "{health}");
    assert!(memory["refused_recently"].as_u64() > Some(0), "{health}");
    assert!(memory["refusals"].as_u64() > Some(0), "{health}");
    let html = page(&app, "/admin").await;
    assert!(html.contains("refused for want of room"), "{html}");
}

/// Given a circuit breaker, the page and the API show its own state, not only that the
/// store is failing: here it opens when the store behind it is down.
#[tokio::test]
async fn a_breakers_state_is_shown() {
    use tollgate::store::{Breaker, Health, Store};
    let breaker = Breaker::new(Down).open_for(Duration::from_secs(600));
    let limiter = tollgate::Limiter::new(breaker.clone());
    let watched = breaker.clone();
    let app = app_on(limiter.clone(), key::header("user"), move |a| {
        a.breaker(&watched)
    });
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    assert_eq!(health["breaker"]["state"], "closed", "{health}");

    // Three failures in a row open the breaker.
    let rule = login_rule();
    for i in 0..3 {
        let _ = limiter.check_one(&rule, format!("k{i}")).await;
    }
    assert_eq!(breaker.health(), Health::Failing);
    let (_, health) = send(&app, admin("GET", "/admin/api/health", Some(TOKEN))).await;
    assert_eq!(health["health"], "failing", "{health}");
    assert_eq!(health["breaker"]["state"], "open", "{health}");
    let html = page(&app, "/admin").await;
    assert!(
        html.contains("Circuit breaker: <strong class=\"bad\" id=\"breaker\">open</strong>"),
        "{html}"
    );
}

/// A store that is down: every call fails as a refused connection does.
#[derive(Clone, Debug)]
struct Down;

impl tollgate::store::Store for Down {
    async fn check(
        &self,
        _: &[tollgate::Check<'_>],
        _: Duration,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        Err(refused())
    }
    async fn lease(
        &self,
        _: tollgate::Check<'_>,
        _: Duration,
        _: Option<(&tollgate::Outcome, u64)>,
    ) -> Result<tollgate::Outcome, tollgate::StoreError> {
        Err(refused())
    }
    async fn peek(
        &self,
        _: tollgate::Check<'_>,
    ) -> Result<tollgate::RuleOutcome, tollgate::StoreError> {
        Err(refused())
    }
    async fn reset(
        &self,
        _: &Rule,
        _: &tollgate::StoredKey<'_>,
    ) -> Result<(), tollgate::StoreError> {
        Err(refused())
    }
    async fn refund(
        &self,
        _: &[tollgate::Check<'_>],
        _: &tollgate::Outcome,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    async fn overdraw(&self, _: &[tollgate::Check<'_>]) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    async fn count_denials(
        &self,
        _: &[tollgate::Check<'_>],
        _: std::time::Duration,
    ) -> Result<(), tollgate::StoreError> {
        Ok(())
    }
    fn health(&self) -> tollgate::store::Health {
        tollgate::store::Health::Healthy
    }
}

fn refused() -> tollgate::StoreError {
    tollgate::StoreError::Unavailable("connection refused".into())
}

/// The page's address with a trailing slash (`/admin/`, as people type it) serves the page
/// as `/admin` does, its forms aimed at the same addresses, for a browser not signed in and
/// for a script with the token alike.
#[tokio::test]
async fn the_page_with_a_trailing_slash_is_the_page() {
    let (app, _reload) = app();
    for (token, form) in [
        (None, "action=\"/admin/login\""),
        (Some(TOKEN), "action=\"/admin/logout\""),
    ] {
        for path in ["/admin", "/admin/"] {
            let response = app
                .clone()
                .oneshot(from_peer(admin("GET", path, token)))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{path} {token:?}");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&body);
            assert!(body.contains(form), "{path} {token:?}: {body}");
        }
    }
}

//! An admin beside a rate-limited app: `tollgate-admin`'s page and JSON API at `/admin`
//! (rules, decisions over time, the most denied keys, unblock), and routes
//! of the app's own that name a key by user and address, built on [`Limiter::peek`] and
//! [`Limiter::reset`], all behind one bearer token.
//!
//! - `/admin`: the page, for a browser (sign in with the token: the form sets a session
//!   cookie), and `/admin/api/…` for scripts (`Authorization: Bearer …`); see
//!   `tollgate_admin`.
//! - `GET /ops/limits/{rule}?user=…&address=…`: the state under the rule of the key the
//!   layer would extract from a request of that user from that address (limit, remaining,
//!   reset), whether its next request would be admitted (and if not, when), and whether it
//!   is locked out, as JSON. Nothing is consumed.
//! - `POST /ops/limits/{rule}/unblock?user=…&address=…`: clears that key's state and
//!   lifts its lock (every instance sharing the store sees it at once; with a Redis deny
//!   cache, every instance's cache is cleared too). Answers `204`.
//!
//! Both need `Authorization: Bearer <ADMIN_TOKEN>`; the token is compared in constant time
//! (as SHA-256 digests, so its length does not leak either). A missing or wrong token is a
//! `401` that says nothing about the token, and an address that sends 5 wrong tokens within
//! 15 minutes gets `429` until then, whatever it sends.
//!
//! The app: `POST /login` allows 5 attempts a minute per user *and client address* (the
//! `User` header, trimmed and lower-cased exactly as the login handler reads it); 3 refusals
//! within 10 minutes lock that user out from that address for 15 minutes. Keyed by the user
//! alone, anyone could lock any named user out; beside it, each address has 20 attempts a
//! minute whatever the user names it tries. Run
//! `ADMIN_TOKEN=$(openssl rand -hex 16) cargo run -p tollgate-admin --example admin` and try the printed
//! lines. Keep the admin routes off the public network (a separate listener or port in
//! production); this example serves both on one for brevity.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tollgate::key::{KeyBuf, KeyExtractor, RequestHead};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{
    key,
    store::{MemoryStore, Store},
    ConfigError, Decision, DenyReason, Limiter, Penalty, Rate, Rule,
};

/// What the admin routes need: the limiter, the rules they may act on (by name, with the
/// key each counts under), the digest of the token, and the limit on wrong tokens.
struct Admin<St> {
    limiter: Limiter<St>,
    rules: HashMap<String, (Rule, Arc<dyn KeyExtractor>)>,
    token: [u8; 32],
    wrong_tokens: Rule,
}

/// The user a login is for, as the login handler reads it and as its limits count it: one
/// user, however the client spells the name's case or pads it.
fn user_of(headers: &HeaderMap) -> Option<String> {
    let user = headers.get("user")?.to_str().ok()?.trim().to_lowercase();
    (!user.is_empty()).then_some(user)
}

/// Login attempts per user and client address: 5 a minute; 3 refusals within 10 minutes
/// lock that user out from that address for 15 minutes.
fn login_rule() -> Result<Rule, ConfigError> {
    Rule::fixed_window("login", 5, Duration::from_secs(60))
        .with_penalty(
            Penalty::lock_for(Duration::from_secs(900))
                .after(3)
                .within(Duration::from_secs(600)),
        )
        .checked()
}

/// What the login rule counts under: the client's address and the user it names.
fn login_key() -> Arc<dyn KeyExtractor> {
    let user = key::from_fn(|head: &RequestHead<'_>| user_of(head.headers()));
    Arc::new((key::peer_ip(), user))
}

/// The app and its admin API, on any store.
fn app<St: Store + Clone>(
    limiter: Limiter<St>,
    token: &str,
) -> Result<Router, Box<dyn std::error::Error>> {
    let login = login_rule()?;
    let per_address = Rule::gcra("login-per-address", 20, Rate::per_minute(20));
    let address: Arc<dyn KeyExtractor> = Arc::new(key::peer_ip());
    let activity = tollgate_admin::Activity::new();
    let limits = RateLimitLayer::builder()
        .limiter(limiter.clone())
        .limit(Limit::new(login.clone(), SharedKey(login_key())))
        .limit(Limit::new(per_address.clone(), SharedKey(address.clone())))
        .observe(activity.clone())
        .build()?;
    let page = tollgate_admin::Admin::new(&limits, &activity)
        .bearer_token(token)
        .router()?;
    let public = Router::new()
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                let user = user_of(&headers).unwrap_or_default();
                format!("welcome, {user}\n")
            }),
        )
        .layer(limits);

    let rules = [(login, login_key()), (per_address, address)];
    let admin = Arc::new(Admin {
        limiter,
        rules: rules
            .into_iter()
            .map(|(rule, key)| (rule.name().to_owned(), (rule, key)))
            .collect(),
        token: Sha256::digest(token.as_bytes()).into(),
        wrong_tokens: Rule::fixed_window("admin-wrong-tokens", 5, Duration::from_secs(900)),
    });
    let admin_routes = Router::new()
        .route("/ops/limits/{rule}", get(peek::<St>))
        .route("/ops/limits/{rule}/unblock", post(unblock::<St>))
        .route_layer(middleware::from_fn_with_state(
            admin.clone(),
            authorize::<St>,
        ))
        .with_state(admin);
    Ok(public.merge(admin_routes).nest("/admin", page))
}

/// A key extractor shared between the layer and the admin routes, so both compute one key.
struct SharedKey(Arc<dyn KeyExtractor>);

impl KeyExtractor for SharedKey {
    fn extract(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), key::KeyError> {
        self.0.extract(request, key)
    }
}

/// Lets a request through only with the right bearer token, from an address that has not
/// sent too many wrong ones.
async fn authorize<St: Store>(
    State(admin): State<Arc<Admin<St>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let address = peer.ip().to_string();
    let rule = &admin.wrong_tokens;
    match admin.limiter.peek(rule, &address, 1).await {
        Ok(next) if !next.decision.is_admitted() => {
            let wait = next.decision.denial().and_then(|d| d.retry_after);
            return too_many_wrong_tokens(wait);
        }
        Ok(_) => {}
        Err(error) => return store_unavailable(error),
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Digests have one length whatever the token's, and `ct_eq` takes the same time
    // whichever byte differs: a client learns nothing by timing its guesses.
    let authorized = given.is_some_and(|token| {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        bool::from(digest.ct_eq(&admin.token))
    });
    if !authorized {
        // Only wrong tokens count: an admin's own requests never lock the admin out.
        if let Err(error) = admin.limiter.check_one(rule, &address).await {
            return store_unavailable(error);
        }
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized\n",
        )
            .into_response();
    }
    next.run(request).await
}

/// 429 for an address that sent too many wrong tokens, with `Retry-After` in whole seconds
/// (rounded up, as the layer's own 429s), so a client knows when it may try again.
fn too_many_wrong_tokens(wait: Option<Duration>) -> Response {
    let secs = wait.map_or(1, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0));
    let retry_after = [(header::RETRY_AFTER, secs.max(1).to_string())];
    let body = "too many wrong tokens\n";
    (StatusCode::TOO_MANY_REQUESTS, retry_after, body).into_response()
}

/// The answer to a rule name the app does not have: a 404 naming the rules there are.
fn no_such_rule<St>(admin: &Admin<St>) -> Response {
    let mut known: Vec<&str> = admin.rules.keys().map(String::as_str).collect();
    known.sort_unstable();
    let body = serde_json::json!({ "error": "no such rule", "rules": known });
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

fn store_unavailable(error: tollgate::StoreError) -> Response {
    tracing::warn!(%error, "admin: the store failed");
    let body = serde_json::json!({ "error": "the rate limit store is unavailable" });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Whose key an admin asks about: a user and the address its requests come from.
#[derive(serde::Deserialize)]
struct Whose {
    user: Option<String>,
    address: Option<std::net::IpAddr>,
}

/// The key `extractor` finds in a request of `whose`: the same bytes the layer counts under.
fn key_of(extractor: &dyn KeyExtractor, whose: &Whose) -> Option<Vec<u8>> {
    let mut request = http::Request::post("/login");
    if let Some(user) = &whose.user {
        request = request.header("user", user.as_str());
    }
    if let Some(address) = whose.address {
        request = request.extension(ConnectInfo(SocketAddr::new(address, 0)));
    }
    let request = request.body(()).ok()?;
    let mut key = KeyBuf::new();
    extractor
        .extract(&RequestHead::from_request(&request), &mut key)
        .ok()?;
    Some(key.as_bytes().to_vec())
}

/// The rule named `rule` and the key of `whose` under it, or the response saying why not.
fn rule_and_key<'a, St>(
    admin: &'a Admin<St>,
    rule: &str,
    whose: &Whose,
) -> Result<(&'a Rule, Vec<u8>), Box<Response>> {
    let Some((rule, extractor)) = admin.rules.get(rule) else {
        return Err(Box::new(no_such_rule(admin)));
    };
    let Some(key) = key_of(extractor.as_ref(), whose) else {
        let body =
            serde_json::json!({ "error": "give the user and the address the rule counts by" });
        return Err(Box::new(
            (StatusCode::BAD_REQUEST, Json(body)).into_response(),
        ));
    };
    Ok((rule, key))
}

async fn peek<St: Store>(
    State(admin): State<Arc<Admin<St>>>,
    Path(rule): Path<String>,
    Query(whose): Query<Whose>,
) -> Response {
    let (rule, key) = match rule_and_key(&admin, &rule, &whose) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    // The state as it is (a request of cost 0 takes nothing), and what the next request at
    // the rule's cost would get.
    let (now, next) = match tokio::try_join!(
        admin.limiter.peek(rule, &key, 0),
        admin.limiter.peek(rule, &key, rule.cost())
    ) {
        Ok(both) => both,
        Err(error) => return store_unavailable(error),
    };
    let (locked, retry_after_ms) = match next.decision {
        Decision::Deny(denial) => (
            denial.reason == DenyReason::Locked,
            denial.retry_after.map(|d| d.as_millis()),
        ),
        Decision::Delay(wait) => (false, Some(wait.as_millis())),
        Decision::Allow => (false, None),
    };
    Json(serde_json::json!({
        "rule": rule.name(),
        "user": whose.user,
        "address": whose.address,
        "limit": now.info.limit,
        "remaining": now.info.remaining,
        "reset_ms": now.info.reset.as_millis(),
        "admitted": next.decision.is_admitted(),
        "locked": locked,
        "retry_after_ms": retry_after_ms,
    }))
    .into_response()
}

async fn unblock<St: Store>(
    State(admin): State<Arc<Admin<St>>>,
    Path(rule): Path<String>,
    Query(whose): Query<Whose>,
) -> Response {
    let (rule, key) = match rule_and_key(&admin, &rule, &whose) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    match admin.limiter.reset(rule, &key).await {
        Ok(()) => {
            // An audit line: an authenticated admin's action, so whose key it concerns is
            // logged (unlike the layer's own logs, which show keys only as digests).
            tracing::info!(rule = rule.name(), user = whose.user, address = ?whose.address, "admin: key unblocked");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => store_unavailable(error),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let token = std::env::var("ADMIN_TOKEN").unwrap_or_default();
    if token.len() < 16 {
        return Err("set ADMIN_TOKEN to a secret of at least 16 characters, e.g. ADMIN_TOKEN=$(openssl rand -hex 16)".into());
    }
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  for i in $(seq 9); do curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST -H 'user: alice' http://{addr}/login; done");
    println!("  open http://{addr}/admin and sign in with $ADMIN_TOKEN");
    println!("  curl -s -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/admin/api/top'");
    println!("  curl -s -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/ops/limits/login?user=alice&address=127.0.0.1'");
    println!("  curl -s -X POST -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/ops/limits/login/unblock?user=alice&address=127.0.0.1'");
    let app = app(Limiter::new(MemoryStore::new()), &token)?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use tollgate::ManualClock;
    use tower::ServiceExt;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    const HOME: &str = "203.0.113.7";
    const ELSEWHERE: &str = "198.51.100.9";

    fn router() -> Router {
        let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
        app(Limiter::new(store), TOKEN).unwrap()
    }

    fn from(request: http::request::Builder, address: &str) -> http::request::Builder {
        let peer = SocketAddr::new(address.parse().unwrap(), 40_000);
        request.extension(ConnectInfo(peer))
    }

    fn admin(method: &str, path: &str, token: Option<&str>) -> http::Request<Body> {
        let mut request = from(http::Request::builder().method(method).uri(path), HOME);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request.body(Body::empty()).unwrap()
    }

    fn login_from(user: &str, address: &str) -> http::Request<Body> {
        from(http::Request::post("/login"), address)
            .header("user", user)
            .body(Body::empty())
            .unwrap()
    }

    fn login(user: &str) -> http::Request<Body> {
        login_from(user, HOME)
    }

    async fn send(app: &Router, request: http::Request<Body>) -> (StatusCode, serde_json::Value) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    const ALICE: &str = "/ops/limits/login?user=alice&address=203.0.113.7";
    const ALICE_UNBLOCK: &str = "/ops/limits/login/unblock?user=alice&address=203.0.113.7";

    /// Without the right token nothing is shown or changed.
    #[tokio::test]
    async fn without_the_token_nothing_is_shown_or_changed() {
        let app = router();
        for token in [None, Some("wrong"), Some(&TOKEN[1..])] {
            let (status, _) = send(&app, admin("GET", ALICE, token)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        }
        // Lock alice out; a wrong token cannot unblock her.
        for _ in 0..8 {
            app.clone().oneshot(login("alice")).await.unwrap();
        }
        let (status, _) = send(&app, admin("POST", ALICE_UNBLOCK, Some("x"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            send(&app, login("alice")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    /// Wrong tokens are limited per address: the sixth within 15 minutes is refused, and
    /// so then is the right one from that address.
    #[tokio::test]
    async fn wrong_tokens_are_limited() {
        let app = router();
        for i in 0..5 {
            let (status, _) = send(&app, admin("GET", ALICE, Some("wrong"))).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{i}");
        }
        let refused = app
            .clone()
            .oneshot(admin("GET", ALICE, Some("wrong")))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        // Until the 15-minute window of the clock's instant ends, in whole seconds.
        let retry_after = refused.headers()[header::RETRY_AFTER].to_str().unwrap();
        let secs: u64 = retry_after.parse().unwrap();
        assert!((1..=900).contains(&secs), "{retry_after}");
        let (status, _) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }

    /// A lockout holds for the user from the address that earned it: another address still
    /// logs in as that user.
    #[tokio::test]
    async fn a_lockout_is_per_user_and_address() {
        let app = router();
        for _ in 0..8 {
            app.clone().oneshot(login("alice")).await.unwrap();
        }
        assert_eq!(
            send(&app, login("alice")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        let elsewhere = send(&app, login_from("alice", ELSEWHERE)).await.0;
        assert_eq!(elsewhere, StatusCode::OK);
    }

    /// The user is counted as the login handler reads it: case and padding make no other
    /// user.
    #[tokio::test]
    async fn spellings_of_one_user_share_its_lockout() {
        let app = router();
        for _ in 0..8 {
            app.clone().oneshot(login("alice")).await.unwrap();
        }
        for spelling in ["Alice", " alice", "ALICE ", "aLiCe"] {
            let status = send(&app, login(spelling)).await.0;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{spelling:?}");
        }
    }

    /// One address gets 20 login attempts a minute, whatever users it names.
    #[tokio::test]
    async fn an_address_naming_many_users_is_limited() {
        let app = router();
        let mut refused = 0;
        for i in 0..30 {
            let status = send(&app, login(&format!("user-{i}"))).await.0;
            refused += usize::from(status == StatusCode::TOO_MANY_REQUESTS);
        }
        assert_eq!(refused, 10);
    }

    /// Peeking shows a lock without consuming anything, and unblocking lifts it.
    #[tokio::test]
    async fn peek_shows_a_lock_and_unblock_lifts_it() {
        let app = router();
        let (status, state) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(state["remaining"], 5);
        assert_eq!(state["locked"], false);

        let mut statuses = Vec::new();
        for _ in 0..8 {
            statuses.push(send(&app, login("alice")).await.0);
        }
        assert_eq!(statuses[..5], [StatusCode::OK; 5]);
        assert_eq!(statuses[5..], [StatusCode::TOO_MANY_REQUESTS; 3]);
        // Peeking consumes nothing: twice the same answer.
        for _ in 0..2 {
            let (status, state) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(state["locked"], true, "{state}");
            assert_eq!(state["admitted"], false, "{state}");
            assert_eq!(state["retry_after_ms"], 900_000, "{state}");
            assert_eq!(state["limit"], 5, "{state}");
        }
        // Bob is not affected.
        assert_eq!(send(&app, login("bob")).await.0, StatusCode::OK);

        let (status, _) = send(&app, admin("POST", ALICE_UNBLOCK, Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (_, state) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
        assert_eq!(state["locked"], false, "{state}");
        assert_eq!(state["remaining"], 5, "{state}");
        assert_eq!(send(&app, login("alice")).await.0, StatusCode::OK);
    }

    /// An unknown rule is a 404 naming the rules there are.
    #[tokio::test]
    async fn an_unknown_rule_is_a_404_naming_the_rules() {
        let app = router();
        let (status, body) = send(&app, admin("GET", "/ops/limits/nope?user=a", Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body["rules"],
            serde_json::json!(["login", "login-per-address"])
        );
        let (status, _) = send(&app, admin("POST", "/ops/limits/nope/unblock", Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    /// In a real browser (Debian's headless `chromium`): after a user is locked out by
    /// traffic, the signed-in page shows the rule, the chart and the limited key, and its
    /// unblock button lifts the lock. Fails, never skips, without Chromium.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_in_a_browser_unblocks_a_limited_key() {
        let app = app(Limiter::new(MemoryStore::new()), TOKEN).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = app.clone();
        tokio::spawn(async move {
            let service = served.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, service).await
        });
        let local = || login_from("alice", "127.0.0.1");
        // Other users locked out from addresses of their own, fewer times than alice, so
        // that her key tops the list the first unblock button acts on.
        for (n, user) in ["bob", "carol", "dave"].into_iter().enumerate() {
            for _ in 0..7 {
                let address = format!("192.0.2.{}", n + 1);
                app.clone()
                    .oneshot(login_from(user, &address))
                    .await
                    .unwrap();
            }
        }
        for _ in 0..10 {
            app.clone().oneshot(local()).await.unwrap();
        }
        assert_eq!(send(&app, local()).await.0, StatusCode::TOO_MANY_REQUESTS);

        let url = format!("http://{addr}/admin");
        let page = tokio::task::spawn_blocking(move || browse(&url))
            .await
            .unwrap();
        assert!(page.before.contains("id=\"rule-login\""), "{}", page.before);
        assert!(
            page.before.contains("<svg class=\"chart\""),
            "{}",
            page.before
        );
        // The key's parts (address, user) shown as parts.
        assert!(
            page.before.contains(
                "<span class=\"part\">127.0.0.1</span><span class=\"sep\">\u{241F}</span><span class=\"part\">alice</span>"
            ),
            "{}",
            page.before
        );
        assert!(
            page.after.contains("Unblocked a key of rule login"),
            "{}",
            page.after
        );
        assert_eq!(send(&app, local()).await.0, StatusCode::OK);
    }

    /// The page's HTML before and after pressing the first unblock button.
    struct Browsed {
        before: String,
        after: String,
    }

    /// Signs in on the page at `url` in headless Chromium and presses its first unblock
    /// button.
    fn browse(url: &str) -> Browsed {
        use headless_chrome::{Browser, LaunchOptions};
        let chromium = std::path::PathBuf::from("/usr/bin/chromium");
        assert!(
            chromium.exists(),
            "the browser test needs Chromium at /usr/bin/chromium: run scripts/install-deps.sh"
        );
        let options = LaunchOptions::default_builder()
            .path(Some(chromium))
            .sandbox(false)
            .window_size(Some((1200, 900)))
            .build()
            .unwrap();
        let browser = Browser::new(options).unwrap();
        let tab = browser.new_tab().unwrap();
        tab.navigate_to(url)
            .unwrap()
            .wait_until_navigated()
            .unwrap();
        tab.wait_for_element("input[name=token]")
            .unwrap()
            .click()
            .unwrap();
        tab.type_str(TOKEN).unwrap();
        tab.find_element("button[type=submit]")
            .unwrap()
            .click()
            .unwrap();
        if tab.wait_for_element("table.top button").is_err() {
            panic!(
                "no unblock button on {}",
                tab.get_content().unwrap_or_default()
            );
        }
        let before = tab.get_content().unwrap();
        // `TOLLGATE_ADMIN_SCREENSHOT=docs/admin.png` keeps the page as the README shows it.
        if let Some(path) = std::env::var_os("TOLLGATE_ADMIN_SCREENSHOT") {
            use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
            let png = tab
                .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
                .unwrap();
            std::fs::write(path, png).unwrap();
        }
        tab.find_element("table.top button")
            .unwrap()
            .click()
            .unwrap();
        tab.wait_for_element("#notice").unwrap();
        let after = tab.get_content().unwrap();
        Browsed { before, after }
    }
}

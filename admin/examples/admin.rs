//! A rate-limited login beside its operator's view: `tollgate-admin`'s page and JSON API
//! at `/admin`, behind one bearer token.
//!
//! The app: `POST /login` allows 5 attempts a minute per user *and client address* (the
//! `User` header, trimmed and lower-cased exactly as the login handler reads it); 3 refusals
//! within 10 minutes lock that user out from that address for 15 minutes. Keyed by the user
//! alone, anyone could lock any named user out; beside it, each address has 20 attempts a
//! minute whatever the user names it tries.
//!
//! The admin, on the same in-process store (given to it, so that the page says when the
//! store is full): the page for a browser (sign in with the token: the form sets a session
//! cookie), and `/admin/api/…` for scripts (`Authorization: Bearer …`). The page lists the
//! locked keys and until when, and finds a user's `address␟user` keys by the user's name
//! alone (`/admin/api/find?key=alice`); its buttons, or `POST /admin/api/unblock`, lift a
//! lock for every instance sharing the store. See `tollgate_admin` for every route.
//!
//! Run `ADMIN_TOKEN=$(openssl rand -hex 32) cargo run -p tollgate-admin --example admin`
//! and try the printed lines. Keep the admin off the public network (a separate listener
//! or port in production); this example serves both on one for brevity.
//!
//! The README's screenshot is this example's page, taken by its browser test:
//! `TOLLGATE_ADMIN_SCREENSHOT=$PWD/docs/admin.png cargo test -p tollgate-admin --example admin browser`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use tollgate::key::{KeyExtractor, RequestHead};
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{key, store::MemoryStore, ConfigError, Limiter, Penalty, Rate, Rule};
use tollgate_admin::{Activity, Admin};

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
fn login_key() -> impl KeyExtractor {
    let user = key::from_fn(|head: &RequestHead<'_>| user_of(head.headers()));
    (key::peer_ip(), user)
}

/// The app and its admin, on `store`.
fn app(store: MemoryStore, token: &str) -> Result<Router, Box<dyn std::error::Error>> {
    let per_address = Rule::gcra("login-per-address", 20, Rate::per_minute(20));
    let activity = Activity::new();
    let limits = RateLimitLayer::builder()
        .limiter(Limiter::new(store.clone()))
        .limit(Limit::new(login_rule()?, login_key()))
        .limit(Limit::new(per_address, key::peer_ip()))
        .observe(activity.clone())
        .build()?;
    let admin = Admin::new(&limits, &activity)
        .bearer_token(token)
        .memory_store(&store)
        .router()?;
    let login = post(|headers: HeaderMap| async move {
        let user = user_of(&headers).unwrap_or_default();
        format!("welcome, {user}\n")
    });
    Ok(Router::new()
        .route("/login", login)
        .layer(limits)
        // `nest_service`, not `nest`: axum's `nest` routes `/admin` but not `/admin/`.
        .nest_service("/admin", admin))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    // An unset or guessable token is refused when the router is made, saying how to make one.
    let token = std::env::var("ADMIN_TOKEN").unwrap_or_default();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  for i in $(seq 9); do curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST -H 'user: alice' http://{addr}/login; done");
    println!("  open http://{addr}/admin and sign in with $ADMIN_TOKEN");
    println!(
        "  curl -s -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/admin/api/locked'"
    );
    println!("  curl -s -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/admin/api/find?key=alice'");
    println!("  curl -s -X POST -H \"Authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/admin/api/unblock?rule=login&key=127.0.0.1%E2%90%9Falice'");
    let app = app(MemoryStore::new(), &token)?;
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
    use axum::extract::ConnectInfo;
    use axum::http::{header, StatusCode};
    use http_body_util::BodyExt;
    use tollgate::ManualClock;
    use tower::ServiceExt;

    const TOKEN: &str = "c3000dbcba30a94e90d4be5861183f6b";
    const HOME: &str = "203.0.113.7";
    const ELSEWHERE: &str = "198.51.100.9";

    fn router() -> Router {
        let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
        app(store, TOKEN).unwrap()
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

    /// The admin's lookup of alice's keys, and the unblock of her key from `HOME`.
    const ALICE: &str = "/admin/api/find?key=alice&rule=login";
    const ALICE_UNBLOCK: &str = "/admin/api/unblock?rule=login&key=203.0.113.7%E2%90%9Falice";

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

    /// The admin finds alice's key by her name without consuming anything, with her lock,
    /// and its unblock lifts the lock.
    #[tokio::test]
    async fn the_admin_finds_a_lock_by_the_user_and_lifts_it() {
        let app = router();
        let (status, found) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(found["keys"][0]["key"], "alice", "{found}");
        assert_eq!(found["keys"][0]["remaining"], 5, "{found}");

        let mut statuses = Vec::new();
        for _ in 0..8 {
            statuses.push(send(&app, login("alice")).await.0);
        }
        assert_eq!(statuses[..5], [StatusCode::OK; 5]);
        assert_eq!(statuses[5..], [StatusCode::TOO_MANY_REQUESTS; 3]);
        // Looking consumes nothing: twice the same answer.
        for _ in 0..2 {
            let (status, found) = send(&app, admin("GET", ALICE, Some(TOKEN))).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(found["keys"].as_array().map(Vec::len), Some(1), "{found}");
            let state = &found["keys"][0];
            assert_eq!(state["key"], "203.0.113.7\u{241F}alice", "{state}");
            assert_eq!(state["locked"], true, "{state}");
            assert_eq!(state["admitted"], false, "{state}");
            assert_eq!(state["retry_after_ms"], 900_000, "{state}");
            assert_eq!(state["limit"], 5, "{state}");
        }
        // Bob is not affected.
        assert_eq!(send(&app, login("bob")).await.0, StatusCode::OK);

        let (status, _) = send(&app, admin("POST", ALICE_UNBLOCK, Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let key = "/admin/api/key?rule=login&key=203.0.113.7%E2%90%9Falice";
        let (_, state) = send(&app, admin("GET", key, Some(TOKEN))).await;
        assert_eq!(state["locked"], false, "{state}");
        assert_eq!(state["remaining"], 5, "{state}");
        assert_eq!(send(&app, login("alice")).await.0, StatusCode::OK);
    }

    /// In a real browser (Debian's headless `chromium`): after users are locked out by
    /// traffic, the signed-in page shows the locked keys with the end of their locks, the
    /// rule, the chart and the most denied keys, and an unblock button lifts a lock (the
    /// key leaves the locked keys). Fails, never skips, without Chromium.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_in_a_browser_unblocks_a_limited_key() {
        let app = app(MemoryStore::new(), TOKEN).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = app.clone();
        tokio::spawn(async move {
            let service = served.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, service).await
        });
        let local = || login_from("alice", "127.0.0.1");
        // Other users locked out from addresses of their own, denied fewer times than
        // alice, so that her key tops the list the first unblock button acts on.
        for (n, user) in ["bob", "carol", "dave"].into_iter().enumerate() {
            for _ in 0..8 {
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
        let locked = |html: &str| {
            let at = html.find("id=\"locked\"").expect("a table of locked keys");
            let end = html[at..].find("</table>").map_or(html.len(), |e| at + e);
            html[at..end].to_owned()
        };
        let alice = "<span class=\"part\">alice</span>";
        let before = locked(&page.before);
        assert!(
            before.contains(alice) && before.contains("locked until"),
            "{before}"
        );
        assert_eq!(before.matches("Unblock").count(), 4, "{before}");
        let after = locked(&page.after);
        assert!(!after.contains(alice), "{after}");
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

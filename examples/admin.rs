//! An admin API beside a rate-limited app: look at a key's state and unblock a locked key,
//! built on [`Limiter::peek`] and [`Limiter::reset`], behind a bearer token.
//!
//! - `GET /admin/limits/{rule}/{key}`: the key's quota under the rule (limit, remaining,
//!   reset), whether its next request would be admitted (and if not, when), and whether it
//!   is locked out, as JSON. Nothing is consumed.
//! - `POST /admin/limits/{rule}/{key}/unblock`: clears the key's state and lifts its lock
//!   (every instance sharing the store sees it at once; with a Redis deny cache, every
//!   instance's cache is cleared too). Answers `204`.
//!
//! Both need `Authorization: Bearer <ADMIN_TOKEN>`; the token is compared in constant time
//! (as SHA-256 digests, so its length does not leak either). A missing or wrong token is a
//! `401` that says nothing about the token.
//!
//! The app: `POST /login` allows 5 attempts a minute per user (`User` header); 3 refusals
//! within 10 minutes lock the user out for 15 minutes. Run
//! `ADMIN_TOKEN=$(openssl rand -hex 16) cargo run --example admin` and try the printed
//! lines. Keep the admin routes off the public network (a separate listener or port in
//! production); this example serves both on one for brevity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate::{
    key, ConfigError, Decision, DenyReason, Limiter, MemoryStore, Penalty, Rule, Store,
};

/// What the admin routes need: the limiter, the rules they may act on (by name), and the
/// digest of the token.
struct Admin<St> {
    limiter: Limiter<St>,
    rules: HashMap<String, Rule>,
    token: [u8; 32],
}

/// Login attempts per user: 5 a minute; 3 refusals within 10 minutes lock the user out for
/// 15 minutes.
fn login_rule() -> Result<Rule, ConfigError> {
    Rule::fixed_window("login", 5, Duration::from_secs(60))
        .with_penalty(
            Penalty::lock_for(Duration::from_secs(900))
                .after(3)
                .within(Duration::from_secs(600)),
        )
        .checked()
}

/// The app and its admin API, on any store.
fn app<St: Store + Clone>(limiter: Limiter<St>, token: &str) -> Result<Router, ConfigError> {
    let login = login_rule()?;
    // The rules the admin routes may act on: the app's own, built once.
    let rules = [login.clone()];
    let limits = RateLimitLayer::builder(limiter.clone())
        .limit(Limit::new(login, key::header("user")))
        .build()?;
    let public = Router::new()
        .route("/login", post(|| async { "welcome\n" }))
        .layer(limits);

    let admin = Arc::new(Admin {
        limiter,
        rules: rules
            .into_iter()
            .map(|r| (r.name().to_owned(), r))
            .collect(),
        token: Sha256::digest(token.as_bytes()).into(),
    });
    let admin_routes = Router::new()
        .route("/admin/limits/{rule}/{key}", get(peek::<St>))
        .route("/admin/limits/{rule}/{key}/unblock", post(unblock::<St>))
        .route_layer(middleware::from_fn_with_state(
            admin.clone(),
            authorize::<St>,
        ))
        .with_state(admin);
    Ok(public.merge(admin_routes))
}

/// Lets a request through only with the right bearer token.
async fn authorize<St>(
    State(admin): State<Arc<Admin<St>>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
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
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized\n",
        )
            .into_response();
    }
    next.run(request).await
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

async fn peek<St: Store>(
    State(admin): State<Arc<Admin<St>>>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    let Some(rule) = admin.rules.get(&rule) else {
        return no_such_rule(&admin);
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
        "key": key,
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
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    let Some(rule) = admin.rules.get(&rule) else {
        return no_such_rule(&admin);
    };
    match admin.limiter.reset(rule, &key).await {
        Ok(()) => {
            // An audit line: an authenticated admin's action, so the key it concerns is
            // logged (unlike the layer's own logs, which show keys only as digests).
            tracing::info!(rule = rule.name(), key, "admin: key unblocked");
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
    println!("  curl -s -H \"Authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/limits/login/alice");
    println!("  curl -s -X POST -H \"Authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/limits/login/alice/unblock");
    axum::serve(listener, app(Limiter::new(MemoryStore::new()), &token)?).await?;
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

    fn router() -> Router {
        let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
        app(Limiter::new(store), TOKEN).unwrap()
    }

    fn admin(method: &str, path: &str, token: Option<&str>) -> http::Request<Body> {
        let mut request = http::Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request.body(Body::empty()).unwrap()
    }

    fn login(user: &str) -> http::Request<Body> {
        http::Request::post("/login")
            .header("user", user)
            .body(Body::empty())
            .unwrap()
    }

    async fn send(app: &Router, request: http::Request<Body>) -> (StatusCode, serde_json::Value) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    #[tokio::test]
    async fn without_the_token_nothing_is_shown_or_changed() {
        let app = router();
        let path = "/admin/limits/login/alice";
        for token in [None, Some("wrong"), Some(&TOKEN[1..]), Some("")] {
            let (status, _) = send(&app, admin("GET", path, token)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        }
        let basic = http::Request::get(path)
            .header(header::AUTHORIZATION, format!("Basic {TOKEN}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, basic).await.0, StatusCode::UNAUTHORIZED);

        // Lock alice out; a wrong token cannot unblock her.
        for _ in 0..8 {
            app.clone().oneshot(login("alice")).await.unwrap();
        }
        let (status, _) = send(&app, admin("POST", &format!("{path}/unblock"), Some("x"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            send(&app, login("alice")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    #[tokio::test]
    async fn peek_shows_a_lock_and_unblock_lifts_it() {
        let app = router();
        let path = "/admin/limits/login/alice";
        let (status, state) = send(&app, admin("GET", path, Some(TOKEN))).await;
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
            let (status, state) = send(&app, admin("GET", path, Some(TOKEN))).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(state["locked"], true, "{state}");
            assert_eq!(state["admitted"], false, "{state}");
            assert_eq!(state["retry_after_ms"], 900_000, "{state}");
            assert_eq!(state["limit"], 5, "{state}");
        }
        // Bob is not affected.
        assert_eq!(send(&app, login("bob")).await.0, StatusCode::OK);

        let (status, _) = send(&app, admin("POST", &format!("{path}/unblock"), Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (_, state) = send(&app, admin("GET", path, Some(TOKEN))).await;
        assert_eq!(state["locked"], false, "{state}");
        assert_eq!(state["remaining"], 5, "{state}");
        assert_eq!(send(&app, login("alice")).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn an_unknown_rule_is_a_404_naming_the_rules() {
        let app = router();
        let (status, body) =
            send(&app, admin("GET", "/admin/limits/nope/alice", Some(TOKEN))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["rules"], serde_json::json!(["login"]));
        let (status, _) = send(
            &app,
            admin("POST", "/admin/limits/nope/alice/unblock", Some(TOKEN)),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}

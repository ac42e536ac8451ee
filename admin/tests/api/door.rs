//! The router's door: tokens that cannot be guessed, a limit on failed attempts that
//! limits, sessions that end.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::key;
use tollgate::layer::{Limit, RateLimitLayer};
use tollgate_admin::{Activity, Admin};
use tower::ServiceExt;

use super::{admin, app, from_peer, login_rule, send, TOKEN};

/// Without the token nothing is shown; a browser's unblock without the anti-forgery
/// token is refused; past ten wrong tokens a client's attempts are refused with 429.
#[tokio::test]
async fn credentials_and_forgery_are_checked() {
    let (app, _reload) = app();
    let (status, _) = send(&app, admin("GET", "/admin/api/rules", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(&app, admin("POST", "/admin/unblock", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A signed-in browser (session cookie) posting without the form's token.
    let signin = Request::post("/admin/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={TOKEN}")))
        .unwrap();
    let response = app.clone().oneshot(from_peer(signin)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("SameSite=Strict") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    assert!(
        cookie.contains("Path=/admin;") && cookie.contains("Secure"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let forged = Request::post("/admin/api/unblock?rule=login&key=x")
        .header(header::COOKIE, &session)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, forged).await.0, StatusCode::FORBIDDEN);
    let (status, _) = send(
        &app,
        Request::get("/admin/api/rules")
            .header(header::COOKIE, &session)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    for _ in 0..10 {
        let (status, _) = send(&app, admin("GET", "/admin/api/rules", Some("wrong"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let (status, _) = send(&app, admin("GET", "/admin/api/rules", Some("wrong"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The operator's session, from the same address, is no guess: it is let in.
    let with_session = Request::get("/admin/api/rules").header(header::COOKIE, &session);
    let (status, _) = send(&app, with_session.body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
}

/// Past the limit a guess is not checked: the right token from the guessing client is
/// refused like a wrong one, as a bearer token and in the sign-in form, so 429 tells a
/// guesser nothing; guesses sent at once cannot slip past the count; the token from
/// another client, a session from before, and a browser that signed in before from the
/// guesser's own address (its device cookie, which cannot be forged) still get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_past_the_limit_is_not_checked() {
    let (app, _reload) = app();
    let guesser: SocketAddr = "198.51.100.66:4000".parse().unwrap();
    let operator: SocketAddr = "192.0.2.10:4000".parse().unwrap();
    let status = |r: Request<Body>| async { app.clone().oneshot(r).await.unwrap().status() };
    let (session, device) = {
        let response = app.clone().oneshot(sign_in(TOKEN, None, guesser)).await;
        let response = response.unwrap();
        let mut set = response.headers().get_all(header::SET_COOKIE).iter();
        let mut next = || {
            set.next()
                .unwrap()
                .to_str()
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .to_owned()
        };
        (next(), next())
    };
    assert!(device.starts_with("tollgate_admin_device="), "{device}");
    let bearer = |token: &str, peer: SocketAddr| {
        let mut request = admin("GET", "/admin/api/rules", Some(token));
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    };
    let mut guesses = tokio::task::JoinSet::new();
    for i in 0..50 {
        let (app, guess) = (app.clone(), bearer(&format!("guess-{i}"), guesser));
        guesses.spawn(async move { app.oneshot(guess).await.unwrap().status() });
    }
    let answers = guesses.join_all().await;
    let checked = answers
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert_eq!(checked, 10, "{answers:?}");
    assert_eq!(
        status(bearer(TOKEN, guesser)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(sign_in(TOKEN, None, guesser)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(bearer(TOKEN, operator)).await, StatusCode::OK);
    let mut with_session = Request::get("/admin/api/rules")
        .header(header::COOKIE, &session)
        .body(Body::empty())
        .unwrap();
    with_session.extensions_mut().insert(ConnectInfo(guesser));
    assert_eq!(status(with_session).await, StatusCode::OK);
    let known = |cookie: &str| {
        let mut request = sign_in(TOKEN, None, guesser);
        request
            .headers_mut()
            .insert(header::COOKIE, cookie.parse().unwrap());
        request
    };
    assert_eq!(status(known(&device)).await, StatusCode::SEE_OTHER);
    let forged = format!(
        "tollgate_admin_device={}.{}",
        "1".repeat(32),
        "2".repeat(64)
    );
    assert_eq!(status(known(&forged)).await, StatusCode::TOO_MANY_REQUESTS);
}

fn sign_in(token: &str, origin: Option<&str>, peer: SocketAddr) -> Request<Body> {
    let mut request = Request::post("/admin/login")
        .header(header::HOST, "ops.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(origin) = origin {
        request = request.header(header::ORIGIN, origin);
    }
    let mut request = request.body(Body::from(format!("token={token}"))).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// Failed sign-ins lock out their own client only: a flood of wrong tokens from one IPv6
/// /64 gets 429 there (and not in another /64), where the right token signs in; a form
/// posted from another origin is refused.
#[tokio::test]
async fn failed_sign_ins_do_not_lock_the_operator_out() {
    let (app, _reload) = app();
    let origin = Some("https://ops.example");
    let attacker: SocketAddr = "[2001:db8:1:2::66]:4000".parse().unwrap();
    let neighbour: SocketAddr = "[2001:db8:1:2::77]:4000".parse().unwrap();
    let elsewhere: SocketAddr = "[2001:db8:1:3::1]:4000".parse().unwrap();
    for _ in 0..10 {
        let response = app
            .clone()
            .oneshot(sign_in("wrong", origin, attacker))
            .await;
        assert_eq!(response.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    let status = |r: Request<Body>| async { app.clone().oneshot(r).await.unwrap().status() };
    assert_eq!(
        status(sign_in("wrong", origin, neighbour)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(sign_in("wrong", origin, elsewhere)).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(sign_in(TOKEN, origin, elsewhere)).await,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        status(sign_in(TOKEN, Some("https://evil.example"), elsewhere)).await,
        StatusCode::FORBIDDEN
    );
}

/// Signing out clears the session cookie at the router's path and ends the session: the
/// old cookie, replayed from another address, is refused. The page has the button.
#[tokio::test]
async fn a_session_can_be_signed_out() {
    let (app, _reload) = app();
    let peer: SocketAddr = ([203, 0, 113, 9], 1).into();
    let response = app
        .clone()
        .oneshot(sign_in(TOKEN, None, peer))
        .await
        .unwrap();
    let session = response.headers()[header::SET_COOKIE].to_str().unwrap();
    let session = session.split(';').next().unwrap().to_owned();
    let page = Request::get("/admin").header(header::COOKIE, &session);
    let response = app
        .clone()
        .oneshot(from_peer(page.body(Body::empty()).unwrap()))
        .await
        .unwrap();
    let csrf = response
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .find(|c| c.starts_with("tollgate_admin_csrf="))
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let page = String::from_utf8_lossy(&body).into_owned();
    assert!(page.contains("id=\"logout\""), "{page}");
    let field = "name=\"csrf\" value=\"";
    let at = page.find(field).unwrap() + field.len();
    let token = &page[at..at + 64];
    let logout = Request::post("/admin/logout")
        .header(header::COOKIE, format!("{session}; {csrf}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={token}")))
        .unwrap();
    let response = app.clone().oneshot(from_peer(logout)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cleared = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("tollgate_admin_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    assert!(cleared.contains("Path=/admin;"), "{cleared}");
    let mut replayed = Request::get("/admin/api/rules")
        .header(header::COOKIE, &session)
        .body(Body::empty())
        .unwrap();
    let elsewhere: SocketAddr = ([198, 51, 100, 3], 5000).into();
    replayed.extensions_mut().insert(ConnectInfo(elsewhere));
    let response = app.clone().oneshot(replayed).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

/// A token that could be guessed is refused when the router is made, saying how to make
/// one, and so is no token at all unless the application says, by name, that its own
/// authentication guards it.
#[tokio::test]
async fn guessable_or_missing_tokens_are_refused_at_build() {
    let activity = Activity::new();
    let layer = RateLimitLayer::builder()
        .limit(Limit::new(login_rule(), key::header("user")))
        .observe(activity.clone())
        .build()
        .unwrap();
    let admin = || Admin::new(&layer, &activity);
    let guessable = [
        String::new(),
        "fifteen-bytes-x".to_owned(),
        " ".repeat(16),
        "\t".repeat(16),
        "a".repeat(16),
        " ".repeat(64),
        "a".repeat(64),
    ];
    for token in guessable {
        let refused = admin().bearer_token(token.clone()).router().unwrap_err();
        assert!(
            refused.to_string().contains("openssl rand"),
            "{token:?}: {refused}"
        );
    }
    let refused = admin().router().unwrap_err();
    assert!(refused.to_string().contains("without_token"), "{refused}");
    assert!(admin().without_token().router().is_ok());
    assert!(admin().bearer_token(TOKEN).router().is_ok());
}

//! The page's handlers: the page itself (or the sign-in form), signing in, and the unblock
//! button.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, OriginalUri, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde::Deserialize;

use super::api::{rules_named, WhichKey};
use super::auth::{
    cookie, device_cookie, random, same_origin, session_cleared, session_cookie, set_cookie,
    Access, Attempt, CSRF_COOKIE,
};
use super::render::{self, Lookup, Page};
use super::text::{hex, key_text};
use super::{view, Shared};
use tollgate::layer::RuleInfo;
use tollgate::store::Store;

/// Headers of every page: not cached, not framed (a framed unblock button could be
/// clicked by deceit), nothing loaded from elsewhere, no referrer.
fn page_response(status: StatusCode, html: String, cookies: &[String]) -> Response {
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    for cookie in cookies {
        if let Ok(value) = HeaderValue::from_str(cookie) {
            headers.append(header::SET_COOKIE, value);
        }
    }
    response
}

fn see_other(location: &str, cookies: &[String]) -> Response {
    let mut response = page_response(StatusCode::SEE_OTHER, String::new(), cookies);
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// What the page's address may ask: a key to look up, and what was just done.
#[derive(Deserialize)]
pub(super) struct PageQuery {
    #[serde(flatten)]
    which: WhichKey,
    unblocked: Option<String>,
}

pub(super) async fn index<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Extension(access): Extension<Access>,
    OriginalUri(original): OriginalUri,
    headers: HeaderMap,
    Query(query): Query<PageQuery>,
) -> Response {
    let base = original.path().trim_end_matches('/').to_owned();
    if access == Access::Denied {
        return page_response(StatusCode::OK, render::login(&base, false), &[]);
    }
    // The anti-forgery cookie: the browser's own, or a new one.
    let (csrf_cookie, set) = match cookie(&headers, CSRF_COOKIE) {
        Some(value) if value.len() == 32 => (value.to_owned(), Vec::new()),
        _ => {
            let value = hex(&random()[..16]);
            let scope = shared.cookie_scope(&base);
            let set = set_cookie(scope, CSRF_COOKIE, &value, Duration::from_secs(12 * 3600));
            (value, vec![set])
        }
    };
    let running = shared.layer.rules();
    let rules = view::rules(&running);
    let limiter = shared.layer.limiter();
    let locked = view::locked(limiter, &running, &shared.activity, view::LOCKED_PER_RULE)
        .await
        .map_err(|e| format!("the store failed: {e}"));
    let html = render::page(&Page {
        base: &base,
        rules: &rules,
        decisions: &view::decisions(&running, &shared.activity),
        top: &view::top(&running, &shared.activity, 10),
        locked,
        health: &shared.health(),
        csrf: &shared.secrets.csrf_token(&csrf_cookie),
        lookup: lookup(&shared, &running, &query.which).await,
        notice: query
            .unblocked
            .map(|rule| format!("Unblocked a key of rule {rule}.")),
    });
    page_response(StatusCode::OK, html, &set)
}

/// What the lookup form asked for, if anything: the keys its text names under its rule
/// (under every rule when it names none).
async fn lookup<St: Store>(
    shared: &Shared<St>,
    running: &[RuleInfo],
    which: &WhichKey,
) -> Option<Result<Lookup, String>> {
    let key = which.stored().filter(|k| !k.as_bytes().is_empty())?;
    let name = which.rule.as_deref().filter(|n| !n.is_empty());
    let Ok(rules) = rules_named(running, name) else {
        return Some(Err(format!("no rule named {:?}", name.unwrap_or_default())));
    };
    let limiter = shared.layer.limiter();
    let found = view::find(limiter, &shared.activity, &rules, name.is_some(), &key).await;
    Some(
        found
            .map(|found| Lookup {
                key: key_text(key.as_bytes(), key.is_digest()),
                rule: name.map(str::to_owned),
                found,
            })
            .map_err(|e| format!("the store failed: {e}")),
    )
}

/// The sign-in form's field.
#[derive(Deserialize)]
pub(super) struct SignIn {
    token: String,
}

/// Where the router is mounted, from the path of one of its routes (`route`, such as
/// `/login`): the page's forms and redirects name their targets from it, since a page at
/// `/admin` resolves relative links against `/`.
fn base_of(original: &OriginalUri, route: &str) -> String {
    let path = original.path();
    path.strip_suffix(route).unwrap_or(path).to_owned()
}

/// The page's own address under `base`.
fn page_at(base: &str) -> &str {
    if base.is_empty() {
        "/"
    } else {
        base
    }
}

pub(super) async fn login<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    original: OriginalUri,
    request: axum::extract::Request,
) -> Response {
    let base = base_of(&original, "/login");
    if !same_origin(request.headers()) {
        let html = render::login_with(&base, "Sign in from this page itself.");
        return page_response(StatusCode::FORBIDDEN, html, &[]);
    }
    let attempter = shared.secrets.attempter(&request);
    let device = shared.secrets.device_cookie(request.headers());
    let form = Form::<SignIn>::from_request(request, &()).await;
    let given = form.map(|Form(f)| f.token).unwrap_or_default();
    let attempt = if shared.secrets.has_token() {
        let right = || shared.secrets.token_matches(&given);
        shared.failures.attempt(&attempter, right).await
    } else {
        Attempt::Right
    };
    match attempt {
        Attempt::Right => {
            let scope = shared.cookie_scope(&base);
            let session = session_cookie(scope, &shared.secrets.new_session());
            see_other(page_at(&base), &[session, device_cookie(scope, &device)])
        }
        Attempt::Wrong => page_response(StatusCode::UNAUTHORIZED, render::login(&base, true), &[]),
        Attempt::Refused => {
            let html = render::login_with(&base, "Too many failed attempts: try again later.");
            page_response(StatusCode::TOO_MANY_REQUESTS, html, &[])
        }
    }
}

/// The sign-out button's field.
#[derive(Deserialize)]
pub(super) struct SignOut {
    csrf: Option<String>,
}

/// Ends the browser's session: the router forgets it (its cookie, replayed, is refused),
/// its cookie is cleared, and the sign-in form is shown.
pub(super) async fn logout<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    original: OriginalUri,
    headers: HeaderMap,
    Form(form): Form<SignOut>,
) -> Response {
    let base = base_of(&original, "/logout");
    let csrf = form.csrf.as_deref().unwrap_or_default();
    if !shared.secrets.csrf_valid(&headers, csrf) {
        let html = render::document(
            "tollgate admin",
            "<p>This form is out of date: reload the page and try again.</p>",
            false,
        );
        return page_response(StatusCode::FORBIDDEN, html, &[]);
    }
    shared.secrets.end_session(&headers);
    let cleared = session_cleared(shared.cookie_scope(&base));
    see_other(page_at(&base), &[cleared])
}

/// The unblock button's fields.
#[derive(Deserialize)]
pub(super) struct UnblockForm {
    #[serde(flatten)]
    which: WhichKey,
    csrf: Option<String>,
}

pub(super) async fn unblock<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Extension(access): Extension<Access>,
    original: OriginalUri,
    headers: HeaderMap,
    Form(form): Form<UnblockForm>,
) -> Response {
    let base = base_of(&original, "/unblock");
    let csrf = form.csrf.as_deref().unwrap_or_default();
    if access != Access::Bearer && !shared.secrets.csrf_valid(&headers, csrf) {
        let html = render::document(
            "tollgate admin",
            "<p>This form is out of date: reload the page and try again.</p>",
            false,
        );
        return page_response(StatusCode::FORBIDDEN, html, &[]);
    }
    let running = shared.layer.rules();
    let rule = form
        .which
        .rule
        .as_deref()
        .and_then(|r| view::rule(&running, r));
    let (Some(rule), Some(key)) = (rule, form.which.stored()) else {
        let html = render::document("tollgate admin", "<p>No such rule or key.</p>", false);
        return page_response(StatusCode::BAD_REQUEST, html, &[]);
    };
    match view::unblock(shared.layer.limiter(), &shared.activity, &rule, &key).await {
        Ok(()) => {
            tracing::info!(rule = rule.name(), "admin: key unblocked");
            let name: String = url_encode(rule.name());
            see_other(&format!("{}?unblocked={name}", page_at(&base)), &[])
        }
        Err(e) => super::api::store_failed(&e),
    }
}

/// `text` percent-encoded for a query value.
fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

//! The JSON API: what the page shows, for scripts and dashboards.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::auth::Access;
use super::text::{typed_digest, typed_key, unhex};
use super::{view, Shared};
use tollgate::layer::RuleInfo;
use tollgate::{store::Store, Rule, StoreError, StoredKey};

pub(super) async fn rules<St: Store>(State(shared): State<Arc<Shared<St>>>) -> Response {
    Json(view::rules(&shared.layer.rules())).into_response()
}

pub(super) async fn decisions<St: Store>(State(shared): State<Arc<Shared<St>>>) -> Response {
    Json(view::decisions(&shared.layer.rules(), &shared.activity)).into_response()
}

/// How many keys per rule `top` lists.
#[derive(Deserialize)]
pub(super) struct TopQuery {
    n: Option<usize>,
}

pub(super) async fn top<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Query(query): Query<TopQuery>,
) -> Response {
    let n = query.n.unwrap_or(10);
    Json(view::top(&shared.layer.rules(), &shared.activity, n)).into_response()
}

pub(super) async fn locked<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Query(query): Query<TopQuery>,
) -> Response {
    let n = query.n.unwrap_or(view::LOCKED_PER_RULE);
    let limiter = shared.layer.limiter();
    match view::locked(limiter, &shared.layer.rules(), &shared.activity, n).await {
        Ok(locked) => Json(locked).into_response(),
        Err(e) => store_failed(&e),
    }
}

pub(super) async fn health<St: Store>(State(shared): State<Arc<Shared<St>>>) -> Response {
    Json(shared.health()).into_response()
}

/// A key named in a query or a form: typed (`key`, `␟` between a tuple's parts) or exact
/// (`key_hex`), and whether it is the store's digest of a longer key (`digested=true`).
/// Every field is text, so that forms flattening it into theirs can read it.
#[derive(Deserialize)]
pub(super) struct WhichKey {
    pub(super) rule: Option<String>,
    pub(super) key: Option<String>,
    pub(super) key_hex: Option<String>,
    pub(super) digested: Option<String>,
}

impl WhichKey {
    /// The key as the store keeps it, if the key is named well: exact bytes given as a
    /// digest must be in the form the store keeps digests in; typed text is the key it
    /// spells, or the digest it shows (`sha256:` and 64 hex digits, as the page shows one).
    pub(super) fn stored(&self) -> Option<StoredKey<'static>> {
        match (&self.key_hex, &self.key) {
            (Some(hex), _) => {
                let bytes = unhex(hex)?;
                if self.digested.as_deref() == Some("true") {
                    StoredKey::from_stored(&bytes)
                        .filter(StoredKey::is_digest)
                        .map(StoredKey::into_owned)
                } else {
                    Some(StoredKey::of(&bytes).into_owned())
                }
            }
            (None, Some(text)) => match typed_digest(text) {
                Some(digest) => StoredKey::from_stored(&digest).map(StoredKey::into_owned),
                None => Some(StoredKey::of(&typed_key(text)).into_owned()),
            },
            (None, None) => None,
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

pub(super) fn store_failed(e: &StoreError) -> Response {
    tracing::warn!(error = %e, "admin: the store failed");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the rate limit store is unavailable",
    )
}

pub(super) async fn key<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Query(which): Query<WhichKey>,
) -> Response {
    let running = shared.layer.rules();
    let Some(rule) = which.rule.as_deref().and_then(|r| view::rule(&running, r)) else {
        return error(StatusCode::NOT_FOUND, "no such rule");
    };
    let Some(key) = which.stored() else {
        return error(StatusCode::BAD_REQUEST, "name the key: key= or key_hex=");
    };
    match view::key_state(shared.layer.limiter(), &rule, &key).await {
        Ok(state) => Json(state).into_response(),
        Err(e) => store_failed(&e),
    }
}

/// The rules a lookup searches: the one named (`Err` if there is none of that name), or
/// every running rule when none is named.
pub(super) fn rules_named(running: &[RuleInfo], name: Option<&str>) -> Result<Vec<Rule>, ()> {
    match name.filter(|n| !n.is_empty()) {
        Some(name) => view::rule(running, name).map(|r| vec![r]).ok_or(()),
        None => Ok(running.iter().map(|i| i.rule.clone()).collect()),
    }
}

pub(super) async fn find<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Query(which): Query<WhichKey>,
) -> Response {
    let running = shared.layer.rules();
    let Ok(rules) = rules_named(&running, which.rule.as_deref()) else {
        return error(StatusCode::NOT_FOUND, "no such rule");
    };
    let Some(key) = which.stored().filter(|k| !k.as_bytes().is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "name the key: key= or key_hex=");
    };
    let named = which.rule.as_deref().is_some_and(|r| !r.is_empty());
    let limiter = shared.layer.limiter();
    match view::find(limiter, &shared.activity, &rules, named, &key).await {
        Ok(found) => Json(found).into_response(),
        Err(e) => store_failed(&e),
    }
}

pub(super) async fn unblock<St: Store>(
    State(shared): State<Arc<Shared<St>>>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    Query(which): Query<WhichKey>,
) -> Response {
    if access != Access::Bearer {
        let token = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
        if !token.is_some_and(|t| shared.secrets.csrf_valid(&headers, t)) {
            return error(StatusCode::FORBIDDEN, "missing or wrong anti-forgery token");
        }
    }
    let running = shared.layer.rules();
    let Some(rule) = which.rule.as_deref().and_then(|r| view::rule(&running, r)) else {
        return error(StatusCode::NOT_FOUND, "no such rule");
    };
    let Some(key) = which.stored() else {
        return error(StatusCode::BAD_REQUEST, "name the key: key= or key_hex=");
    };
    match view::unblock(shared.layer.limiter(), &shared.activity, &rule, &key).await {
        Ok(()) => {
            tracing::info!(rule = rule.name(), "admin: key unblocked");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => store_failed(&e),
    }
}

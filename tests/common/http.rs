//! Reading what the layer wrote on a response.
#![allow(dead_code)]

use http::Response;

/// The response's `RateLimit-Policy` header, or an empty string when it has none.
pub fn policy(res: &Response<impl Sized>) -> String {
    res.headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

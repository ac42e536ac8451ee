//! What a client sees: `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit` headers,
//! legacy `X-RateLimit-*`, and the 429 or gRPC `RESOURCE_EXHAUSTED` rejection.
//!
//! The headers follow draft-ietf-httpapi-ratelimit-headers (08 and later), one list item
//! per rule, in structured-field syntax:
//!
//! ```text
//! RateLimit-Policy: "sms-min";q=1;w=60, "sms-hour";q=5;w=3600
//! RateLimit: "sms-min";r=0;t=42, "sms-hour";r=4;t=3542
//! ```
//!
//! `q` and `w` are the rule's quota and the period over which it is restored
//! ([`Algorithm::quota`](crate::algorithm::Algorithm::quota)); `r` is what remains, `t` the
//! seconds until the quota is whole again. Times are whole seconds, rounded up, so a client
//! that waits as told is never early.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::decision::{DenyReason, Outcome, RuleOutcome};
use crate::key::KeyError;
use crate::rule::Rule;

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (seconds from now).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `d` in whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `Retry-After` seconds for a wait of `d`: rounded up and at least 1, so a client is
/// never told to retry at once when it was just refused.
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// Which headers the layer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct HeaderOptions {
    /// Also on admitted responses (always on rejections).
    pub(crate) on_allowed: bool,
    /// Also `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub(crate) legacy: bool,
}

/// Writes `RateLimit-Policy` and `RateLimit` (and the legacy headers if asked) for `rules`.
pub(crate) fn write_rate_limit_headers<'a>(
    headers: &mut HeaderMap,
    rules: impl Iterator<Item = (&'a Rule, &'a RuleOutcome)> + Clone,
    legacy: bool,
) {
    let mut policy = String::new();
    let mut state = String::new();
    // The legacy headers describe one rule: the one with the least left.
    let mut tightest: Option<&RuleOutcome> = None;
    for (rule, outcome) in rules {
        let (q, w) = rule.algorithm().quota();
        let sep = if policy.is_empty() { "" } else { ", " };
        let _ = write!(
            policy,
            "{sep}\"{}\";q={q};w={}",
            rule.name(),
            ceil_secs(w).max(1)
        );
        let _ = write!(
            state,
            "{sep}\"{}\";r={};t={}",
            rule.name(),
            outcome.info.remaining,
            ceil_secs(outcome.info.reset)
        );
        let tighter = match tightest {
            None => true,
            Some(t) => {
                (
                    outcome.info.remaining,
                    std::cmp::Reverse(outcome.info.reset),
                ) < (t.info.remaining, std::cmp::Reverse(t.info.reset))
            }
        };
        if tighter {
            tightest = Some(outcome);
        }
    }
    // Rule names are validated to a token-safe alphabet, so these never fail.
    if let Ok(v) = HeaderValue::try_from(policy) {
        headers.insert(RATELIMIT_POLICY, v);
    }
    if let Ok(v) = HeaderValue::try_from(state) {
        headers.insert(RATELIMIT, v);
    }
    if let (true, Some(t)) = (legacy, tightest) {
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(t.info.limit));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(t.info.remaining));
        headers.insert(
            X_RATELIMIT_RESET,
            HeaderValue::from(ceil_secs(t.info.reset)),
        );
    }
}

/// Why the layer refuses a request.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum RejectionKind<'a> {
    /// A rule denied it.
    Limited(&'a Outcome),
    /// A rule's key could not be found and the rule's policy is to reject (400), or the
    /// server cannot provide it (500).
    Key(&'a KeyError),
    /// The store failed and the failure policy is [`FailClosed`](crate::layer::FailurePolicy::FailClosed) (503).
    StoreUnavailable,
}

/// A refused request, as the rejection function sees it; see
/// [`RateLimitLayer::on_reject`](crate::layer::RateLimitLayer::on_reject).
#[derive(Debug)]
pub struct Rejection<'a> {
    pub(crate) kind: RejectionKind<'a>,
    pub(crate) grpc: bool,
    pub(crate) rules: &'a [(&'a Rule, RuleOutcome)],
    pub(crate) legacy: bool,
}

impl<'a> Rejection<'a> {
    /// Why it is refused.
    pub fn kind(&self) -> RejectionKind<'a> {
        self.kind
    }

    /// Whether it is a gRPC request (`content-type: application/grpc…`).
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// Each checked rule and what it decided (empty unless [`RejectionKind::Limited`]).
    pub fn rules(&self) -> impl Iterator<Item = (&'a Rule, &'a RuleOutcome)> + Clone {
        self.rules.iter().map(|(r, o)| (*r, o))
    }

    /// The wait before a retry can succeed, for a [`RejectionKind::Limited`] request that
    /// waiting can help.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            RejectionKind::Limited(outcome) => outcome.decision.denial()?.retry_after,
            _ => None,
        }
    }

    /// The HTTP status of the default response: 429, 400 for a missing key, 500 for a key
    /// the server cannot provide, 503 for a failed store.
    pub fn status(&self) -> StatusCode {
        match self.kind {
            RejectionKind::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            RejectionKind::Key(e) if e.kind() == crate::key::KeyErrorKind::Misconfigured => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            RejectionKind::Key(_) => StatusCode::BAD_REQUEST,
            RejectionKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC status code of the default response: 8 (`RESOURCE_EXHAUSTED`), 3
    /// (`INVALID_ARGUMENT`), 13 (`INTERNAL`) or 14 (`UNAVAILABLE`).
    pub fn grpc_status(&self) -> u8 {
        match self.status() {
            StatusCode::TOO_MANY_REQUESTS => 8,
            StatusCode::BAD_REQUEST => 3,
            StatusCode::SERVICE_UNAVAILABLE => 14,
            _ => 13,
        }
    }

    /// A one-line description for the client.
    pub fn message(&self) -> String {
        match self.kind {
            RejectionKind::Limited(outcome) => {
                let reason = match outcome.decision.denial().map(|d| d.reason) {
                    Some(DenyReason::Locked) => "temporarily locked out after repeated limits",
                    Some(DenyReason::CostExceedsCapacity) => {
                        "request costs more than the rate limit can ever admit"
                    }
                    _ => "rate limit exceeded",
                };
                match self.retry_after() {
                    Some(d) => format!("{reason}; retry after {} s", retry_after_secs(d)),
                    None => reason.to_owned(),
                }
            }
            RejectionKind::Key(e) => e.to_string(),
            RejectionKind::StoreUnavailable => "rate limiter unavailable".to_owned(),
        }
    }

    /// The headers every default rejection carries: `Retry-After` (whole seconds, rounded
    /// up, at least 1) and the rate-limit headers of the checked rules.
    pub fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(d) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
        }
        if !self.rules.is_empty() {
            write_rate_limit_headers(&mut headers, self.rules(), self.legacy);
        }
        headers
    }

    /// The response the layer sends by default: for HTTP the [`status`](Self::status) with
    /// the [`headers`](Self::headers) and the [`message`](Self::message) as a plain-text
    /// body; for gRPC an HTTP 200 trailers-only response with `grpc-status` and
    /// `grpc-message` (a tonic client sees `Code::ResourceExhausted` for a limit).
    pub fn default_response(&self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::new());
        let mut headers = self.headers();
        let message = self.message();
        if self.grpc {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(
                GRPC_STATUS,
                HeaderValue::from(u16::from(self.grpc_status())),
            );
            if let Ok(v) = HeaderValue::from_str(&grpc_percent_encode(&message)) {
                headers.insert(GRPC_MESSAGE, v);
            }
        } else {
            *response.status_mut() = self.status();
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            let mut body = message;
            body.push('\n');
            *response.body_mut() = Bytes::from(body);
        }
        *response.headers_mut() = headers;
        response
    }
}

/// Whether `headers` belong to a gRPC request.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC spec's percent-encoding of `grpc-message`: printable ASCII except `%` as is.
fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7E).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{Decision, Denial, RateLimitInfo};

    #[test]
    fn seconds_round_up_and_a_deny_never_says_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn headers_have_one_item_per_rule() {
        let min = Rule::fixed_window("sms-min", 1, Duration::from_secs(60)).unwrap();
        let hour = Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600)).unwrap();
        let deny = Decision::Deny(Denial {
            reason: DenyReason::Limited,
            retry_after: Some(Duration::from_millis(41_200)),
        });
        let rules = [
            (
                &min,
                RuleOutcome {
                    decision: deny,
                    info: RateLimitInfo {
                        limit: 1,
                        remaining: 0,
                        reset: Duration::from_millis(41_200),
                    },
                },
            ),
            (
                &hour,
                RuleOutcome {
                    decision: Decision::Allow,
                    info: RateLimitInfo {
                        limit: 5,
                        remaining: 4,
                        reset: Duration::from_secs(3541),
                    },
                },
            ),
        ];
        let outcome = Outcome {
            decision: deny,
            rules: rules.iter().map(|(_, o)| *o).collect(),
            admission: None,
        };
        let rejection = Rejection {
            kind: RejectionKind::Limited(&outcome),
            grpc: false,
            rules: &rules,
            legacy: true,
        };
        let res = rejection.default_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = res.headers();
        assert_eq!(h[RETRY_AFTER], "42");
        assert_eq!(
            h[RATELIMIT_POLICY],
            "\"sms-min\";q=1;w=60, \"sms-hour\";q=5;w=3600"
        );
        assert_eq!(
            h[RATELIMIT],
            "\"sms-min\";r=0;t=42, \"sms-hour\";r=4;t=3541"
        );
        assert_eq!(h[X_RATELIMIT_LIMIT], "1");
        assert_eq!(h[X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[X_RATELIMIT_RESET], "42");
        assert_eq!(
            res.body(),
            &Bytes::from("rate limit exceeded; retry after 42 s\n")
        );

        let grpc = Rejection {
            grpc: true,
            ..rejection
        }
        .default_response();
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()[GRPC_STATUS], "8");
        assert_eq!(
            grpc.headers()[GRPC_MESSAGE],
            "rate limit exceeded; retry after 42 s"
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_percent_encode("a b%ü"), "a b%25%C3%BC");
    }
}

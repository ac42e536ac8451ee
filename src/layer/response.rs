//! What a client sees: `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit` headers,
//! legacy `X-RateLimit-*`, and the 429 or gRPC `RESOURCE_EXHAUSTED` rejection.
//!
//! The headers follow draft-ietf-httpapi-ratelimit-headers-11 (the structured-field syntax
//! of draft 08 and later), one list item per rule:
//!
//! ```text
//! RateLimit-Policy: "sms-min";q=1;w=60, "sms-hour";q=5;w=3600
//! RateLimit: "sms-min";r=0;t=42, "sms-hour";r=4;t=3542
//! ```
//!
//! `q` and `w` are the rule's quota and the period over which it is restored
//! (a window's limit and length; a bucket's capacity and the time it takes to refill or
//! drain from empty); `r` is what remains now.
//! `t` is the draft's effective window, the seconds until more quota comes back:
//!
//! - for a rule that refused the request, the wait until that request would pass, so the
//!   rule that decided a 429 has `t` equal to `Retry-After`;
//! - during a penalty lock, `r=0` and `t` is the time left on the lock, whatever the rule's
//!   own quota says (a lock refuses everything);
//! - for a rule that did not refuse, the seconds until its quota is whole again (exact for
//!   fixed windows; the refilling algorithms may give some back sooner).
//!
//! Times are whole seconds, rounded up, so a client that waits as told is never early. The
//! legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` describe one rule: on a rejection
//! the one that decided `Retry-After`, otherwise the one with the least left.
//!
//! A gRPC request (`content-type` exactly `application/grpc` or `application/grpc+…`) gets
//! HTTP 200 with `grpc-status`, `grpc-message` and, for a limit or an unavailable store,
//! `grpc-status-details-bin`: a `google.rpc.Status` with a `RetryInfo` (the exact wait) and
//! a `QuotaFailure` naming each refusing rule, which gRPC clients' retry policies read.
//! grpc-web (`application/grpc-web…`) gets the same in its own content type; the rest, HTTP.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use super::headers::{ceil_secs, retry_after_secs, RateLimitHeaders};
use crate::decision::{DenyReason, Outcome, RuleOutcome};
use crate::key::{KeyError, KeyErrorKind, RequestHead};
use crate::rule::Rule;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The `Retry-After` of a fail-closed 503: the outage has no known end; a second spares
/// the store a storm of retries yet notices its return.
const STORE_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

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

/// The content type a rejection of a gRPC request answers in, told by the request's exact
/// content type; `None`: HTTP. `application/grpc`, `application/grpc+proto`, … are gRPC;
/// `application/grpc-web…` is grpc-web (which shares the prefix but not the framing).
fn grpc_answer(headers: &HeaderMap) -> Option<&'static str> {
    let media = headers.get(CONTENT_TYPE)?.as_bytes();
    let media = media.split(|&b| b == b';').next().unwrap_or_default();
    let media = media.trim_ascii();
    // Names a subtype and an optional `+suffix` (`application/grpc-web+proto`).
    let is = |subtype: &[u8]| {
        let n = subtype.len();
        media.len() >= n
            && media[..n].eq_ignore_ascii_case(subtype)
            && (media.len() == n || media[n] == b'+')
    };
    let answers = [
        (&b"application/grpc"[..], "application/grpc"),
        (b"application/grpc-web", "application/grpc-web+proto"),
        (
            b"application/grpc-web-text",
            "application/grpc-web-text+proto",
        ),
    ];
    let answer = answers.into_iter().find(|(asked, _)| is(asked));
    answer.map(|(_, answer)| answer)
}

/// A refused request, as the rejection function sees it; see
/// [`RateLimitLayerBuilder::on_reject`](crate::layer::RateLimitLayerBuilder::on_reject).
/// Built only for a refused request: an admitted one pays nothing for it. Its parts are
/// fields, as a [`DecisionEvent`](crate::layer::DecisionEvent)'s are.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// Why it is refused.
    pub kind: RejectionKind<'a>,
    /// The refused request's head: method, URI, headers (`Accept`, …), extensions, and
    /// [`route`](RequestHead::route), the route-table pattern it matched (else axum's
    /// `MatchedPath`).
    pub request: RequestHead<'a>,
    /// Each enforced rule checked and what it decided (empty unless
    /// [`RejectionKind::Limited`]; rules in shadow are left out).
    pub rules: &'a [(&'a Rule, RuleOutcome)],
    /// Its gRPC answer's content type (see [`grpc_answer`]); `None`: HTTP.
    grpc: Option<&'static str>,
    legacy: bool,
}

impl<'a> Rejection<'a> {
    pub(crate) fn new(
        kind: RejectionKind<'a>,
        request: RequestHead<'a>,
        rules: &'a [(&'a Rule, RuleOutcome)],
        legacy: bool,
    ) -> Self {
        Self {
            kind,
            grpc: grpc_answer(request.headers()),
            request,
            rules,
            legacy,
        }
    }

    /// Whether it is a gRPC request: `content-type` is exactly `application/grpc` or
    /// `application/grpc+…` (grpc-web is not).
    pub fn is_grpc(&self) -> bool {
        self.grpc == Some("application/grpc")
    }

    /// The wait before a retry can succeed: for a [`RejectionKind::Limited`] request that
    /// waiting can help, the exact wait; for [`RejectionKind::StoreUnavailable`], one second.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            RejectionKind::Limited(outcome) => outcome.decision.denial()?.retry_after,
            RejectionKind::StoreUnavailable => Some(STORE_UNAVAILABLE_RETRY_AFTER),
            RejectionKind::Key(_) => None,
        }
    }

    /// The HTTP status of the default response (see [`default_response`](Self::default_response))
    /// and its gRPC code (8 is `RESOURCE_EXHAUSTED`).
    fn codes(&self) -> (StatusCode, u8) {
        match self.kind {
            RejectionKind::Limited(_) => (StatusCode::TOO_MANY_REQUESTS, 8),
            RejectionKind::Key(e) if e.kind() == KeyErrorKind::Misconfigured => {
                (StatusCode::INTERNAL_SERVER_ERROR, 13)
            }
            RejectionKind::Key(_) => (StatusCode::BAD_REQUEST, 3),
            RejectionKind::StoreUnavailable => (StatusCode::SERVICE_UNAVAILABLE, 14),
        }
    }

    /// A one-line description for the client; a key the server cannot provide (a
    /// configuration mistake, logged with its fix) is only "internal server error".
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
            RejectionKind::Key(e) if e.kind() == KeyErrorKind::Misconfigured => {
                "internal server error".to_owned()
            }
            RejectionKind::Key(e) => e.to_string(),
            RejectionKind::StoreUnavailable => "rate limiter unavailable".to_owned(),
        }
    }

    /// `Retry-After` and the rate-limit headers of the checked rules.
    pub(crate) fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(d) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(d)));
        }
        let denied = match self.kind {
            RejectionKind::Limited(outcome) => Some(outcome.decision),
            _ => None,
        };
        let rules = self.rules.iter().map(|(r, o)| (*r, o));
        if let Some(ours) = RateLimitHeaders::new(rules, |_| None, self.legacy, denied) {
            ours.merge_into(&mut headers);
        }
        headers
    }

    /// The protobuf-encoded `google.rpc.Status` (see the [module docs](self)); `None` when it
    /// adds nothing to `grpc-status` and `grpc-message` (a missing key).
    pub(crate) fn grpc_status_details(&self) -> Option<Vec<u8>> {
        let retry = self.retry_after();
        let violations = self
            .rules
            .iter()
            .filter_map(|(rule, o)| Some((rule, o.decision.denial()?)));
        let mut quota_failure = Vec::new();
        for (rule, denial) in violations {
            let (q, w) = rule.algorithm().quota();
            let w = ceil_secs(w).max(1);
            let description = match denial.reason {
                DenyReason::Locked => format!("locked out after repeated limits of {q} per {w} s"),
                DenyReason::CostExceedsCapacity => {
                    format!("request costs more than {q} per {w} s can ever admit")
                }
                DenyReason::Limited => format!("rate limit of {q} per {w} s exceeded"),
            };
            let mut violation = Vec::new();
            proto::string(&mut violation, 1, rule.name());
            proto::string(&mut violation, 2, &description);
            proto::bytes(&mut quota_failure, 1, &violation);
        }
        if retry.is_none() && quota_failure.is_empty() {
            return None;
        }
        let mut status = Vec::new();
        proto::varint_field(&mut status, 1, u64::from(self.codes().1));
        proto::string(&mut status, 2, &self.message());
        if let Some(wait) = retry {
            // A `google.protobuf.Duration` holds at most 10,000 years.
            let wait = wait.min(Duration::from_secs(315_576_000_000));
            let mut duration = Vec::new();
            proto::varint_field(&mut duration, 1, wait.as_secs());
            proto::varint_field(&mut duration, 2, u64::from(wait.subsec_nanos()));
            let mut retry_info = Vec::new();
            proto::bytes(&mut retry_info, 1, &duration);
            proto::any(&mut status, "RetryInfo", &retry_info);
        }
        if !quota_failure.is_empty() {
            proto::any(&mut status, "QuotaFailure", &quota_failure);
        }
        Some(status)
    }

    /// The response the layer sends by default, the start of a response of your own: for
    /// HTTP its status (429, 400 for a missing key, 500 for a key the server cannot
    /// provide, 503 for a failed store) with `Retry-After` (whole seconds, rounded up, at
    /// least 1), the rate-limit headers of the checked rules, and the
    /// [`message`](Self::message) as a plain-text body; for gRPC (and grpc-web) a
    /// trailers-only answer, as the [module docs](self) say (tonic: `Code::ResourceExhausted`).
    pub fn default_response(&self) -> Response<Bytes> {
        let mut response = Response::new(Bytes::new());
        let mut headers = self.headers();
        let message = self.message();
        if let Some(content_type) = self.grpc {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(self.codes().1)));
            if let Ok(v) = HeaderValue::from_str(&grpc_percent_encode(&message)) {
                headers.insert(GRPC_MESSAGE, v);
            }
            if let Some(details) = self.grpc_status_details() {
                if let Ok(v) = HeaderValue::try_from(base64_unpadded(&details)) {
                    headers.insert(GRPC_STATUS_DETAILS, v);
                }
            }
        } else {
            *response.status_mut() = self.codes().0;
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

/// The protobuf encodings `google.rpc.Status` needs, by hand: gRPC requests arrive without
/// the `tonic` feature, and a handful of fields needs no dependency. Zero scalars left out.
mod proto {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8 & 0x7F) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A varint field (wire type 0).
    pub(super) fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
        if v != 0 {
            varint(out, field << 3);
            varint(out, v);
        }
    }

    /// A length-delimited field (wire type 2): bytes or an embedded message.
    pub(super) fn bytes(out: &mut Vec<u8>, field: u64, v: &[u8]) {
        varint(out, (field << 3) | 2);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }

    pub(super) fn string(out: &mut Vec<u8>, field: u64, v: &str) {
        if !v.is_empty() {
            bytes(out, field, v.as_bytes());
        }
    }

    /// A `google.protobuf.Any` of the `google.rpc` message `message` as field 3 of
    /// `google.rpc.Status` (`details`).
    pub(super) fn any(status: &mut Vec<u8>, message: &str, value: &[u8]) {
        let type_url = format!("type.googleapis.com/google.rpc.{message}");
        let mut any = Vec::with_capacity(type_url.len() + value.len() + 6);
        string(&mut any, 1, &type_url);
        bytes(&mut any, 2, value);
        bytes(status, 3, &any);
    }
}

/// Standard base64 without padding, as gRPC sends `-bin` metadata.
fn base64_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 0x3F) as usize]));
        }
    }
    out
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
    use crate::layer::headers::{
        RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
    };

    /// A store's retry of `Duration::MAX` reaches a gRPC client as the longest delay a
    /// `google.protobuf.Duration` holds (10,000 years, in a signed field), not a negative one.
    #[test]
    fn an_endless_retry_is_the_longest_proto_duration() {
        use prost::Message as _;
        let rule = Rule::fixed_window("r", 1, Duration::from_secs(60));
        let deny = Decision::Deny(Denial {
            reason: DenyReason::Limited,
            retry_after: Some(Duration::MAX),
        });
        let info = RateLimitInfo {
            limit: 1,
            remaining: 0,
            reset: Duration::MAX,
        };
        let rules = [(
            &rule,
            RuleOutcome {
                decision: deny,
                info,
            },
        )];
        let outcome = Outcome {
            decision: deny,
            rules: rules.iter().map(|(_, o)| *o).collect(),
            admission: None,
        };
        let request = http::Request::post("/s.S/M").body(()).unwrap();
        let head = RequestHead::from_request(&request);
        let rejection = Rejection::new(RejectionKind::Limited(&outcome), head, &rules, true);
        let details = rejection.grpc_status_details().unwrap();
        let status = tonic_types::pb::Status::decode(&details[..]).unwrap();
        let retry = tonic_types::pb::RetryInfo::decode(&status.details[0].value[..]).unwrap();
        let delay = retry.retry_delay.unwrap();
        assert_eq!((delay.seconds, delay.nanos), (315_576_000_000, 0));
    }

    /// A rejection carries one header item per rule, and over gRPC status 8 with
    /// `RetryInfo` and a `QuotaFailure` naming the rule that denied.
    #[test]
    fn headers_have_one_item_per_rule() {
        let min = Rule::fixed_window("sms-min", 1, Duration::from_secs(60));
        let hour = Rule::fixed_window("sms-hour", 5, Duration::from_secs(3600));
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
        let request = http::Request::get("/sms").body(()).unwrap();
        let rejection = Rejection::new(
            RejectionKind::Limited(&outcome),
            RequestHead::from_request(&request),
            &rules,
            true,
        );
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

        let request = http::Request::post("/sms.Sms/Send")
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .unwrap();
        let rejection = Rejection::new(
            RejectionKind::Limited(&outcome),
            RequestHead::from_request(&request),
            &rules,
            true,
        );
        let grpc = rejection.default_response();
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()[GRPC_STATUS], "8");
        assert_eq!(
            grpc.headers()[GRPC_MESSAGE],
            "rate limit exceeded; retry after 42 s"
        );

        // The details decode with a real protobuf library as google.rpc.Status.
        use prost::Message as _;
        let details = rejection.grpc_status_details().unwrap();
        let status = tonic_types::pb::Status::decode(&details[..]).unwrap();
        assert_eq!(status.code, 8);
        assert_eq!(status.message, "rate limit exceeded; retry after 42 s");
        assert_eq!(status.details.len(), 2);
        assert_eq!(
            status.details[0].type_url,
            "type.googleapis.com/google.rpc.RetryInfo"
        );
        let retry = tonic_types::pb::RetryInfo::decode(&status.details[0].value[..]).unwrap();
        let delay = retry.retry_delay.unwrap();
        assert_eq!((delay.seconds, delay.nanos), (41, 200_000_000));
        assert_eq!(
            status.details[1].type_url,
            "type.googleapis.com/google.rpc.QuotaFailure"
        );
        let quota = tonic_types::pb::QuotaFailure::decode(&status.details[1].value[..]).unwrap();
        assert_eq!(quota.violations.len(), 1);
        assert_eq!(quota.violations[0].subject, "sms-min");
        assert_eq!(
            quota.violations[0].description,
            "rate limit of 1 per 60 s exceeded"
        );
    }

    /// Base64 output uses the standard alphabet without padding.
    #[test]
    fn base64_is_standard_and_unpadded() {
        assert_eq!(base64_unpadded(b""), "");
        assert_eq!(base64_unpadded(b"f"), "Zg");
        assert_eq!(base64_unpadded(b"fo"), "Zm8");
        assert_eq!(base64_unpadded(b"foo"), "Zm9v");
        assert_eq!(base64_unpadded(b"foob"), "Zm9vYg");
        assert_eq!(base64_unpadded(&[0xFB, 0xFF]), "+/8");
    }

    /// A request is gRPC, gRPC-Web or gRPC-Web text only for exactly those content types,
    /// with a suffix or parameters; anything else is plain HTTP.
    #[test]
    fn grpc_is_its_exact_content_type() {
        let of = |ct: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            grpc_answer(&headers)
        };
        let grpc = "application/grpc";
        let (web, web_text) = (
            "application/grpc-web+proto",
            "application/grpc-web-text+proto",
        );
        assert_eq!(of("application/grpc"), Some(grpc));
        assert_eq!(of("application/grpc+proto"), Some(grpc));
        assert_eq!(of("application/grpc; charset=utf-8"), Some(grpc));
        assert_eq!(of("application/grpc-web"), Some(web));
        assert_eq!(of("application/grpc-web+json"), Some(web));
        assert_eq!(of("application/grpc-web-text+proto"), Some(web_text));
        assert_eq!(of("application/grpcx"), None);
        assert_eq!(of("application/grpc-webx"), None);
        assert_eq!(of("text/plain"), None);
        assert_eq!(grpc_answer(&HeaderMap::new()), None);
    }

    /// A gRPC message is percent-encoded, `%` and non-ASCII bytes included.
    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_percent_encode("a b%ü"), "a b%25%C3%BC");
    }
}

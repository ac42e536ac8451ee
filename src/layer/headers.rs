//! The rate-limit headers of a response, rendered, on rejections and admitted responses
//! alike; what each figure means is told in the [`response`](super::response) module's docs.

use std::cell::Cell;
use std::cmp::Reverse;
use std::time::Duration;

use bytes::BytesMut;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::decision::{Decision, Denial, DenyReason, RuleOutcome};
use crate::rule::Rule;

pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// `d` in whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The `Retry-After` seconds for a wait of `d`: rounded up, at least 1 (never "retry now").
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// What a rule advertises in `RateLimit`: the units available now and the seconds until
/// more come back (see the module docs).
fn advertised(outcome: &RuleOutcome) -> (u64, u64) {
    match outcome.decision {
        // A lock refuses everything until it ends, whatever the algorithm's state says.
        Decision::Deny(Denial {
            reason: DenyReason::Locked,
            retry_after,
        }) => (0, retry_after.map_or(0, retry_after_secs)),
        Decision::Deny(Denial {
            retry_after: Some(wait),
            ..
        }) => (outcome.info.remaining, retry_after_secs(wait)),
        _ => (outcome.info.remaining, ceil_secs(outcome.info.reset)),
    }
}

/// The rate-limit headers of one response, rendered. A response's list is a slice of its
/// thread's spare buffer; the policy list is usually a cached value whose clone allocates
/// nothing.
pub(crate) struct RateLimitHeaders {
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
    /// The legacy headers' (limit, remaining, reset), if asked for.
    legacy: Option<(u64, u64, u64)>,
}

/// A header list, rendered item by item.
struct List(BytesMut);

/// The size of a thread's spare buffer for header values, and the least room left in it
/// for a response's values (renewed below that).
const SPARE_BYTES: usize = 1024;
const SPARE_LEAST: usize = 128;

thread_local! {
    /// Where this thread writes the header values of its responses: one allocation serves
    /// a few dozen responses, each value a shared slice of it, and is freed with the last
    /// of their headers. An allocation per response costs more than the rest of a header.
    static SPARE: Cell<Option<BytesMut>> = const { Cell::new(None) };
}

/// A parameter of a list item, after the rule's name, `;r=5`: its key and value.
type Item = (&'static [u8; 3], u64);

impl List {
    /// A list in an allocation of its own: a value kept long (a cached policy) does not
    /// keep a spare buffer alive.
    fn new() -> Self {
        Self(BytesMut::new())
    }

    /// A list written in the thread's spare buffer.
    fn spare() -> Self {
        let spare = SPARE.take().filter(|spare| spare.capacity() >= SPARE_LEAST);
        Self(spare.unwrap_or_else(|| BytesMut::with_capacity(SPARE_BYTES)))
    }

    /// The most an item of `rule` takes: a separator, the quoted name, two parameters
    /// with the longest numbers.
    fn most(rule: &Rule) -> usize {
        4 + rule.name().len() + 2 * (3 + 20)
    }

    /// Appends `"name";a=1;b=2`.
    fn push(&mut self, rule: &Rule, params: [Item; 2]) {
        let out = &mut self.0;
        out.reserve(Self::most(rule));
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(b"\"");
        out.extend_from_slice(rule.name().as_bytes());
        out.extend_from_slice(b"\"");
        for (key, value) in params {
            out.extend_from_slice(key);
            out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        }
    }

    /// The header value; rule names are validated token-safe, so this never fails. What is
    /// left of a spare buffer goes back to the thread.
    fn into_value(mut self) -> Option<HeaderValue> {
        let value = self.0.split().freeze();
        let kept = SPARE
            .take()
            .filter(|spare| spare.capacity() >= self.0.capacity());
        SPARE.set(Some(kept.unwrap_or(self.0)));
        HeaderValue::from_maybe_shared(value).ok()
    }
}

/// One rule's `RateLimit-Policy` item: `"name";q=10;w=60`.
fn policy_item(rule: &Rule) -> [Item; 2] {
    let (q, w) = rule.algorithm().quota();
    [(b";q=", q), (b";w=", ceil_secs(w).max(1))]
}

/// The `RateLimit-Policy` value of `rules`: cached per route by a layer, for every response
/// that advertises exactly these rules.
pub(crate) fn policy_value<'a>(rules: impl Iterator<Item = &'a Rule>) -> Option<HeaderValue> {
    let mut policy = List::new();
    for rule in rules {
        policy.push(rule, policy_item(rule));
    }
    policy.into_value()
}

impl RateLimitHeaders {
    /// The headers for `rules`, `None` if there are none; `cached(n)`, the cached
    /// [`policy_value`] of exactly these `n` rules, if there is one. The legacy headers
    /// describe `denied`'s deciding rule, agreeing with `Retry-After`.
    pub(crate) fn new<'a>(
        rules: impl Iterator<Item = (&'a Rule, &'a RuleOutcome)> + Clone,
        cached: impl FnOnce(usize) -> Option<HeaderValue>,
        legacy: bool,
        denied: Option<Decision>,
    ) -> Option<Self> {
        let (mut items, mut state) = (0, None);
        // The legacy headers' rule: (limit, r, t, decided the denial).
        let mut legacy_rule: Option<(u64, u64, u64, bool)> = None;
        for (rule, outcome) in rules.clone() {
            items += 1;
            // One rule's `RateLimit` item: `"name";r=5;t=30`.
            let (r, t) = advertised(outcome);
            let state = state.get_or_insert_with(List::spare);
            state.push(rule, [(b";r=", r), (b";t=", t)]);
            if !legacy {
                continue;
            }
            let deciding = denied.is_some_and(|d| d == outcome.decision);
            let better = match legacy_rule {
                None => true,
                Some((_, _, _, true)) => false,
                Some(_) if deciding => true,
                // Otherwise the rule with the least left (the longest wait on a tie).
                Some((_, lr, lt, false)) => (r, Reverse(t)) < (lr, Reverse(lt)),
            };
            if better {
                legacy_rule = Some((outcome.info.limit, r, t, deciding));
            }
        }
        let state = state?.into_value();
        let policy = cached(items).or_else(|| policy_value(rules.map(|(rule, _)| rule)));
        Some(Self {
            policy,
            state,
            legacy: legacy_rule.map(|(limit, r, t, _)| (limit, r, t)),
        })
    }

    /// Adds the headers to a response (a rejection's, or an inner service's): the lists are
    /// appended, so nested layers each contribute their rules; the legacy headers are
    /// replaced, except on an inner layer's rejection (it carries `Retry-After` and them):
    /// those describe its deciding rule.
    pub(crate) fn merge_into(self, headers: &mut HeaderMap) {
        if let Some(v) = self.policy {
            headers.append(RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.state {
            headers.append(RATELIMIT, v);
        }
        if let Some((limit, r, t)) = self.legacy {
            let keep_legacy = headers.contains_key(RETRY_AFTER);
            for (name, value) in [
                (X_RATELIMIT_LIMIT, limit),
                (X_RATELIMIT_REMAINING, r),
                (X_RATELIMIT_RESET, t),
            ] {
                if !(keep_legacy && headers.contains_key(&name)) {
                    headers.insert(name, HeaderValue::from(value));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retry-After seconds round up, and a deny never says zero.
    #[test]
    fn seconds_round_up_and_a_deny_never_says_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        // A store of one's own may say any wait: the longest reads as the longest.
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    /// A list renders `"name";r=…;t=…` items, comma-separated, for numbers of every width,
    /// each within the room it reserves.
    #[test]
    fn a_list_renders_every_width_within_its_reserve() {
        let rules = [
            Rule::token_bucket("a", 1, crate::Rate::per_second(1)),
            Rule::token_bucket("per-user", 10, crate::Rate::per_second(1)),
        ];
        for [r, t] in [[0, 9], [10, 99], [100, 12_345], [u64::MAX, u64::MAX]] {
            for n in 1..=rules.len() {
                let (mut list, mut expected) = (List::spare(), Vec::new());
                for rule in &rules[..n] {
                    let before = list.0.len();
                    let params = [(b";r=", r), (b";t=", t)];
                    list.push(rule, params);
                    assert!(list.0.len() - before <= List::most(rule));
                    expected.push(format!("\"{}\";r={r};t={t}", rule.name()));
                }
                let value = list.into_value().expect("a valid header value");
                assert_eq!(value, expected.join(", ").as_str());
            }
        }
    }
}

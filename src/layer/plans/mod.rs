//! Plans: a limit whose rule is chosen per request — free, pro, enterprise.

pub(super) mod select;

use std::borrow::Cow;
use std::sync::Arc;

use self::select::{Otherwise, PlanGuard, PlanOf, Selector};
use super::config::Limit;
use crate::error::ConfigError;
use crate::rule::Rule;

/// What a request whose plan is not one of the [`Plans`] (or that has none) gets. There is
/// no default: each answer suits another service, so [`Plans::new`] asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownPlan {
    /// Refuse it: 400 Bad Request ("invalid rate limit key: unknown plan"; gRPC
    /// `INVALID_ARGUMENT`), as for a request without its key. Customise the answer with
    /// [`on_reject`](super::RateLimitLayerBuilder::on_reject). A plan in shadow leaves the
    /// refusal to the others; only plans all in shadow report it without refusing.
    Reject,
    /// Count it under this plan (one of the plans; a name that is not is a build error).
    Plan(Cow<'static, str>),
    /// Let it through without this limit (the layer's other limits still apply).
    Unlimited,
}

/// A limit whose rule is chosen per request by the request's plan: free, pro, enterprise.
///
/// Each plan is a [`Limit`] whose rule has its own name (see
/// [One name, one configuration](crate::Rule#one-name-one-configuration)), so its own state:
/// a key moved to another plan counts under that plan's rule with whatever state it holds
/// for the key, and its old state expires. A key that moves between plans can use each
/// plan's quota in the same window: the plan must come from the server, never the client.
///
/// `Plans` is an `IntoIterator` of those limits, of which a request meets exactly one (or
/// none, under [`UnknownPlan::Unlimited`]): give it to
/// [`RateLimitLayerBuilder::limits`](super::RateLimitLayerBuilder::limits) or to a
/// [`route`](super::RateLimitLayerBuilder::route), beside other limits, in one batch.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::layer::{Limit, PlanOf, Plans, RateLimitLayer, UnknownPlan};
/// use tollgate::{key, Limiter, Rate, Rule, store::MemoryStore};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let api_key = key::header("x-api-key");
/// let per_key = Plans::new(PlanOf::header("x-plan"), UnknownPlan::Plan("free".into()))
///     .plan("free", Limit::new(Rule::fixed_window("api-free", 1, Duration::from_secs(60)), api_key.clone()))
///     .plan("pro", Limit::new(Rule::token_bucket("api-pro", 100, Rate::per_second(10)), api_key));
/// let layer = RateLimitLayer::builder()
///     .limits(per_key)
///     .build()?;
/// let service = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
/// }));
/// let call = |plan: &str| {
///     let request = Request::get("/").header("x-api-key", "k1").header("x-plan", plan);
///     service.clone().oneshot(request.body(String::new()).unwrap())
/// };
/// assert_eq!(call("free").await?.status(), StatusCode::OK);
/// assert_eq!(call("free").await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// // An unknown plan counts as free here.
/// assert_eq!(call("gold").await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// // Upgraded: the pro plan's own quota.
/// assert_eq!(call("pro").await?.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Plans {
    plan_of: PlanOf,
    unknown: UnknownPlan,
    plans: Vec<(Box<str>, Limit)>,
}

impl Plans {
    /// Limits chosen by the plan `plan_of` finds; a request whose plan is none of them gets
    /// `unknown`. Add plans with [`plan`](Self::plan).
    pub fn new(plan_of: PlanOf, unknown: UnknownPlan) -> Self {
        Self {
            plan_of,
            unknown,
            plans: Vec::new(),
        }
    }

    /// Requests of the plan `name` are limited by `limit` (its rule, key, cost and options);
    /// give each plan's rule its own name.
    pub fn plan(mut self, name: impl Into<String>, limit: Limit) -> Self {
        self.plans.push((name.into().into(), limit));
        self
    }
}

impl IntoIterator for Plans {
    type Item = Limit;
    type IntoIter = std::vec::IntoIter<Limit>;

    fn into_iter(self) -> Self::IntoIter {
        let names: Box<[Box<str>]> = self.plans.iter().map(|(n, _)| n.clone()).collect();
        let mut problems: Vec<ConfigError> = self.plan_of.problem().into_iter().cloned().collect();
        if names.is_empty() {
            problems.push(ConfigError::new("plans: no plan given"));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                problems.push(ConfigError::new(format!(
                    "plans: the plan {name:?} is given twice"
                )));
            }
        }
        let unknown = match &self.unknown {
            UnknownPlan::Reject => Otherwise::Reject,
            UnknownPlan::Unlimited => Otherwise::Unlimited,
            UnknownPlan::Plan(plan) => match names.iter().position(|n| **n == **plan) {
                Some(i) => Otherwise::Plan(i),
                None => {
                    problems.push(ConfigError::new(format!(
                        "plans: unknown plans go to {plan:?}, which is not one of the plans {names:?}"
                    )));
                    Otherwise::Unlimited
                }
            },
        };
        let selector = Arc::new(Selector {
            plan_of: self.plan_of,
            names,
            unknown,
            teller: self.plans.iter().position(|(_, l)| !l.shadow).unwrap_or(0),
            problem: ConfigError::collect(problems),
        });
        let mut plans = self.plans;
        if plans.is_empty() {
            // Carries the problem to `build`, which refuses it: never decided with.
            let placeholder = Rule::fixed_window("plans", 1, std::time::Duration::from_secs(1));
            plans.push((Box::from(""), Limit::new(placeholder, crate::key::global())));
        }
        let limits = plans.into_iter().enumerate().map(|(index, (_, limit))| {
            let selector = Arc::clone(&selector);
            let plan = Some(PlanGuard { selector, index });
            Limit { plan, ..limit }
        });
        limits.collect::<Vec<_>>().into_iter()
    }
}

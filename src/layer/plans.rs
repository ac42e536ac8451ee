//! Plans: a limit whose rule is chosen per request — free, pro, enterprise.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;

use super::config::Limit;
use crate::error::ConfigError;
use crate::key::{IntoHeaderName, KeyError, KeyExtractor, RequestHead};
use crate::rule::Rule;

type PlanFn = dyn for<'a> Fn(&RequestHead<'a>) -> Option<Cow<'a, str>> + Send + Sync;

/// How a request's plan is found: a header the gateway sets, or a closure (an API key's
/// plan looked up in the server's records). See [`Plans`].
#[derive(Clone)]
pub struct PlanOf {
    find: Arc<PlanFn>,
    what: Cow<'static, str>,
}

impl PlanOf {
    /// The plan named in the header `name` (a literal; see [`key::header`](crate::key::header)
    /// for what an invalid one does, and [`try_header`](Self::try_header) for names read at
    /// run time). A header only the gateway writes: a client that could set it would choose
    /// its own plan.
    pub fn header(name: impl IntoHeaderName) -> Self {
        Self::header_named(name.into_header_name())
    }

    /// [`header`](Self::header) for a name read at run time: an invalid header name is a
    /// configuration error.
    pub fn try_header(name: &str) -> Result<Self, ConfigError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(Self::header_named)
            .map_err(|_| ConfigError::new(format!("{name:?} is not a valid header name")))
    }

    fn header_named(name: HeaderName) -> Self {
        let what = format!("header {name}").into();
        Self {
            find: Arc::new(move |head: &RequestHead<'_>| {
                let value = head.headers().get(&name)?.to_str().ok()?;
                Some(Cow::Borrowed(value))
            }),
            what,
        }
    }

    /// The plan `f` finds for a request, `None` if it finds none. It runs on the request
    /// path, once per request and group of plans: a lookup in memory, not a database call.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use tollgate::layer::PlanOf;
    ///
    /// // Each API key's plan, as the server's records say.
    /// let plans: HashMap<String, &'static str> =
    ///     [("key-1".to_owned(), "pro"), ("key-2".to_owned(), "free")].into();
    /// let plan_of = PlanOf::from_fn(move |req| {
    ///     let api_key = req.headers().get("x-api-key")?.to_str().ok()?;
    ///     plans.get(api_key).copied()
    /// });
    /// ```
    pub fn from_fn<F, P>(f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<P> + Send + Sync + 'static,
        P: Into<Cow<'static, str>>,
    {
        Self {
            find: Arc::new(move |head: &RequestHead<'_>| f(head).map(Into::into)),
            what: Cow::Borrowed("the request's plan"),
        }
    }
}

impl fmt::Debug for PlanOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PlanOf").field(&self.what).finish()
    }
}

/// What a request whose plan is not one of the [`Plans`] (or that has none) gets. There is
/// no default: each answer suits another service, so [`Plans::new`] asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownPlan {
    /// Refuse it: 400 Bad Request ("invalid rate limit key: unknown plan"; gRPC
    /// `INVALID_ARGUMENT`), as for a request without its key. Customise the answer with
    /// [`on_reject`](super::RateLimitLayerBuilder::on_reject).
    Reject,
    /// Count it under this plan (one of the plans; a name that is not is a build error).
    Plan(Cow<'static, str>),
    /// Let it through without this limit (the layer's other limits still apply).
    Unlimited,
}

/// A limit whose rule is chosen per request by the request's plan: free, pro, enterprise.
///
/// Each plan has its own [`Rule`], and each rule its own name, so each plan keeps its own
/// state: a key counts, under one plan, only what it did under that plan. Moving a key to
/// another plan (an upgrade, a downgrade) is then well defined: its next request counts
/// under the new plan's rule with whatever that rule's state for the key holds — a full
/// quota if the key never used the plan, or what it left there if it comes back within the
/// rule's window — and its state under the old plan is left to expire. A key that moves
/// between plans can therefore use each plan's quota in the same window: the plan must come
/// from the server (its records, a header the gateway writes), never from the client.
/// (One name for all plans is refused by the layer's `build`: a name stands for one
/// configuration, see [One name, one configuration](crate::Rule#one-name-one-configuration).)
///
/// `Plans` is an `IntoIterator` of [`Limit`]s, one per plan, of which a request meets
/// exactly one (or none, under [`UnknownPlan::Unlimited`]): give it to
/// [`RateLimitLayerBuilder::limits`](super::RateLimitLayerBuilder::limits) or to a
/// [`route`](super::RateLimitLayerBuilder::route), beside other limits, in one batch.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::layer::{PlanOf, Plans, RateLimitLayer, UnknownPlan};
/// use tollgate::{key, Limiter, MemoryStore, Rate, Rule};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_key = Plans::new(key::header("x-api-key"), PlanOf::header("x-plan"), UnknownPlan::Plan("free".into()))
///     .plan("free", Rule::fixed_window("api-free", 1, Duration::from_secs(60)))
///     .plan("pro", Rule::token_bucket("api-pro", 100, Rate::per_second(10)));
/// let layer = RateLimitLayer::builder(Limiter::new(MemoryStore::new()))
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
pub struct Plans {
    key: Arc<dyn KeyExtractor>,
    plan_of: PlanOf,
    unknown: UnknownPlan,
    plans: Vec<(Box<str>, Limit)>,
}

impl Plans {
    /// Limits counted under the key `key` finds, with the rule of the plan `plan_of` finds;
    /// a request whose plan is none of them gets `unknown`. Add plans with
    /// [`plan`](Self::plan).
    pub fn new(key: impl KeyExtractor, plan_of: PlanOf, unknown: UnknownPlan) -> Self {
        Self {
            key: Arc::new(key),
            plan_of,
            unknown,
            plans: Vec::new(),
        }
    }

    /// Requests of the plan `name` are limited by `rule`, counted under the key of
    /// [`new`](Self::new). Give each plan's rule its own name.
    pub fn plan(self, name: impl Into<String>, rule: Rule) -> Self {
        let limit = Limit::from_shared(rule, self.key.clone());
        self.plan_limit(name, limit)
    }

    /// Requests of the plan `name` are limited by `limit`: a [`Limit`] of its own, for a
    /// cost function, a key of its own or a trial ([`Limit::shadow`]). A request of the
    /// plan without that limit's key follows the limit's
    /// [`on_missing_key`](Limit::on_missing_key).
    pub fn plan_limit(mut self, name: impl Into<String>, limit: Limit) -> Self {
        self.plans.push((name.into().into(), limit));
        self
    }

    /// The plans' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.plans.iter().map(|(name, _)| &**name)
    }
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plans")
            .field("plan_of", &self.plan_of)
            .field("unknown", &self.unknown)
            .field("plans", &self.plans)
            .finish_non_exhaustive()
    }
}

impl IntoIterator for Plans {
    type Item = Limit;
    type IntoIter = std::vec::IntoIter<Limit>;

    fn into_iter(self) -> Self::IntoIter {
        let names: Box<[Box<str>]> = self.plans.iter().map(|(n, _)| n.clone()).collect();
        let mut problems = Vec::new();
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
            UnknownPlan::Reject => Fallback::Reject,
            UnknownPlan::Unlimited => Fallback::Unlimited,
            UnknownPlan::Plan(plan) => match names.iter().position(|n| **n == **plan) {
                Some(i) => Fallback::Plan(i),
                None => {
                    problems.push(ConfigError::new(format!(
                        "plans: unknown plans go to {plan:?}, which is not one of the plans {names:?}"
                    )));
                    Fallback::Unlimited
                }
            },
        };
        let selector = Arc::new(Selector {
            plan_of: self.plan_of,
            names,
            unknown,
            problem: ConfigError::collect(problems),
        });
        let mut plans = self.plans;
        if plans.is_empty() {
            // Carries the problem to `build`, which refuses it: never decided with.
            let placeholder = Rule::fixed_window("plans", 1, std::time::Duration::from_secs(1));
            plans.push((Box::from(""), Limit::from_shared(placeholder, self.key)));
        }
        let limits: Vec<Limit> = plans
            .into_iter()
            .enumerate()
            .map(|(index, (_, mut limit))| {
                limit.plan = Some(PlanGuard {
                    selector: selector.clone(),
                    index,
                });
                limit
            })
            .collect();
        limits.into_iter()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Reject,
    Plan(usize),
    Unlimited,
}

/// What the limits of one [`Plans`] share: how to find the plan, and the plans.
struct Selector {
    plan_of: PlanOf,
    names: Box<[Box<str>]>,
    unknown: Fallback,
    problem: Option<ConfigError>,
}

impl Selector {
    /// The index of the request's plan; `None`: no plan applies.
    fn resolve(&self, head: &RequestHead<'_>) -> Resolved {
        let found = (self.plan_of.find)(head);
        if let Some(i) = found
            .as_deref()
            .and_then(|plan| self.names.iter().position(|n| **n == *plan))
        {
            return Ok(Some(i));
        }
        match self.unknown {
            Fallback::Plan(i) => Ok(Some(i)),
            Fallback::Unlimited => Ok(None),
            Fallback::Reject if found.is_none() => {
                Err(KeyError::missing(self.plan_of.what.clone()))
            }
            Fallback::Reject => Err(KeyError::invalid("unknown plan")),
        }
    }
}

/// Marks a [`Limit`] as one plan of a [`Plans`].
#[derive(Clone)]
pub(crate) struct PlanGuard {
    selector: Arc<Selector>,
    index: usize,
}

impl PlanGuard {
    /// Why the plans cannot work, reported once (by their first limit).
    pub(crate) fn problem(&self) -> Option<ConfigError> {
        (self.index == 0).then(|| self.selector.problem.clone())?
    }
}

impl fmt::Debug for PlanGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.selector.names.get(self.index);
        f.debug_struct("Plan").field("name", &name).finish()
    }
}

/// A request's plan among a group's: its index, `None` for no limit, or why it is refused.
type Resolved = Result<Option<usize>, KeyError>;

/// The plans of one request, found once per group of plans.
#[derive(Default)]
pub(crate) struct RequestPlans<'c> {
    last: Option<(&'c Arc<Selector>, Resolved)>,
}

impl<'c> RequestPlans<'c> {
    /// Whether `limit` applies to the request: a limit that is no plan always does; a plan
    /// when it is the request's. An error: the request's plan is unknown and refused (told
    /// once, by the first plan).
    pub(crate) fn applies(
        &mut self,
        limit: &'c Limit,
        head: &RequestHead<'_>,
    ) -> Result<bool, KeyError> {
        let Some(guard) = &limit.plan else {
            return Ok(true);
        };
        let resolved = match &self.last {
            Some((selector, resolved)) if Arc::ptr_eq(selector, &guard.selector) => resolved,
            _ => {
                let resolved = guard.selector.resolve(head);
                &self.last.insert((&guard.selector, resolved)).1
            }
        };
        match resolved {
            Ok(plan) => Ok(*plan == Some(guard.index)),
            Err(e) if guard.index == 0 => Err(e.clone()),
            Err(_) => Ok(false),
        }
    }
}

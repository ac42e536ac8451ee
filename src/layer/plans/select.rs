//! How a request's plan is found and which of a group's limits it selects: below the
//! layer's configuration, whose limits carry their plan.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;

use crate::error::ConfigError;
use crate::key::{KeyError, KeyErrorKind, RequestHead};

type PlanFn = dyn for<'a> Fn(&RequestHead<'a>) -> Option<Cow<'a, str>> + Send + Sync;

/// How a request's plan is found: a header the gateway sets, or a closure (an API key's
/// plan looked up in the server's records). See [`Plans`](super::Plans).
#[derive(Clone)]
pub struct PlanOf {
    find: Arc<PlanFn>,
    what: Cow<'static, str>,
    /// Why it cannot work (a header name that is none), reported by the layer's `build`.
    problem: Option<ConfigError>,
}

impl PlanOf {
    /// The plan named in the header `name`: a header only the gateway writes (a client that
    /// could set it would choose its own plan). A request sending it twice names no plan:
    /// neither value can be trusted ([`Duplicates`](crate::key::Duplicates) says why). A
    /// name that is no header name is reported by the layer's `build`.
    pub fn header(name: impl AsRef<str>) -> Self {
        let text = name.as_ref();
        let name = HeaderName::from_bytes(text.as_bytes()).ok();
        let invalid = || ConfigError::new(format!("plans: {text:?} is not a valid header name"));
        Self {
            what: format!("header {}", name.as_ref().map_or(text, HeaderName::as_str)).into(),
            problem: name.is_none().then(invalid),
            find: Arc::new(move |head: &RequestHead<'_>| {
                let mut values = head.headers().get_all(name.as_ref()?).iter();
                let value = values.next().filter(|_| values.next().is_none())?;
                Some(Cow::Borrowed(value.to_str().ok()?))
            }),
        }
    }

    /// Why this cannot work, if it cannot.
    pub(crate) fn problem(&self) -> Option<&ConfigError> {
        self.problem.as_ref()
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
            problem: None,
        }
    }
}

impl fmt::Debug for PlanOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PlanOf").field(&self.what).finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Otherwise {
    Reject,
    Plan(usize),
    Unlimited,
}

/// What the limits of one [`Plans`](super::Plans) share: how to find the plan, and the plans.
pub(super) struct Selector {
    pub(super) plan_of: PlanOf,
    pub(super) names: Box<[Box<str>]>,
    pub(super) unknown: Otherwise,
    /// The plan that refuses a request of no known plan: the first enforced one, so that a
    /// plan in shadow does not lift the group's refusal (the first, if all are in shadow).
    pub(super) teller: usize,
    pub(super) problem: Option<ConfigError>,
}

impl Selector {
    /// The index of the request's plan; `None`: no plan applies.
    fn resolve(&self, head: &RequestHead<'_>) -> Resolved {
        let found = (self.plan_of.find)(head);
        let index = |plan: &str| self.names.iter().position(|n| **n == *plan);
        if let Some(i) = found.as_deref().and_then(index) {
            return Ok(Some(i));
        }
        match self.unknown {
            Otherwise::Plan(i) => Ok(Some(i)),
            Otherwise::Unlimited => Ok(None),
            Otherwise::Reject if found.is_none() => Err(KeyError::new(
                KeyErrorKind::Missing,
                self.plan_of.what.clone(),
            )),
            Otherwise::Reject => Err(KeyError::new(KeyErrorKind::Invalid, "unknown plan")),
        }
    }
}

/// Marks a [`Limit`](crate::layer::Limit) as one plan of a [`Plans`](super::Plans).
#[derive(Clone)]
pub(crate) struct PlanGuard {
    pub(super) selector: Arc<Selector>,
    pub(super) index: usize,
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
    /// Whether a limit that is the plan `guard` applies to the request: when it is the
    /// request's plan (a limit that is no plan always does). An error: the request's plan is
    /// unknown and refused (told once, by the group's [teller](Selector::teller)).
    pub(crate) fn applies(
        &mut self,
        guard: &'c PlanGuard,
        head: &RequestHead<'_>,
    ) -> Result<bool, KeyError> {
        let resolved = match &self.last {
            Some((selector, resolved)) if Arc::ptr_eq(selector, &guard.selector) => resolved,
            _ => {
                let resolved = guard.selector.resolve(head);
                &self.last.insert((&guard.selector, resolved)).1
            }
        };
        match resolved {
            Ok(plan) => Ok(*plan == Some(guard.index)),
            Err(e) if guard.index == guard.selector.teller => Err(e.clone()),
            Err(_) => Ok(false),
        }
    }
}

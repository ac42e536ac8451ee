//! A [`RulesFile`] turned into the layer's pieces: its settings onto the builder, each
//! entry into a [`Limit`] (or one per plan), each key into an extractor. Every problem is
//! collected, located at the field that holds it, rather than returned at the first.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::report::{did_you_mean, problem_text, typo_of, Problems};
use super::schema::{
    ClientIpSpec, DuplicatesSpec, Dur, FailureSpec, ForwardedSpec, HeaderSpec, KeySpec, LimitSpec,
    MissingSpec, ModeSpec, PlanOfSpec, RulesFile, UnknownPlanSpec, WindowSpec,
};
use crate::error::ConfigError;
use crate::key::{self, Duplicates, ForwardedHeader, KeyExtractor};
use crate::layer::{
    FailurePolicy, Limit, MissingKey, Mode, PlanOf, Plans, RateLimitLayer, RateLimitLayerBuilder,
    UnknownPlan,
};
use crate::penalty::Penalty;
use crate::rule::Rule;
use crate::store::Store;

/// Where each rule name and route pattern is written: (how the layer's messages name it,
/// the path of the field that writes it).
type Places = Vec<(String, String)>;

/// The key extractors and plan lookups the code registered by name.
#[derive(Clone, Default)]
pub(super) struct Registered {
    pub(super) keys: HashMap<String, Arc<dyn KeyExtractor>>,
    pub(super) plans: HashMap<String, PlanOf>,
}

impl Registered {
    /// A layer of `file`'s rules added to `builder`, or every problem: those found so far
    /// (`problems`), the file's, and the layer's own, each located where it is written.
    pub(super) fn build<St: Store>(
        &self,
        file: &RulesFile,
        builder: RateLimitLayerBuilder<St>,
        mut problems: Problems<'_>,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let mut places = Places::new();
        let mut builder = settings(file, builder, &mut problems);
        for (i, spec) in file.limits.iter().enumerate() {
            let path = format!("limit[{i}]");
            builder = builder.limits(self.limits(spec, &path, &mut problems, &mut places));
        }
        for (i, route) in file.routes.iter().enumerate() {
            let path = format!("route[{i}]");
            if !route.broken {
                places.push((
                    format!("route {:?}", route.pattern.trim()),
                    format!("{path}.pattern"),
                ));
            }
            let mut limits = Vec::new();
            for (j, spec) in route.limits.iter().enumerate() {
                let path = format!("{path}.limit[{j}]");
                limits.extend(self.limits(spec, &path, &mut problems, &mut places));
            }
            // A route whose pattern did not read is reported already; its limits are
            // checked all the same.
            if !route.broken {
                builder = builder.route(&route.pattern, limits);
            }
        }
        // The layer's checks run on what the file's problems left, so that one reading
        // reports everything: an entry with a problem is left out or given a placeholder
        // that passes them, and reports nothing twice.
        match builder.build() {
            Ok(layer) if problems.is_empty() => Ok(layer),
            Ok(_) => Err(problems.into_error()),
            Err(e) => Err(located(&e, &places, problems)),
        }
    }

    /// The limits of one entry: one, or one per plan.
    fn limits(
        &self,
        spec: &LimitSpec,
        path: &str,
        problems: &mut Problems<'_>,
        places: &mut Places,
    ) -> Vec<Limit> {
        // An entry that did not read is reported already (see `salvage`).
        if spec.broken {
            return Vec::new();
        }
        let key = spec
            .key
            .as_ref()
            .map(|k| self.key_of(k, &format!("{path}.key"), problems));
        if let Some(plan_of) = &spec.plan_of {
            return self.plans(spec, plan_of, key, path, problems, places);
        }
        for (field, given) in [
            ("plans", !spec.plan_entries.is_empty()),
            ("unknown_plan", spec.unknown_plan.is_some()),
            ("plan", spec.plan.is_some()),
        ] {
            if given {
                problems.at(
                    &format!("{path}.{field}"),
                    format!("{field} belongs to a limit with plans, which needs plan_of"),
                );
            }
        }
        let Some(key) = key else {
            if !misspelt(spec, &["key"]) {
                problems.at(path, "a limit needs a key (key = \"global\", say)");
            }
            return Vec::new();
        };
        limit(spec, key, path, problems, places)
            .into_iter()
            .collect()
    }

    /// The limits of an entry with plans: one per plan, chosen by `plan_of`.
    fn plans(
        &self,
        spec: &LimitSpec,
        plan_of: &PlanOfSpec,
        key: Option<Arc<dyn KeyExtractor>>,
        path: &str,
        problems: &mut Problems<'_>,
        places: &mut Places,
    ) -> Vec<Limit> {
        let found_before = problems.len();
        let plan_of = self.plan_of(plan_of, &format!("{path}.plan_of"), problems);
        let unknown = match &spec.unknown_plan {
            Some(UnknownPlanSpec::Reject) => Some(UnknownPlan::Reject),
            Some(UnknownPlanSpec::Unlimited) => Some(UnknownPlan::Unlimited),
            Some(UnknownPlanSpec::Plan(plan)) => Some(UnknownPlan::Plan(plan.clone().into())),
            None => {
                problems.at(
                    path,
                    "plans need unknown_plan: \"reject\", \"unlimited\" or { plan = \"…\" } (what a request of no known plan gets)",
                );
                None
            }
        };
        let (Some(plan_of), Some(unknown), Some(key)) = (plan_of, unknown, key) else {
            if spec.key.is_none() {
                problems.at(
                    path,
                    "plans need a key (key = { header = \"x-api-key\" }, say)",
                );
            }
            return Vec::new();
        };
        let mut plans = Plans::new(key.clone(), plan_of, unknown);
        for (i, entry) in spec.plan_entries.iter().enumerate() {
            let entry_path = format!("{path}.plans[{i}]");
            let Some(plan) = &entry.plan else {
                problems.at(
                    &entry_path,
                    "a plan's entry needs its plan's name (plan = \"free\", say)",
                );
                continue;
            };
            let entry_key = entry.key.as_ref().map_or(key.clone(), |k| {
                self.key_of(k, &format!("{entry_path}.key"), problems)
            });
            if let Some(limit) = limit(entry, entry_key, &entry_path, problems, places) {
                plans = plans.plan_limit(plan.clone(), limit);
            }
        }
        // A group missing a plan it was written with would draw the layer's complaints
        // about what is missing (an unknown default, say): left out instead.
        if problems.len() > found_before {
            return Vec::new();
        }
        // The plans' own problems (none given, a name twice, an unknown default) name no
        // rule: located at the group.
        places.push(("plans:".into(), path.into()));
        plans.into_iter().collect()
    }

    /// The plan lookup `spec` names, written at `path`.
    fn plan_of(
        &self,
        spec: &PlanOfSpec,
        path: &str,
        problems: &mut Problems<'_>,
    ) -> Option<PlanOf> {
        match spec {
            PlanOfSpec::Header(name) => {
                let plan_of = PlanOf::header(name);
                match plan_of.problem() {
                    Some(e) => problems.error_at(path, e.clone()),
                    None => return Some(plan_of),
                }
                None
            }
            PlanOfSpec::Named(name) => {
                let found = self.plans.get(name).cloned();
                if found.is_none() {
                    let mut known: Vec<&String> = self.plans.keys().collect();
                    known.sort();
                    let near = did_you_mean(name, known.iter().map(|k| k.as_str()));
                    problems.at(
                        path,
                        format!("no plan lookup is registered as {name:?}{near} (Loader::plan_of registers one; registered: {known:?})"),
                    );
                }
                found
            }
        }
    }

    /// The extractor `spec` describes; a placeholder after reporting its problem (so that
    /// the layer's checks do not report it again).
    fn key_of(
        &self,
        spec: &KeySpec,
        path: &str,
        problems: &mut Problems<'_>,
    ) -> Arc<dyn KeyExtractor> {
        let placeholder = || Arc::new(key::global());
        match self.extractor(spec, path, problems) {
            Ok(extractor) => match extractor.validate() {
                Ok(()) => extractor,
                Err(e) => {
                    // Nested keys report their own problems; report each once.
                    if !matches!(spec, KeySpec::Or(_) | KeySpec::All(_)) {
                        problems.error_at(path, e);
                    }
                    placeholder()
                }
            },
            Err(why) => {
                if !why.is_empty() {
                    problems.at(path, why);
                }
                placeholder()
            }
        }
    }

    /// The extractor `spec` describes, or why there is none (empty when the nested keys
    /// reported it already).
    fn extractor(
        &self,
        spec: &KeySpec,
        path: &str,
        problems: &mut Problems<'_>,
    ) -> Result<Arc<dyn KeyExtractor>, String> {
        match spec {
            KeySpec::PeerIp(s) => {
                let mut peer = key::peer_ip();
                if let Some(bits) = s.ipv6_prefix {
                    peer = peer.ipv6_prefix(bits);
                }
                Ok(Arc::new(peer))
            }
            KeySpec::ClientIp(s) => Ok(client_ip(s)),
            KeySpec::Header(s) => header(s),
            KeySpec::Route => Ok(Arc::new(key::route())),
            KeySpec::Method => Ok(Arc::new(key::method())),
            KeySpec::Global => Ok(Arc::new(key::global())),
            KeySpec::Constant(c) => Ok(Arc::new(key::constant(c.clone().into_bytes()))),
            KeySpec::Named(name) => self.keys.get(name).cloned().ok_or_else(|| {
                let mut known: Vec<&String> = self.keys.keys().collect();
                known.sort();
                let near = did_you_mean(name, known.iter().map(|k| k.as_str()));
                format!("unknown key extractor {name:?}{near}: no extractor is registered under that name (Loader::key registers one; registered: {known:?})")
            }),
            KeySpec::Or(keys) if keys.len() >= 2 => {
                let mut parts = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| self.key_of(k, &format!("{path}.or[{i}]"), problems));
                let first = parts.next();
                let combined = parts.fold(first, |acc, next| {
                    acc.map(|a| Arc::new(a.or(next)) as Arc<dyn KeyExtractor>)
                });
                combined.ok_or_else(String::new)
            }
            KeySpec::Or(_) => Err("or needs two keys or more".into()),
            KeySpec::All(keys) => {
                let parts: Vec<Arc<dyn KeyExtractor>> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| self.key_of(k, &format!("{path}.all[{i}]"), problems))
                    .collect();
                match &parts[..] {
                    [a, b] => Ok(Arc::new((a.clone(), b.clone()))),
                    [a, b, c] => Ok(Arc::new((a.clone(), b.clone(), c.clone()))),
                    _ => Err("all joins two or three keys".into()),
                }
            }
        }
    }
}

/// The file's settings on `builder`: mode, failure policy, headers, held requests, log
/// interval.
fn settings<St: Store>(
    file: &RulesFile,
    mut builder: RateLimitLayerBuilder<St>,
    problems: &mut Problems<'_>,
) -> RateLimitLayerBuilder<St> {
    if let Some(mode) = file.mode {
        let mode = match (mode, file.max_wait) {
            (ModeSpec::Enforce, _) => Some(Mode::Enforce),
            (ModeSpec::Shadow, _) => Some(Mode::Shadow),
            (ModeSpec::Wait, Some(Dur(max_wait))) => Some(Mode::Wait { max_wait }),
            (ModeSpec::Wait, None) => {
                problems.at("mode", "mode \"wait\" needs max_wait (\"2s\", say)");
                None
            }
        };
        builder = builder.mode(mode.unwrap_or_default());
    }
    if let Some(policy) = file.on_failure {
        builder = builder.on_failure(match policy {
            FailureSpec::FailOpen => FailurePolicy::FailOpen,
            FailureSpec::FailClosed => FailurePolicy::FailClosed,
            FailureSpec::Fallback => FailurePolicy::Fallback,
        });
    }
    if let Some(yes) = file.headers_on_allowed {
        builder = builder.headers_on_allowed(yes);
    }
    if let Some(yes) = file.legacy_headers {
        builder = builder.legacy_headers(yes);
    }
    if let Some(n) = file.max_held {
        builder = builder.max_held(n);
    }
    if let Some(n) = file.max_held_per_key {
        builder = builder.max_held_per_key(n);
    }
    if let Some(Dur(interval)) = file.log_interval {
        builder = builder.log_interval(interval);
    }
    builder
}

/// The layer's own problems, each located where the rule or route it names is written:
/// the layer knows the rule, the file knows its line.
fn located(error: &ConfigError, places: &Places, mut problems: Problems<'_>) -> ConfigError {
    for problem in error.problems() {
        let place = places
            .iter()
            .filter(|(name, _)| problem.contains(name.as_str()))
            .min_by_key(|(name, _)| problem.find(name.as_str()));
        match place {
            Some((_, path)) => problems.at(path, problem),
            None => problems.at("", problem),
        }
    }
    problems.into_error()
}

/// The limit `spec` describes, counting under `key`.
fn limit(
    spec: &LimitSpec,
    key: Arc<dyn KeyExtractor>,
    path: &str,
    problems: &mut Problems<'_>,
    places: &mut Places,
) -> Option<Limit> {
    let Some(name) = &spec.name else {
        if !misspelt(spec, &["name"]) {
            problems.at(
                path,
                "a limit needs a name (its rule's: name = \"per-user\", say)",
            );
        }
        return None;
    };
    places.push((format!("rule {name:?}"), format!("{path}.name")));
    places.push((format!("rule name {name:?}"), format!("{path}.name")));
    let mut rule = rule(spec, name, path, problems)?;
    if let Some(p) = spec.penalty {
        let mut penalty = Penalty::lock_for(p.lock_for.0);
        if let Some(after) = p.after {
            penalty = penalty.after(after);
        }
        if let Some(Dur(within)) = p.within {
            penalty = penalty.within(within);
        }
        rule = rule.with_penalty(penalty);
    }
    if let Some(cost) = spec.cost {
        rule = rule.with_cost(cost);
    }
    let mut limit = Limit::from_shared(rule, key);
    if let Some(min) = spec.min_cost {
        limit = limit.min_cost(min);
    }
    if let Some(policy) = spec.on_missing_key {
        limit = limit.on_missing_key(match policy {
            MissingSpec::Reject => MissingKey::Reject,
            MissingSpec::Skip => MissingKey::Skip,
        });
    }
    if spec.shadow {
        limit = limit.shadow();
    }
    Some(limit)
}

/// The rule named `name` of the one algorithm `spec` gives.
fn rule(spec: &LimitSpec, name: &str, path: &str, problems: &mut Problems<'_>) -> Option<Rule> {
    let mut algorithms = Vec::new();
    let window = |s: &Option<WindowSpec>, f: fn(&str, u64, Duration) -> Rule| {
        s.map(|w| f(name, w.limit, w.window.0))
    };
    algorithms.extend(window(&spec.fixed_window, |n, l, w| {
        Rule::fixed_window(n, l, w)
    }));
    algorithms.extend(window(&spec.fixed_window_from_first_hit, |n, l, w| {
        Rule::fixed_window_from_first_hit(n, l, w)
    }));
    algorithms.extend(window(&spec.sliding_log, |n, l, w| {
        Rule::sliding_log(n, l, w)
    }));
    algorithms.extend(window(&spec.sliding_window, |n, l, w| {
        Rule::sliding_window(n, l, w)
    }));
    algorithms.extend(
        spec.token_bucket
            .map(|b| Rule::token_bucket(name, b.capacity, b.refill.0)),
    );
    algorithms.extend(
        spec.token_bucket_stepped
            .map(|b| Rule::token_bucket_stepped(name, b.capacity, b.refill.0)),
    );
    algorithms.extend(
        spec.leaky_bucket
            .map(|b| Rule::leaky_bucket(name, b.capacity, b.drain.0)),
    );
    algorithms.extend(spec.gcra.map(|g| Rule::gcra(name, g.burst, g.rate.0)));
    match algorithms.len() {
        1 => Some(algorithms.remove(0)),
        0 if misspelt(spec, ALGORITHMS) => None,
        n => {
            problems.at(
                path,
                format!(
                    "limit {name:?} needs exactly one algorithm ({}); it has {n}",
                    ALGORITHMS.join(", ")
                ),
            );
            None
        }
    }
}

/// The fields that give a limit its algorithm.
const ALGORITHMS: &[&str] = &[
    "fixed_window",
    "fixed_window_from_first_hit",
    "sliding_log",
    "sliding_window",
    "token_bucket",
    "token_bucket_stepped",
    "leaky_bucket",
    "gcra",
];

/// Whether one of `spec`'s unknown keys, reported already with the name it stands for, is a
/// typo of one of `fields`: that it is missing is the same problem.
fn misspelt(spec: &LimitSpec, fields: &[&str]) -> bool {
    spec.unknown_keys
        .iter()
        .any(|key| typo_of(key, fields.iter().copied()).is_some())
}

/// A `client_ip` key: the peer's address, or the forwarded one when the peer is trusted.
fn client_ip(s: &ClientIpSpec) -> Arc<dyn KeyExtractor> {
    let mut client = key::client_ip(&s.trusted);
    if let Some(header) = s.header {
        client = client.header(match header {
            ForwardedSpec::XForwardedFor => ForwardedHeader::XForwardedFor,
            ForwardedSpec::Forwarded => ForwardedHeader::Forwarded,
            ForwardedSpec::XRealIp => ForwardedHeader::XRealIp,
        });
    }
    if let Some(bits) = s.ipv6_prefix {
        client = client.ipv6_prefix(bits);
    }
    if s.allow_trusting_everyone {
        client = client.allow_trusting_everyone();
    }
    Arc::new(client)
}

/// A `header` key, or why its name is not a header's.
fn header(spec: &HeaderSpec) -> Result<Arc<dyn KeyExtractor>, String> {
    let (name, duplicates) = match spec {
        HeaderSpec::Name(name) => (name, None),
        HeaderSpec::Table { name, duplicates } => (name, Some(duplicates)),
    };
    let header = key::header(name);
    header.validate().map_err(|e| problem_text(&e))?;
    let Some(duplicates) = duplicates else {
        return Ok(Arc::new(header));
    };
    let duplicates = match duplicates.unwrap_or(DuplicatesSpec::Reject) {
        DuplicatesSpec::Reject => Duplicates::Reject,
        DuplicatesSpec::First => Duplicates::First,
        DuplicatesSpec::Last => Duplicates::Last,
    };
    Ok(Arc::new(header.duplicates(duplicates)))
}

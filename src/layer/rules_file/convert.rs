//! A [`RulesFile`] turned into the layer's pieces: its settings onto the builder, each
//! entry into a [`Limit`] (or one per plan), each key into an extractor. Every problem is
//! collected, located at the field that holds it, rather than returned at the first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::report::{did_you_mean, typo_of, Problems};
use super::schema::{
    BucketSpec, Dur, HeaderSpec, KeySpec, LimitSpec, ModeSpec, PlanOfSpec, RulesFile,
    UnknownPlanSpec, WindowSpec,
};
use super::Loader;
use crate::error::ConfigError;
use crate::key::{self, ClientIp, Header, KeyExtractor, PeerIp};
use crate::layer::RateLimitLayerBuilder as Builder;
use crate::layer::{Limit, Mode, PlanOf, Plans, RateLimitLayer, UnknownPlan};
use crate::penalty::Penalty;
use crate::rate::Rate;
use crate::rule::Rule;
use crate::store::Store;

impl Loader {
    /// A layer of `file`'s rules added to `builder`, or every problem: those found so far
    /// (`problems`), the file's, and the layer's own, each located where it is written.
    pub(super) fn layer<St: Store>(
        &self,
        file: &RulesFile,
        builder: Builder<St>,
        mut problems: Problems,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let limits = self.limits_of(&file.limits, "limit", &mut problems);
        let mut builder = settings(file, builder, &mut problems).limits(limits);
        for (i, route) in file.routes.iter().enumerate() {
            let path = format!("route[{i}]");
            let limits = self.limits_of(&route.limits, &format!("{path}.limit"), &mut problems);
            // A route whose pattern did not read is reported already; its limits are
            // checked all the same.
            if !route.broken {
                let name = format!("route {:?}", route.pattern.trim());
                problems.name(name, format!("{path}.pattern"));
                builder = builder.route(&route.pattern, limits);
            }
        }
        // The layer's checks run on what the file's problems left, so that one reading
        // reports everything: an entry with a problem is left out or given a placeholder
        // that passes them, and reports nothing twice.
        match builder.build() {
            Ok(layer) if problems.len() == 0 => Ok(layer),
            Ok(_) => Err(problems.into_error()),
            Err(e) => Err(problems.located(&e)),
        }
    }

    /// The limits of the entries `specs`, the list at `path`.
    fn limits_of(&self, specs: &[LimitSpec], path: &str, problems: &mut Problems) -> Vec<Limit> {
        let specs = specs.iter().enumerate();
        specs
            .flat_map(|(i, spec)| self.limits(spec, &format!("{path}[{i}]"), problems))
            .collect()
    }

    /// The limits of one entry: one, or one per plan.
    fn limits(&self, spec: &LimitSpec, path: &str, problems: &mut Problems) -> Vec<Limit> {
        // An entry that did not read is reported already (see `salvage`).
        if spec.broken {
            return Vec::new();
        }
        let key = spec
            .key
            .as_ref()
            .map(|k| self.key_of(k, &format!("{path}.key"), problems));
        if let Some(plan_of) = &spec.plan_of {
            return self.plans(spec, plan_of, key, path, problems);
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
        limit(spec, key, path, problems).into_iter().collect()
    }

    /// The limits of an entry with plans: one per plan, chosen by `plan_of`.
    fn plans(
        &self,
        spec: &LimitSpec,
        plan_of: &PlanOfSpec,
        key: Option<Arc<dyn KeyExtractor>>,
        path: &str,
        problems: &mut Problems,
    ) -> Vec<Limit> {
        let found_before = problems.len();
        let plan_of = self.plan_lookup(plan_of, &format!("{path}.plan_of"), problems);
        let unknown = spec.unknown_plan.as_ref().map(|unknown| match unknown {
            UnknownPlanSpec::Reject => UnknownPlan::Reject,
            UnknownPlanSpec::Unlimited => UnknownPlan::Unlimited,
            UnknownPlanSpec::Plan(plan) => UnknownPlan::Plan(plan.clone().into()),
        });
        if unknown.is_none() {
            problems.at(
                path,
                "plans need unknown_plan: \"reject\", \"unlimited\" or { plan = \"…\" } (what a request of no known plan gets)",
            );
        }
        let (Some(plan_of), Some(unknown), Some(key)) = (plan_of, unknown, key) else {
            if spec.key.is_none() {
                problems.at(
                    path,
                    "plans need a key (key = { header = \"x-api-key\" }, say)",
                );
            }
            return Vec::new();
        };
        let mut plans = Plans::new(plan_of, unknown);
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
            if let Some(limit) = limit(entry, entry_key, &entry_path, problems) {
                plans = plans.plan(plan.clone(), limit);
            }
        }
        // A group missing a plan it was written with would draw the layer's complaints
        // about what is missing (an unknown default, say): left out instead.
        if problems.len() > found_before {
            return Vec::new();
        }
        // The plans' own problems (none given, a name twice, an unknown default) name no
        // rule: located at the group.
        problems.name("plans:".into(), path.into());
        plans.into_iter().collect()
    }

    /// The plan lookup `spec` names, written at `path`.
    fn plan_lookup(
        &self,
        spec: &PlanOfSpec,
        path: &str,
        problems: &mut Problems,
    ) -> Option<PlanOf> {
        let plan_of = match spec {
            PlanOfSpec::Header(name) => PlanOf::header(name),
            PlanOfSpec::Named(name) => {
                registered(&self.plans, name, "plan lookup", "plan_of", path, problems)?
            }
        };
        let Some(e) = plan_of.problem() else {
            return Some(plan_of);
        };
        problems.error_at(path, e.clone());
        None
    }

    /// The extractor `spec` describes; after reporting its problems, a placeholder (so that
    /// the layer's checks do not report them again).
    fn key_of(&self, spec: &KeySpec, path: &str, problems: &mut Problems) -> Arc<dyn KeyExtractor> {
        let placeholder = || Arc::new(key::global());
        let Some(extractor) = self.extractor(spec, path, problems) else {
            return placeholder();
        };
        let Err(e) = extractor.validate() else {
            return extractor;
        };
        // Nested keys report their own problems; report each once.
        if !matches!(spec, KeySpec::Or(_) | KeySpec::All(_)) {
            problems.error_at(path, e);
        }
        placeholder()
    }

    /// The extractor `spec` describes, or `None` after reporting why there is none.
    fn extractor(
        &self,
        spec: &KeySpec,
        path: &str,
        problems: &mut Problems,
    ) -> Option<Arc<dyn KeyExtractor>> {
        let extractor: Arc<dyn KeyExtractor> = match spec {
            KeySpec::PeerIp(s) => {
                Arc::new(key::peer_ip().given(s.ipv6_prefix, PeerIp::ipv6_prefix))
            }
            KeySpec::ClientIp(s) => Arc::new(
                key::client_ip(&s.trusted)
                    .given(s.header.map(Into::into), ClientIp::header)
                    .given(s.ipv6_prefix, ClientIp::ipv6_prefix)
                    .given(s.allow_trusting_everyone.then_some(()), |c, ()| {
                        c.allow_trusting_everyone()
                    }),
            ),
            KeySpec::Header(HeaderSpec::Name(name)) => Arc::new(key::header(name)),
            KeySpec::Header(HeaderSpec::Table { name, duplicates }) => {
                Arc::new(key::header(name).given(duplicates.map(Into::into), Header::duplicates))
            }
            KeySpec::Route => Arc::new(key::route()),
            KeySpec::Method => Arc::new(key::method()),
            KeySpec::Global => Arc::new(key::global()),
            KeySpec::Constant(c) => Arc::new(key::constant(c.clone().into_bytes())),
            KeySpec::Named(name) => {
                registered(&self.keys, name, "key extractor", "key", path, problems)?
            }
            KeySpec::Or(keys) if keys.len() >= 2 => {
                let keys = self.keys_of(keys, &format!("{path}.or"), problems);
                keys.into_iter().reduce(|a, b| Arc::new(a.or(b)))?
            }
            KeySpec::Or(_) => {
                problems.at(path, "or needs two keys or more");
                return None;
            }
            KeySpec::All(keys) => match &self.keys_of(keys, &format!("{path}.all"), problems)[..] {
                [a, b] => Arc::new((a.clone(), b.clone())),
                [a, b, c] => Arc::new((a.clone(), b.clone(), c.clone())),
                _ => {
                    problems.at(path, "all joins two or three keys");
                    return None;
                }
            },
        };
        Some(extractor)
    }

    /// The extractors of `keys`, the list at `path`.
    fn keys_of(
        &self,
        keys: &[KeySpec],
        path: &str,
        problems: &mut Problems,
    ) -> Vec<Arc<dyn KeyExtractor>> {
        let keys = keys.iter().enumerate();
        keys.map(|(i, k)| self.key_of(k, &format!("{path}[{i}]"), problems))
            .collect()
    }
}

/// What the code registered as `name` with `Loader::{registers}`; if nothing, a problem at
/// `path` naming the `what` it should be, the registered name `name` is a typo of, and
/// every name registered.
fn registered<T: Clone>(
    map: &BTreeMap<String, T>,
    name: &str,
    what: &str,
    registers: &str,
    path: &str,
    problems: &mut Problems,
) -> Option<T> {
    if let Some(found) = map.get(name) {
        return Some(found.clone());
    }
    let known: Vec<&String> = map.keys().collect();
    let near = did_you_mean(name, known.iter().map(|k| k.as_str()));
    problems.at(path, format!("unknown {what} {name:?}{near}: none is registered under that name (Loader::{registers} registers one; registered: {known:?})"));
    None
}

/// The file's settings on `builder`.
fn settings<St: Store>(
    file: &RulesFile,
    builder: Builder<St>,
    problems: &mut Problems,
) -> Builder<St> {
    let mode = match (file.mode, file.max_wait) {
        (Some(ModeSpec::Enforce), _) => Some(Mode::Enforce),
        (Some(ModeSpec::Shadow), _) => Some(Mode::Shadow),
        (Some(ModeSpec::Wait), Some(Dur(max_wait))) => Some(Mode::Wait { max_wait }),
        (Some(ModeSpec::Wait), None) => {
            problems.at("mode", "mode \"wait\" needs max_wait (\"2s\", say)");
            None
        }
        (None, _) => None,
    };
    builder
        .given(mode, Builder::mode)
        .given(file.on_failure.map(Into::into), Builder::on_failure)
        .given(file.headers_on_allowed, Builder::headers_on_allowed)
        .given(file.legacy_headers, Builder::legacy_headers)
        .given(file.max_held, Builder::max_held)
        .given(file.max_held_per_key, Builder::max_held_per_key)
        .given(file.log_interval.map(|Dur(i)| i), Builder::log_interval)
}

/// Sets what the file gives on a builder.
trait Given: Sized {
    /// `self` with the file's `value` set on it, when the file gives one.
    fn given<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }
}

impl<B> Given for B {}

/// The limit `spec` describes, counting under `key`.
fn limit(
    spec: &LimitSpec,
    key: Arc<dyn KeyExtractor>,
    path: &str,
    problems: &mut Problems,
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
    problems.name(format!("rule {name:?}"), format!("{path}.name"));
    problems.name(format!("rule name {name:?}"), format!("{path}.name"));
    let penalty = spec.penalty.map(|p| {
        let within = p.within.map(|Dur(within)| within);
        let lock = Penalty::lock_for(p.lock_for.0);
        lock.given(p.after, Penalty::after)
            .given(within, Penalty::within)
    });
    let rule = rule(spec, name, path, problems)?
        .given(penalty, Rule::with_penalty)
        .given(spec.cost, Rule::with_cost);
    let limit = Limit::from_shared(rule, key)
        .given(spec.min_cost, Limit::min_cost)
        .given(spec.on_missing_key.map(Into::into), Limit::on_missing_key);
    Some(if spec.shadow { limit.shadow() } else { limit })
}

/// The rule named `name` of the one algorithm `spec` gives.
fn rule<'n>(spec: &LimitSpec, name: &'n str, path: &str, problems: &mut Problems) -> Option<Rule> {
    // Each algorithm's field, and its rule at `name` if the field is given.
    let window = |field, w: Option<WindowSpec>, rule: fn(&'n str, u64, Duration) -> Rule| {
        (field, w.map(|w| rule(name, w.limit, w.window.0)))
    };
    let bucket = |field, b: Option<BucketSpec>, rule: fn(&'n str, u64, Rate) -> Rule| {
        (field, b.map(|b| rule(name, b.capacity, b.refill.0)))
    };
    let s = spec;
    let algorithms = [
        window("fixed_window", s.fixed_window, Rule::fixed_window),
        window(
            "fixed_window_from_first_hit",
            s.fixed_window_from_first_hit,
            Rule::fixed_window_from_first_hit,
        ),
        window("sliding_log", s.sliding_log, Rule::sliding_log),
        window("sliding_window", s.sliding_window, Rule::sliding_window),
        bucket("token_bucket", s.token_bucket, Rule::token_bucket),
        bucket(
            "token_bucket_stepped",
            s.token_bucket_stepped,
            Rule::token_bucket_stepped,
        ),
        (
            "leaky_bucket",
            s.leaky_bucket
                .map(|b| Rule::leaky_bucket(name, b.capacity, b.drain.0)),
        ),
        ("gcra", s.gcra.map(|g| Rule::gcra(name, g.burst, g.rate.0))),
    ];
    let fields = algorithms.each_ref().map(|(field, _)| *field);
    let mut given: Vec<Rule> = algorithms
        .into_iter()
        .filter_map(|(_, rule)| rule)
        .collect();
    match given.len() {
        1 => given.pop(),
        0 if misspelt(spec, &fields) => None,
        n => {
            let fields = fields.join(", ");
            let why = format!("limit {name:?} needs exactly one algorithm ({fields}); it has {n}");
            problems.at(path, why);
            None
        }
    }
}

/// Whether one of `spec`'s unknown keys, reported already with the name it stands for, is a
/// typo of one of `fields`: that it is missing is the same problem.
fn misspelt(spec: &LimitSpec, fields: &[&str]) -> bool {
    spec.unknown_keys
        .iter()
        .any(|key| typo_of(key, fields.iter().copied()).is_some())
}

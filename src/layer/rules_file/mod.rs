//! Rules from a file (feature `serde`): a layer's limits, routes, keys, plans, mode and
//! policies written in TOML (or any format serde reads), checked with messages that name
//! the file, the line and the field.
//!
//! ```toml
//! mode = "enforce"            # "enforce", "shadow", or "wait" with max_wait = "2s"
//! on_failure = "fail_open"    # "fail_open", "fail_closed", "fallback"
//! headers_on_allowed = true
//!
//! [[limit]]                   # applies to every request
//! name = "ip"
//! token_bucket = { capacity = 100, refill = "10/s" }
//! key = { client_ip = { trusted = ["10.0.0.0/8"] } }
//! penalty = { lock_for = "10m", after = 20, within = "1m" }
//!
//! [[route]]
//! pattern = "POST /sms/send"
//! [[route.limit]]
//! name = "sms-min"
//! fixed_window = { limit = 1, window = "1m" }
//! key = { header = "user-id" }
//!
//! [[route]]
//! pattern = "/api/*"
//! [[route.limit]]             # plans: the rule is chosen by the request's plan
//! key = { header = "x-api-key" }
//! plan_of = { header = "x-plan" }
//! unknown_plan = { plan = "free" }    # or "reject", or "unlimited"
//! plan = [
//!   { plan = "free", name = "api-free", fixed_window = { limit = 100, window = "1h" } },
//!   { plan = "pro", name = "api-pro", gcra = { rate = "100/s", burst = 100 } },
//! ]
//! ```
//!
//! # Limits
//!
//! A limit has a `name` (its rule's), exactly one algorithm, a `key`, and optionally a
//! `penalty`, a default `cost`, a `min_cost`, `on_missing_key` (`"reject"` or `"skip"`) and
//! `shadow = true`. The algorithms, with what [`Rule`]'s constructors of the same names take:
//!
//! | field | parameters |
//! |---|---|
//! | `fixed_window`, `fixed_window_from_first_hit`, `sliding_log`, `sliding_window` | `limit`, `window` |
//! | `token_bucket`, `token_bucket_stepped` | `capacity`, `refill` |
//! | `leaky_bucket` | `capacity`, `drain` |
//! | `gcra` | `rate`, `burst` |
//!
//! Durations are strings of whole numbers with units `us`, `ms`, `s`, `m`, `h`, `d`
//! (`"90s"`, `"1h30m"`); rates are an amount per duration, the number 1 optional
//! (`"10/s"`, `"100/1m"`, `"3/500ms"`).
//!
//! # Keys
//!
//! | `key = …` | extractor |
//! |---|---|
//! | `"peer_ip"`, `{ peer_ip = { ipv6_prefix = 48 } }` | [`key::peer_ip`] |
//! | `{ client_ip = { trusted = ["10.0.0.0/8"], header = "x_forwarded_for", ipv6_prefix = 64 } }` | [`key::client_ip`] (`header`: `"x_forwarded_for"`, `"forwarded"`, `"x_real_ip"`) |
//! | `{ header = "user-id" }`, `{ header = { name = "user-id", duplicates = "last" } }` | [`key::header`] |
//! | `"route"`, `"method"`, `"global"`, `{ constant = "abc" }` | [`key::route`], [`key::method`], [`key::global`], [`key::constant`] |
//! | `{ or = [key, key, …] }` | the first that finds a key ([`KeyExtractor::or`]) |
//! | `{ all = [key, key] }` | both keys joined (two or three: a tuple) |
//! | `{ named = "api-key" }` | an extractor the code registered with [`Loader::key`] |
//!
//! # File and code together
//!
//! Closures cannot come from a file: a key read by code, a cost function, a plan looked up
//! in the server's records. The code registers them on the [`Loader`] by name
//! ([`Loader::key`], [`Loader::plan_of`]) and the file names them (`{ named = "api-key" }`,
//! `plan_of = { named = "plan-of-key" }`). The file's limits are added to a builder the code
//! gives ([`Loader::load`]), so hooks ([`on_reject`](crate::layer::RateLimitLayerBuilder::on_reject),
//! [`on_decision`](crate::layer::RateLimitLayerBuilder::on_decision), exemptions) and limits
//! that need code (a [`Limit::cost`](crate::layer::Limit::cost) function) stay in the code,
//! beside the file's, decided in the same batch.
//!
//! # Errors
//!
//! Every problem is reported at once, in a [`ConfigError`] whose problems each start with
//! `file:line:column:` and the field's path (`route[0].limit[1].fixed_window`): the TOML
//! syntax, a field that does not exist or has the wrong type, a duration or rate that
//! does not parse (from `toml`'s own spans), and whatever the layer's
//! [`build`](crate::layer::RateLimitLayerBuilder::build) refuses — a zero limit, a route no
//! request can match, a name bound to two rules — located at the limit or route it names.
//! A [`RulesFile`] read from another format is checked the same way, its problems named by
//! path without lines.
//!
//! With a [`ReloadHandle`](crate::layer::ReloadHandle), a new file replaces the rules of a
//! running layer, and a file with a problem leaves them as they were: see
//! `examples/reload.rs`.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::error::ConfigError;
use crate::key::{self, Duplicates, ForwardedHeader, KeyExtractor};
use crate::layer::{
    FailurePolicy, Limit, MissingKey, Mode, PlanOf, Plans, RateLimitLayer, RateLimitLayerBuilder,
    UnknownPlan,
};
use crate::penalty::Penalty;
use crate::rate::Rate;
use crate::rule::Rule;
use crate::store::Store;

/// The contents of a rules file, as any serde format reads them (see the
/// [module docs](self) for the fields). [`Loader::load`] reads TOML files with line
/// numbers; for JSON, YAML or anything else, deserialize a `RulesFile` and give it to
/// [`Loader::build`].
///
/// ```
/// use tollgate::layer::RateLimitLayer;
/// use tollgate::layer::rules_file::{Loader, RulesFile};
/// use tollgate::{Limiter, MemoryStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let file: RulesFile = serde_json::from_str(r#"{
///     "limit": [{ "name": "per-user", "fixed_window": { "limit": 100, "window": "1m" },
///                 "key": { "header": "user-id" } }]
/// }"#)?;
/// let layer = Loader::new().build(&file, RateLimitLayer::builder(Limiter::new(MemoryStore::new())))?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesFile {
    #[serde(default)]
    mode: Option<ModeSpec>,
    #[serde(default)]
    max_wait: Option<Dur>,
    #[serde(default)]
    on_failure: Option<FailureSpec>,
    #[serde(default)]
    headers_on_allowed: Option<bool>,
    #[serde(default)]
    legacy_headers: Option<bool>,
    #[serde(default)]
    max_held: Option<usize>,
    #[serde(default)]
    max_held_per_key: Option<usize>,
    #[serde(default)]
    log_interval: Option<Dur>,
    #[serde(default, rename = "limit")]
    limits: Vec<LimitSpec>,
    #[serde(default, rename = "route")]
    routes: Vec<RouteSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ModeSpec {
    Enforce,
    Shadow,
    Wait,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailureSpec {
    FailOpen,
    FailClosed,
    Fallback,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSpec {
    pattern: String,
    #[serde(default, rename = "limit")]
    limits: Vec<LimitSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    fixed_window: Option<WindowSpec>,
    #[serde(default)]
    fixed_window_from_first_hit: Option<WindowSpec>,
    #[serde(default)]
    sliding_log: Option<WindowSpec>,
    #[serde(default)]
    sliding_window: Option<WindowSpec>,
    #[serde(default)]
    token_bucket: Option<BucketSpec>,
    #[serde(default)]
    token_bucket_stepped: Option<BucketSpec>,
    #[serde(default)]
    leaky_bucket: Option<LeakySpec>,
    #[serde(default)]
    gcra: Option<GcraSpec>,
    #[serde(default)]
    penalty: Option<PenaltySpec>,
    #[serde(default)]
    cost: Option<u64>,
    #[serde(default)]
    min_cost: Option<u64>,
    #[serde(default)]
    on_missing_key: Option<MissingSpec>,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    key: Option<KeySpec>,
    /// In a plan's entry: the plan's name.
    #[serde(default)]
    plan: Option<String>,
    /// Makes this limit a group of plans.
    #[serde(default)]
    plan_of: Option<PlanOfSpec>,
    #[serde(default)]
    unknown_plan: Option<UnknownPlanSpec>,
    #[serde(default, rename = "plans")]
    plan_entries: Vec<LimitSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowSpec {
    limit: u64,
    window: Dur,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketSpec {
    capacity: u64,
    refill: RateSpec,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeakySpec {
    capacity: u64,
    drain: RateSpec,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct GcraSpec {
    rate: RateSpec,
    burst: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct PenaltySpec {
    lock_for: Dur,
    #[serde(default)]
    after: Option<u64>,
    #[serde(default)]
    within: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum MissingSpec {
    Reject,
    Skip,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum PlanOfSpec {
    Header(String),
    Named(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum UnknownPlanSpec {
    Reject,
    Unlimited,
    Plan(String),
}

/// A duration written `"90s"`, `"1h30m"`, `"250ms"`.
#[derive(Debug, Clone, Copy)]
struct Dur(Duration);

/// A rate written `"10/s"`, `"100/1m"`.
#[derive(Debug, Clone, Copy)]
struct RateSpec(Rate);

fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration: write whole numbers with units us, ms, s, m, h, d (\"90s\", \"1h30m\")"
        )
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut micros: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| bad())?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let per_unit: u64 = match unit.trim() {
            "us" | "µs" => 1,
            "ms" => 1_000,
            "s" => 1_000_000,
            "m" | "min" => 60_000_000,
            "h" => 3_600_000_000,
            "d" => 86_400_000_000,
            _ => return Err(bad()),
        };
        micros = number
            .checked_mul(per_unit)
            .and_then(|m| micros.checked_add(m))
            .ok_or_else(bad)?;
        rest = after.trim_start();
    }
    Ok(Duration::from_micros(micros))
}

fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = |why: String| format!("{text:?} is not a rate (\"10/s\", \"100/1m\"): {why}");
    let (amount, period) = text.split_once('/').ok_or_else(|| bad("no '/'".into()))?;
    let amount: u64 = amount
        .trim()
        .parse()
        .map_err(|_| bad(format!("{:?} is not a whole number", amount.trim())))?;
    let period = period.trim();
    let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(period).map_err(bad)?
    } else {
        parse_duration(&format!("1{period}")).map_err(bad)?
    };
    Ok(Rate::new(amount, period))
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map(Dur).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for RateSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_rate(&text).map(RateSpec).map_err(de::Error::custom)
    }
}

/// A key extractor as written in a file: a name, or a table of one entry.
#[derive(Debug, Clone)]
enum KeySpec {
    PeerIp(PeerIpSpec),
    ClientIp(ClientIpSpec),
    Header(HeaderSpec),
    Route,
    Method,
    Global,
    Constant(String),
    Named(String),
    Or(Vec<KeySpec>),
    All(Vec<KeySpec>),
}

/// The table forms of [`KeySpec`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum KeyTable {
    PeerIp(PeerIpSpec),
    ClientIp(ClientIpSpec),
    Header(HeaderSpec),
    Constant(String),
    Named(String),
    Or(Vec<KeySpec>),
    All(Vec<KeySpec>),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerIpSpec {
    #[serde(default)]
    ipv6_prefix: Option<u8>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientIpSpec {
    trusted: Vec<String>,
    #[serde(default)]
    header: Option<ForwardedSpec>,
    #[serde(default)]
    ipv6_prefix: Option<u8>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ForwardedSpec {
    XForwardedFor,
    Forwarded,
    XRealIp,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum HeaderSpec {
    Name(String),
    Table {
        name: String,
        #[serde(default)]
        duplicates: Option<DuplicatesSpec>,
    },
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DuplicatesSpec {
    Reject,
    First,
    Last,
}

const KEY_NAMES: &[&str] = &["peer_ip", "route", "method", "global"];

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeySpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a key extractor: \"peer_ip\", \"route\", \"method\", \"global\", or a table of one entry \
                     (peer_ip, client_ip, header, constant, named, or, all)",
                )
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<KeySpec, E> {
                match name {
                    "peer_ip" => Ok(KeySpec::PeerIp(PeerIpSpec::default())),
                    "route" => Ok(KeySpec::Route),
                    "method" => Ok(KeySpec::Method),
                    "global" => Ok(KeySpec::Global),
                    "client_ip" | "header" | "constant" | "named" | "or" | "all" => {
                        Err(E::custom(format_args!(
                            "the key extractor {name:?} needs parameters: write it as a table, {{ {name} = … }}"
                        )))
                    }
                    other => Err(E::custom(format_args!(
                        "unknown key extractor {other:?}: expected one of {KEY_NAMES:?}, a table (peer_ip, client_ip, header, constant, or, all), \
                         or {{ named = \"…\" }} for one the code registered"
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KeySpec, A::Error> {
                let table = KeyTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(match table {
                    KeyTable::PeerIp(s) => KeySpec::PeerIp(s),
                    KeyTable::ClientIp(s) => KeySpec::ClientIp(s),
                    KeyTable::Header(s) => KeySpec::Header(s),
                    KeyTable::Constant(s) => KeySpec::Constant(s),
                    KeyTable::Named(s) => KeySpec::Named(s),
                    KeyTable::Or(s) => KeySpec::Or(s),
                    KeyTable::All(s) => KeySpec::All(s),
                })
            }
        }

        d.deserialize_any(KeyVisitor)
    }
}

/// Turns rules files into layers, with the key extractors and plan lookups that only code
/// can provide, registered by name. See the [module docs](self).
///
/// ```
/// use tollgate::key;
/// use tollgate::layer::{PlanOf, RateLimitLayer};
/// use tollgate::layer::rules_file::Loader;
/// use tollgate::{Limiter, MemoryStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let loader = Loader::new()
///     // The API key from the query string, for `key = { named = "api-key" }`.
///     .key("api-key", key::from_fn(|req| {
///         req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix("api_key=")).map(str::to_owned)
///     }))
///     .plan_of("plan-of-key", PlanOf::from_fn(|_req| Some("free")));
/// let toml = r#"
///     [[limit]]
///     key = { named = "api-key" }
///     plan_of = { named = "plan-of-key" }
///     unknown_plan = "reject"
///     plans = [
///       { plan = "free", name = "api-free", fixed_window = { limit = 100, window = "1h" } },
///       { plan = "pro", name = "api-pro", gcra = { rate = "100/s", burst = 100 } },
///     ]
/// "#;
/// let builder = RateLimitLayer::builder(Limiter::new(MemoryStore::new()));
/// let layer = loader.from_toml(toml, "rules.toml", builder)?;
///
/// // A problem names the file, the line and the field.
/// let builder = RateLimitLayer::builder(Limiter::new(MemoryStore::new()));
/// let err = loader.from_toml("[[limit]]\nname = \"x\"\nkey = \"global\"\nfixed_window = { limit = 0, window = \"1m\" }\n", "rules.toml", builder)
///     .unwrap_err();
/// assert!(err.to_string().contains("rules.toml:2:1: limit[0].name: rule \"x\": fixed window limit must be at least 1"), "{err}");
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Loader {
    keys: HashMap<String, Arc<dyn KeyExtractor>>,
    plans: HashMap<String, PlanOf>,
}

impl Loader {
    /// A loader knowing only the built-in extractors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `extractor` under `name`, for `key = { named = "name" }` (a later one
    /// under the same name replaces it).
    pub fn key(mut self, name: impl Into<String>, extractor: impl KeyExtractor) -> Self {
        self.keys.insert(name.into(), Arc::new(extractor));
        self
    }

    /// Registers `plan_of` under `name`, for `plan_of = { named = "name" }`.
    pub fn plan_of(mut self, name: impl Into<String>, plan_of: PlanOf) -> Self {
        self.plans.insert(name.into(), plan_of);
        self
    }

    /// Reads the TOML file at `path` and builds a layer of its rules added to `builder`;
    /// every problem is reported at once, each naming the file, the line and the field.
    pub fn load<St: Store>(
        &self,
        path: impl AsRef<Path>,
        builder: RateLimitLayerBuilder<St>,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{origin}: cannot read the rules file: {e}")))?;
        self.from_toml(&text, &origin, builder)
    }

    /// [`load`](Self::load) for TOML text; `origin` names it in messages (a file name).
    pub fn from_toml<St: Store>(
        &self,
        text: &str,
        origin: &str,
        builder: RateLimitLayerBuilder<St>,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let index = Index::of(text, origin);
        let file: RulesFile = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| index.at_span(&span))
                .unwrap_or_default();
            ConfigError::new(format!("{origin}{at}: {}", e.message().trim()))
        })?;
        self.build_located(&file, builder, &index)
    }

    /// Builds a layer of `file`'s rules (read from any serde format) added to `builder`;
    /// every problem is reported at once, each naming the field's path.
    pub fn build<St: Store>(
        &self,
        file: &RulesFile,
        builder: RateLimitLayerBuilder<St>,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        self.build_located(file, builder, &Index::default())
    }

    fn build_located<St: Store>(
        &self,
        file: &RulesFile,
        mut builder: RateLimitLayerBuilder<St>,
        index: &Index,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let mut problems = Problems {
            index,
            found: Vec::new(),
        };
        // Where each rule name and route pattern is written, for the layer's own messages.
        let mut places: Vec<(String, String)> = Vec::new();

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
        for (i, spec) in file.limits.iter().enumerate() {
            let path = format!("limit[{i}]");
            builder = builder.limits(self.limits(spec, &path, &mut problems, &mut places));
        }
        for (i, route) in file.routes.iter().enumerate() {
            let path = format!("route[{i}]");
            places.push((
                format!("route {:?}", route.pattern.trim()),
                format!("{path}.pattern"),
            ));
            let mut limits = Vec::new();
            for (j, spec) in route.limits.iter().enumerate() {
                let path = format!("{path}.limit[{j}]");
                limits.extend(self.limits(spec, &path, &mut problems, &mut places));
            }
            builder = builder.route(&route.pattern, limits);
        }
        if !problems.found.is_empty() {
            return Err(problems.into_error());
        }
        builder.build().map_err(|e| {
            for problem in e.problems() {
                // The layer names the rule or route; the file knows where it is written.
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
        })
    }

    /// The limits of one entry: one, or one per plan.
    fn limits(
        &self,
        spec: &LimitSpec,
        path: &str,
        problems: &mut Problems<'_>,
        places: &mut Vec<(String, String)>,
    ) -> Vec<Limit> {
        let key = spec
            .key
            .as_ref()
            .map(|k| self.key_of(k, &format!("{path}.key"), problems));
        let Some(plan_of) = &spec.plan_of else {
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
                problems.at(path, "a limit needs a key (key = \"global\", say)");
                return Vec::new();
            };
            return self
                .limit(spec, key, path, problems, places)
                .into_iter()
                .collect();
        };
        let plan_of = match plan_of {
            PlanOfSpec::Header(name) => PlanOf::try_header(name)
                .map_err(|e| problems.error_at(&format!("{path}.plan_of"), e))
                .ok(),
            PlanOfSpec::Named(name) => {
                let found = self.plans.get(name).cloned();
                if found.is_none() {
                    let mut known: Vec<&String> = self.plans.keys().collect();
                    known.sort();
                    problems.at(
                        &format!("{path}.plan_of"),
                        format!("no plan lookup is registered as {name:?} (Loader::plan_of registers one; registered: {known:?})"),
                    );
                }
                found
            }
        };
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
            if let Some(limit) = self.limit(entry, entry_key, &entry_path, problems, places) {
                plans = plans.plan_limit(plan.clone(), limit);
            }
        }
        // The plans' own problems (none given, a name twice, an unknown default) name no
        // rule: located at the group.
        places.push(("plans:".into(), path.into()));
        plans.into_iter().collect()
    }

    fn limit(
        &self,
        spec: &LimitSpec,
        key: Arc<dyn KeyExtractor>,
        path: &str,
        problems: &mut Problems<'_>,
        places: &mut Vec<(String, String)>,
    ) -> Option<Limit> {
        let Some(name) = &spec.name else {
            problems.at(
                path,
                "a limit needs a name (its rule's: name = \"per-user\", say)",
            );
            return None;
        };
        places.push((format!("rule {name:?}"), format!("{path}.name")));
        places.push((format!("rule name {name:?}"), format!("{path}.name")));
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
        algorithms.extend(spec.gcra.map(|g| Rule::gcra(name, g.rate.0, g.burst)));
        let mut rule = match algorithms.len() {
            1 => algorithms.remove(0),
            n => {
                problems.at(
                    path,
                    format!(
                        "limit {name:?} needs exactly one algorithm (fixed_window, fixed_window_from_first_hit, sliding_log, \
                         sliding_window, token_bucket, token_bucket_stepped, leaky_bucket, gcra); it has {n}"
                    ),
                );
                return None;
            }
        };
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

    /// The extractor `spec` describes; a placeholder after reporting its problem.
    fn key_of(
        &self,
        spec: &KeySpec,
        path: &str,
        problems: &mut Problems<'_>,
    ) -> Arc<dyn KeyExtractor> {
        let extractor: Result<Arc<dyn KeyExtractor>, String> = match spec {
            KeySpec::PeerIp(s) => {
                let mut peer = key::peer_ip();
                if let Some(bits) = s.ipv6_prefix {
                    peer = peer.ipv6_prefix(bits);
                }
                Ok(Arc::new(peer))
            }
            KeySpec::ClientIp(s) => {
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
                Ok(Arc::new(client))
            }
            KeySpec::Header(HeaderSpec::Name(name)) => key::try_header(name)
                .map(|h| Arc::new(h) as Arc<dyn KeyExtractor>)
                .map_err(|e| problem_text(&e)),
            KeySpec::Header(HeaderSpec::Table { name, duplicates }) => key::try_header(name)
                .map(|h| {
                    let duplicates = match duplicates.unwrap_or(DuplicatesSpec::Reject) {
                        DuplicatesSpec::Reject => Duplicates::Reject,
                        DuplicatesSpec::First => Duplicates::First,
                        DuplicatesSpec::Last => Duplicates::Last,
                    };
                    Arc::new(h.duplicates(duplicates)) as Arc<dyn KeyExtractor>
                })
                .map_err(|e| problem_text(&e)),
            KeySpec::Route => Ok(Arc::new(key::route())),
            KeySpec::Method => Ok(Arc::new(key::method())),
            KeySpec::Global => Ok(Arc::new(key::global())),
            KeySpec::Constant(c) => Ok(Arc::new(key::constant(c.clone().into_bytes()))),
            KeySpec::Named(name) => self.keys.get(name).cloned().ok_or_else(|| {
                let mut known: Vec<&String> = self.keys.keys().collect();
                known.sort();
                format!("unknown key extractor {name:?}: no extractor is registered under that name (Loader::key registers one; registered: {known:?})")
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
        };
        match extractor {
            Ok(extractor) => {
                if let Err(e) = extractor.validate() {
                    // Nested keys report their own problems; report each once.
                    if !matches!(spec, KeySpec::Or(_) | KeySpec::All(_)) {
                        problems.error_at(path, e);
                    }
                }
                extractor
            }
            Err(why) => {
                if !why.is_empty() {
                    problems.at(path, why);
                }
                Arc::new(key::global())
            }
        }
    }
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.keys.keys().collect();
        keys.sort();
        let mut plans: Vec<&String> = self.plans.keys().collect();
        plans.sort();
        f.debug_struct("Loader")
            .field("keys", &keys)
            .field("plan_of", &plans)
            .finish()
    }
}

/// A problem without `ConfigError`'s "invalid rate limit configuration" preamble.
fn problem_text(e: &ConfigError) -> String {
    e.problems().collect::<Vec<_>>().join("; ")
}

/// Where each field of a TOML text is written.
#[derive(Debug, Default)]
struct Index {
    origin: String,
    /// Line starts, in bytes.
    lines: Vec<usize>,
    /// Each field's path (`route[0].limit[1].name`) and its span, from its key on.
    fields: HashMap<String, Range<usize>>,
}

impl Index {
    fn of(text: &str, origin: &str) -> Self {
        let lines = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        let mut index = Index {
            origin: origin.into(),
            lines,
            fields: HashMap::new(),
        };
        // A text that does not parse has no fields; `toml::from_str` reports why.
        if let Ok(root) = toml::de::DeTable::parse(text) {
            index.walk_table(root.get_ref(), "");
        }
        index
    }

    fn walk_table(&mut self, table: &toml::de::DeTable<'_>, path: &str) {
        for (key, value) in table.iter() {
            let path = match path {
                "" => key.get_ref().to_string(),
                _ => format!("{path}.{}", key.get_ref()),
            };
            let span = key.span().start.min(value.span().start)..value.span().end;
            self.walk_value(value, &path, span);
        }
    }

    fn walk_value(
        &mut self,
        value: &toml::Spanned<toml::de::DeValue<'_>>,
        path: &str,
        span: Range<usize>,
    ) {
        self.fields.insert(path.to_owned(), span);
        match value.get_ref() {
            toml::de::DeValue::Table(table) => self.walk_table(table, path),
            toml::de::DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.walk_value(item, &format!("{path}[{i}]"), item.span());
                }
            }
            _ => {}
        }
    }

    /// `:line:column` of a byte offset, 1-based.
    fn line_col(&self, offset: usize) -> Option<(usize, usize)> {
        if self.lines.is_empty() {
            return None;
        }
        let line = self.lines.partition_point(|&start| start <= offset);
        let start = self.lines.get(line.checked_sub(1)?)?;
        Some((line, offset - start + 1))
    }

    /// `:line:column: path` for an error's span: the innermost field that holds it.
    fn at_span(&self, span: &Range<usize>) -> String {
        let field = self
            .fields
            .iter()
            .filter(|(_, s)| s.start <= span.start && span.end <= s.end.max(s.start + 1))
            .min_by_key(|(_, s)| s.end - s.start)
            .map(|(path, _)| path.as_str());
        let mut at = String::new();
        if let Some((line, col)) = self.line_col(span.start) {
            at = format!(":{line}:{col}");
        }
        if let Some(field) = field {
            at.push_str(": ");
            at.push_str(field);
        }
        at
    }

    /// `origin:line:column: path` for a field, or the nearest enclosing one written.
    fn at_path(&self, path: &str) -> String {
        let mut line = None;
        let mut probe = path;
        loop {
            if let Some(span) = self.fields.get(probe) {
                line = self.line_col(span.start);
                break;
            }
            match probe.rfind(['.', '[']) {
                Some(cut) => probe = &probe[..cut],
                None => break,
            }
        }
        let mut at = self.origin.clone();
        if let Some((line, col)) = line {
            at.push_str(&format!(":{line}:{col}"));
        }
        if !path.is_empty() {
            if !at.is_empty() {
                at.push_str(": ");
            }
            at.push_str(path);
        }
        at
    }
}

/// The problems found so far, each with where it is written.
struct Problems<'a> {
    index: &'a Index,
    found: Vec<ConfigError>,
}

impl Problems<'_> {
    fn at(&mut self, path: &str, problem: impl fmt::Display) {
        let at = self.index.at_path(path);
        let message = match at.is_empty() {
            true => problem.to_string(),
            false => format!("{at}: {problem}"),
        };
        self.found.push(ConfigError::new(message));
    }

    fn error_at(&mut self, path: &str, error: ConfigError) {
        for problem in error.problems() {
            self.at(path, problem);
        }
    }

    fn into_error(self) -> ConfigError {
        ConfigError::collect(self.found)
            .unwrap_or_else(|| ConfigError::new("the rules file has a problem"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(parse_rate("10/s"), Ok(Rate::per_second(10)));
        assert_eq!(parse_rate("100 / 1m"), Ok(Rate::per_minute(100)));
        assert_eq!(
            parse_rate("3/500ms"),
            Ok(Rate::new(3, Duration::from_millis(500)))
        );
        assert!(parse_rate("10").is_err());
        assert!(parse_rate("x/s").is_err());
    }

    #[test]
    fn lines_and_columns() {
        let index = Index::of("a = 1\n[t]\nb = \"x\"\n", "f.toml");
        assert_eq!(index.line_col(0), Some((1, 1)));
        assert_eq!(index.line_col(6), Some((2, 1)));
        assert_eq!(index.at_path("t.b"), "f.toml:3:1: t.b");
        assert_eq!(index.at_path("t.c"), "f.toml:2:1: t.c");
    }
}

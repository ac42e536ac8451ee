//! Rules from a file (feature `serde`): a layer's limits, routes, keys, plans, mode and
//! policies written in TOML (or any format serde reads).
//!
//! ```
//! # use tollgate::layer::rules_file::Loader;
//! # use tollgate::layer::RateLimitLayer;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = r#"
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
//! sliding_log = { limit = 1, window = "1m" }
//! key = { header = "user-id" }
//!
//! [[route]]
//! pattern = "/api/*"
//! [[route.limit]]             # plans: the rule is chosen by the request's plan
//! key = { header = "x-api-key" }
//! plan_of = { header = "x-plan" }
//! unknown_plan = { plan = "free" }    # or "reject", or "unlimited"
//! plans = [
//!   { plan = "free", name = "api-free", fixed_window = { limit = 100, window = "1h" } },
//!   { plan = "pro", name = "api-pro", gcra = { rate = "100/s", burst = 100 } },
//! ]
//! "#;
//! let layer = Loader::new().from_toml(rules, "rules.toml", RateLimitLayer::builder())?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! # Limits
//!
//! A limit has a `name` (its rule's), exactly one algorithm, a `key`, and optionally a
//! `penalty`, a default `cost`, a `min_cost`, `on_missing_key` (`"reject"` or `"skip"`) and
//! `shadow = true`. The algorithms, with what [`Rule`](crate::Rule)'s constructors of the same names take:
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
//! | `"peer_ip"`, `{ peer_ip = { ipv6_prefix = 48 } }` | [`key::peer_ip`](crate::key::peer_ip) |
//! | `{ client_ip = { trusted = ["10.0.0.0/8"], header = "x_forwarded_for", ipv6_prefix = 64 } }` | [`key::client_ip`](crate::key::client_ip) (`header`: `"x_forwarded_for"`, `"forwarded"`, `"x_real_ip"`; `allow_trusting_everyone = true` for [`ClientIp::allow_trusting_everyone`](crate::key::ClientIp::allow_trusting_everyone)) |
//! | `{ header = "user-id" }`, `{ header = { name = "user-id", duplicates = "last" } }` | [`key::header`](crate::key::header) |
//! | `"route"`, `"method"`, `"global"`, `{ constant = "abc" }` | [`key::route`](crate::key::route), [`key::method`](crate::key::method), [`key::global`](crate::key::global), [`key::constant`](crate::key::constant) |
//! | `{ or = [key, key, …] }` | the first that finds a key ([`KeyExtractor::or`]) |
//! | `{ all = [key, key] }` | both keys joined (two or three: a tuple) |
//! | `{ named = "api-key" }` | an extractor the code registered with [`Loader::key`] |
//!
//! # File and code together
//!
//! Closures cannot come from a file: the code registers them on the [`Loader`] by name and
//! the file names them. The file's limits are added to a builder the code gives, so hooks
//! (observers, exemptions) and limits that need code (a
//! [`Limit::cost`](crate::layer::Limit::cost) function) stay in the code, decided in the
//! same batch.
//!
//! # Errors
//!
//! Every problem is reported at once, in line order, each starting with `file:line:column:`
//! and the field's path (`route[0].limit[1].fixed_window`): TOML syntax, an unknown field
//! (with the known one it is a typo of) or a wrong type, a bad duration or rate, and
//! whatever [`build`](crate::layer::RateLimitLayerBuilder::build) refuses, located at the
//! limit or route it names. A [`ReloadHandle`](crate::layer::ReloadHandle) swaps in a new
//! file's rules, keeping the old ones if it has a problem (`examples/reload.rs`).

mod convert;
mod report;
mod salvage;
mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use report::Problems;
use schema::RulesFile;

use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::layer::{PlanOf, RateLimitLayer, RateLimitLayerBuilder};
use crate::store::Store;

/// Turns rules files into layers, with code's key extractors and plan lookups registered by
/// name. See the [module docs](self).
///
/// ```
/// use tollgate::key;
/// use tollgate::layer::{PlanOf, RateLimitLayer};
/// use tollgate::layer::rules_file::Loader;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let loader = Loader::new()
///     // A closure (here, the whole query string), for `key = { named = "api-key" }`.
///     .key("api-key", key::from_fn(|req| req.uri().query().map(str::to_owned)))
///     .plan_of("plan-of-key", PlanOf::from_fn(|_req| Some("free")));
/// let toml = r#"
///     [[limit]]
///     key = { named = "api-key" }
///     plan_of = { named = "plan-of-key" }
///     unknown_plan = "reject"
///     plans = [{ plan = "free", name = "api-free", fixed_window = { limit = 100, window = "1h" } }]
/// "#;
/// let layer = loader.from_toml(toml, "rules.toml", RateLimitLayer::builder())?;
///
/// // A problem names the file, the line and the field.
/// let toml = "[[limit]]\nname = \"x\"\nkey = \"global\"\nfixed_window = { limit = 0, window = \"1m\" }\n";
/// let err = loader.from_toml(toml, "rules.toml", RateLimitLayer::builder()).unwrap_err();
/// assert!(err.to_string().contains("rules.toml:2:1: limit[0].name: rule \"x\": fixed window limit must be at least 1"), "{err}");
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Loader {
    keys: BTreeMap<String, Arc<dyn KeyExtractor>>,
    plans: BTreeMap<String, PlanOf>,
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

    /// Reads the TOML file at `path` and builds a layer of its rules added to `builder`.
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
        let root = toml::de::DeTable::parse(text);
        let fields = root.as_ref().ok().map(|root| root.get_ref());
        let mut problems = Problems::of(text, origin, fields);
        match root {
            // serde would stop at the first field of the wrong type or unknown, hiding the
            // file's other problems: each entry is read on its own instead.
            Ok(root) => {
                let (file, unread) = salvage::salvage(root);
                unread.iter().for_each(|e| problems.toml(e));
                self.layer(&file, builder, problems)
            }
            Err(syntax) => {
                problems.toml(&syntax);
                Err(problems.into_error())
            }
        }
    }

    /// [`load`](Self::load) for rules in any format serde reads (JSON, YAML, …); a problem
    /// is located by its field's path, without a line.
    ///
    /// ```
    /// # use tollgate::layer::{rules_file::Loader, RateLimitLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let rules: serde_json::Value = serde_json::from_str(r#"{
    ///     "limit": [{ "name": "per-user", "fixed_window": { "limit": 100, "window": "1m" },
    ///                 "key": { "header": "user-id" } }]
    /// }"#)?;
    /// let layer = Loader::new().from_deserializer(rules, RateLimitLayer::builder())?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn from_deserializer<'de, St: Store, D: Deserializer<'de>>(
        &self,
        rules: D,
        builder: RateLimitLayerBuilder<St>,
    ) -> Result<RateLimitLayer<St>, ConfigError> {
        let file = RulesFile::deserialize(rules)
            .map_err(|e| ConfigError::new(format!("the rules do not read: {e}")))?;
        self.layer(&file, builder, Problems::default())
    }
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("plan_of", &self.plans.keys().collect::<Vec<_>>())
            .finish()
    }
}

//! The schema of a rules file: the types serde reads it into, field for field, and the
//! text forms of durations (`"90s"`), rates (`"10/s"`) and key extractors. Nothing here
//! builds the layer; [`convert`](super::convert) turns these into its pieces.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::report::did_you_mean;
use crate::key::{Duplicates, ForwardedHeader};
use crate::layer::{FailurePolicy, MissingKey};
use crate::rate::Rate;

/// The contents of a rules file (see the [module docs](super) for the fields).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RulesFile {
    pub(super) mode: Option<ModeSpec>,
    pub(super) max_wait: Option<Dur>,
    pub(super) on_failure: Option<FailureSpec>,
    pub(super) headers_on_allowed: Option<bool>,
    pub(super) legacy_headers: Option<bool>,
    pub(super) max_held: Option<usize>,
    pub(super) max_held_per_key: Option<usize>,
    pub(super) log_interval: Option<Dur>,
    #[serde(rename = "limit")]
    pub(super) limits: Vec<LimitSpec>,
    #[serde(rename = "route")]
    pub(super) routes: Vec<RouteSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum ModeSpec {
    Enforce,
    Shadow,
    Wait,
}

/// The crate's enums of plain variants, written by their names in snake case (`"fail_open"`).
macro_rules! by_name {
    ($($spec:ident => $target:ident { $($variant:ident),+ })+) => {$(
        #[derive(Debug, Clone, Copy, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub(super) enum $spec {
            $($variant),+
        }

        impl From<$spec> for $target {
            fn from(spec: $spec) -> Self {
                match spec {
                    $($spec::$variant => $target::$variant),+
                }
            }
        }
    )+};
}

by_name! {
    FailureSpec => FailurePolicy { FailOpen, FailClosed, Fallback }
    MissingSpec => MissingKey { Reject, Skip }
    ForwardedSpec => ForwardedHeader { XForwardedFor, Forwarded, XRealIp }
    DuplicatesSpec => Duplicates { Reject, First, Last }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteSpec {
    pub(super) pattern: String,
    #[serde(default, rename = "limit")]
    pub(super) limits: Vec<LimitSpec>,
    /// Its pattern did not read (see `salvage`): the route is left out of the layer.
    #[serde(skip)]
    pub(super) broken: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct LimitSpec {
    pub(super) name: Option<String>,
    pub(super) fixed_window: Option<WindowSpec>,
    pub(super) fixed_window_from_first_hit: Option<WindowSpec>,
    pub(super) sliding_log: Option<WindowSpec>,
    pub(super) sliding_window: Option<WindowSpec>,
    pub(super) token_bucket: Option<BucketSpec>,
    pub(super) token_bucket_stepped: Option<BucketSpec>,
    pub(super) leaky_bucket: Option<LeakySpec>,
    pub(super) gcra: Option<GcraSpec>,
    pub(super) penalty: Option<PenaltySpec>,
    pub(super) cost: Option<u64>,
    pub(super) min_cost: Option<u64>,
    pub(super) on_missing_key: Option<MissingSpec>,
    pub(super) shadow: bool,
    pub(super) key: Option<KeySpec>,
    /// In a plan's entry: the plan's name.
    pub(super) plan: Option<String>,
    /// Makes this limit a group of plans.
    pub(super) plan_of: Option<PlanOfSpec>,
    pub(super) unknown_plan: Option<UnknownPlanSpec>,
    #[serde(rename = "plans")]
    pub(super) plan_entries: Vec<LimitSpec>,
    /// It did not read (see `salvage`): the limit is left out of the layer.
    #[serde(skip)]
    pub(super) broken: bool,
    /// The keys it has that a limit does not, reported and left out (see `salvage`).
    #[serde(skip)]
    pub(super) unknown_keys: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WindowSpec {
    pub(super) limit: u64,
    pub(super) window: Dur,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BucketSpec {
    pub(super) capacity: u64,
    pub(super) refill: RateSpec,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LeakySpec {
    pub(super) capacity: u64,
    pub(super) drain: RateSpec,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GcraSpec {
    pub(super) rate: RateSpec,
    pub(super) burst: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PenaltySpec {
    pub(super) lock_for: Dur,
    pub(super) after: Option<u64>,
    pub(super) within: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum PlanOfSpec {
    Header(String),
    Named(String),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum UnknownPlanSpec {
    Reject,
    Unlimited,
    Plan(String),
}

/// A duration written `"90s"`, `"1h30m"`, `"250ms"`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dur(pub(super) Duration);

/// A rate written `"10/s"`, `"100/1m"`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RateSpec(pub(super) Rate);

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
    // The number 1 is optional: "10/s" is "10/1s".
    let period = match period.trim() {
        p if p.starts_with(|c: char| c.is_ascii_digit()) => p.to_owned(),
        p => format!("1{p}"),
    };
    Ok(Rate::new(amount, parse_duration(&period).map_err(bad)?))
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

/// A key extractor as written in a file: a name, or a table of one entry. The table forms
/// are derived (`remote = "Self"` makes that an inherent `KeySpec::deserialize`); the
/// names, with their own messages, are read by hand.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum KeySpec {
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerIpSpec {
    pub(super) ipv6_prefix: Option<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientIpSpec {
    pub(super) trusted: Vec<String>,
    pub(super) header: Option<ForwardedSpec>,
    pub(super) ipv6_prefix: Option<u8>,
    /// `ClientIp::allow_trusting_everyone`.
    #[serde(default)]
    pub(super) allow_trusting_everyone: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum HeaderSpec {
    Name(String),
    Table {
        name: String,
        duplicates: Option<DuplicatesSpec>,
    },
}

const KEY_NAMES: &[&str] = &["peer_ip", "route", "method", "global"];
const TABLE_KEY_NAMES: &[&str] = &["client_ip", "header", "constant", "named", "or", "all"];

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
                    name if TABLE_KEY_NAMES.contains(&name) => {
                        Err(E::custom(format_args!(
                            "the key extractor {name:?} needs parameters: write it as a table, {{ {name} = … }}"
                        )))
                    }
                    other => Err(E::custom(format_args!(
                        "unknown key extractor {other:?}{}: expected one of {KEY_NAMES:?}, a table (peer_ip, client_ip, header, constant, or, all), \
                         or {{ named = \"…\" }} for one the code registered",
                        did_you_mean(other, KEY_NAMES.iter().chain(TABLE_KEY_NAMES).copied())
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KeySpec, A::Error> {
                KeySpec::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules files write durations as unit-suffixed parts like `1h30m` and rates as
    /// `amount/duration`; a bare number, an unknown unit or an overflow is an error.
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
}

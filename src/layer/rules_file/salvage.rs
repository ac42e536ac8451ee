//! A TOML rules file whose fields do not all read: serde stops at the first field of the
//! wrong type, which would hide the file's other problems. Here each entry is read on its
//! own (the settings, each `[[limit]]`, each route's pattern and each of its limits), so the
//! entries that read still go through the layer's checks and every problem is reported at
//! once. A key the entry does not know is reported and left out, and the rest of the entry
//! read; an entry that does not read otherwise is marked broken and left out of the layer.

use serde::de::IntoDeserializer;
use serde::Deserialize;
use toml::de::{DeTable, DeValue, Error};
use toml::Spanned;

use super::schema::{LimitSpec, RouteSpec, RulesFile};

/// The file's entries that read, in their places, and the errors of those that do not.
pub(super) fn salvage(root: Spanned<DeTable<'_>>) -> (RulesFile, Vec<Error>) {
    let mut errors = Vec::new();
    let root = Spanned::new(root.span(), DeValue::Table(root.into_inner()));
    let (root, [limits, routes]) = without(root, ["limit", "route"]);
    let mut file = read::<RulesFile>(root, &mut errors).0.unwrap_or_default();
    file.limits = entries(limits, &mut errors, limit);
    file.routes = entries(routes, &mut errors, route);
    (file, errors)
}

/// `value` without the entries `keys` of a table, and those entries, read on their own.
fn without<'de, const N: usize>(
    mut value: Spanned<DeValue<'de>>,
    keys: [&str; N],
) -> (Spanned<DeValue<'de>>, [Option<Spanned<DeValue<'de>>>; N]) {
    let removed = keys.map(|key| match value.get_mut() {
        DeValue::Table(table) => table.remove(key),
        _ => None,
    });
    (value, removed)
}

/// Reads `value` as a `T`, or adds why not to `errors`. Each key of a table that `T` does
/// not know is reported and left out (and returned), so that a typo in one key leaves the
/// others checked.
fn read<'de, T: Deserialize<'de>>(
    mut value: Spanned<DeValue<'de>>,
    errors: &mut Vec<Error>,
) -> (Option<T>, Vec<String>) {
    let mut unknown_keys = Vec::new();
    loop {
        let error = match T::deserialize(value.clone().into_deserializer()) {
            Ok(read) => return (Some(read), unknown_keys),
            Err(error) => error,
        };
        // serde places an unknown field at its key, and any other problem at a value or
        // at the whole table. Each round leaves out a key or stops.
        let unknown = match (value.get_mut(), error.span()) {
            (DeValue::Table(table), Some(at)) => {
                let key = table
                    .keys()
                    .find(|key| key.span().start == at.start)
                    .cloned();
                key.and_then(|key| table.remove_entry(&key))
                    .map(|(key, _)| key)
            }
            _ => None,
        };
        errors.push(error);
        let Some(unknown) = unknown else {
            return (None, unknown_keys);
        };
        unknown_keys.push(unknown.into_inner().into_owned());
    }
}

/// Each item of the array `value`, read by `one` in its place (so paths like `limit[2]`
/// still name it).
fn entries<'de, T: Deserialize<'de>>(
    value: Option<Spanned<DeValue<'de>>>,
    errors: &mut Vec<Error>,
    one: fn(Spanned<DeValue<'de>>, &mut Vec<Error>) -> T,
) -> Vec<T> {
    match value.map(|value| (value.span(), value.into_inner())) {
        None => Vec::new(),
        Some((_, DeValue::Array(items))) => {
            items.into_iter().map(|item| one(item, errors)).collect()
        }
        // Not an array: its error, from reading it as one.
        Some((span, other)) => read(Spanned::new(span, other), errors)
            .0
            .unwrap_or_default(),
    }
}

fn limit<'de>(item: Spanned<DeValue<'de>>, errors: &mut Vec<Error>) -> LimitSpec {
    let (limit, unknown_keys) = read(item, errors);
    LimitSpec {
        broken: limit.is_none(),
        unknown_keys,
        ..limit.unwrap_or_default()
    }
}

/// A route: its pattern, and each of its limits on its own.
fn route<'de>(item: Spanned<DeValue<'de>>, errors: &mut Vec<Error>) -> RouteSpec {
    let (item, [limits]) = without(item, ["limit"]);
    let (route, _) = read::<RouteSpec>(item, errors);
    RouteSpec {
        broken: route.is_none(),
        limits: entries(limits, errors, limit),
        ..route.unwrap_or_default()
    }
}

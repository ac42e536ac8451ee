//! A TOML rules file whose fields do not all read: serde stops at the first field of the
//! wrong type, which would hide the file's other problems. Here each entry is read on its
//! own (the settings, each `[[limit]]`, each route's pattern and each of its limits), so the
//! entries that read still go through the layer's checks and every problem is reported at
//! once. A key the entry does not know is reported and left out, and the rest of the entry
//! read; an entry that does not read otherwise is marked broken and left out of the layer.

use std::ops::Range;

use serde::de::IntoDeserializer;
use serde::Deserialize;
use toml::de::{DeTable, DeValue, Error};
use toml::Spanned;

use super::schema::{LimitSpec, RouteSpec, RulesFile};

/// The file's entries that read, in their places, and the errors of those that do not.
pub(super) fn salvage(root: Spanned<DeTable<'_>>) -> (RulesFile, Vec<Error>) {
    let span = root.span();
    let mut table = root.into_inner();
    let mut errors = Vec::new();
    let limits = table.remove("limit");
    let routes = table.remove("route");
    let mut file = read_table::<RulesFile>(span, table, &mut errors)
        .0
        .unwrap_or_default();
    file.limits = entries(limits, &mut errors, limit);
    file.routes = entries(routes, &mut errors, route);
    (file, errors)
}

/// Reads `value` as a `T`, or adds why not to `errors`.
fn read<'de, T: Deserialize<'de>>(
    value: Spanned<DeValue<'de>>,
    errors: &mut Vec<Error>,
) -> Option<T> {
    T::deserialize(value.into_deserializer())
        .map_err(|e| errors.push(e))
        .ok()
}

/// Reads `table` as a `T`, or adds why not to `errors`; each key `T` does not know is
/// reported and left out (and returned), so that a typo in one key leaves the others
/// checked.
fn read_table<'de, T: Deserialize<'de>>(
    span: Range<usize>,
    mut table: DeTable<'de>,
    errors: &mut Vec<Error>,
) -> (Option<T>, Vec<String>) {
    let mut unknown_keys = Vec::new();
    // Each round leaves out a key or stops: at most one round per key, and one more.
    for _ in 0..=table.len() {
        let value = Spanned::new(span.clone(), DeValue::Table(table.clone()));
        let error = match T::deserialize(value.into_deserializer()) {
            Ok(read) => return (Some(read), unknown_keys),
            Err(error) => error,
        };
        // serde places an unknown field at its key, and any other problem at a value or
        // at the whole table.
        let unknown = error.span().and_then(|at| {
            table
                .keys()
                .find(|key| key.span().start == at.start)
                .cloned()
        });
        errors.push(error);
        let Some(unknown) = unknown else { break };
        table.remove(&unknown);
        unknown_keys.push(unknown.into_inner().into_owned());
    }
    (None, unknown_keys)
}

/// Each item of the array `value`, read by `one` in its place (so paths like `limit[2]`
/// still name it).
fn entries<'de, T: Deserialize<'de>>(
    value: Option<Spanned<DeValue<'de>>>,
    errors: &mut Vec<Error>,
    one: fn(Spanned<DeValue<'de>>, &mut Vec<Error>) -> T,
) -> Vec<T> {
    let Some(value) = value else {
        return Vec::new();
    };
    let span = value.span();
    match value.into_inner() {
        DeValue::Array(items) => items.into_iter().map(|item| one(item, errors)).collect(),
        // Not an array: its error, from reading it as one.
        other => read(Spanned::new(span, other), errors).unwrap_or_default(),
    }
}

fn limit<'de>(item: Spanned<DeValue<'de>>, errors: &mut Vec<Error>) -> LimitSpec {
    let span = item.span();
    match item.into_inner() {
        DeValue::Table(table) => match read_table(span, table, errors) {
            (Some(limit), unknown_keys) => LimitSpec {
                unknown_keys,
                ..limit
            },
            (None, _) => LimitSpec::broken(),
        },
        // Not a table: its error, from reading it as a limit.
        other => read(Spanned::new(span, other), errors).unwrap_or_else(LimitSpec::broken),
    }
}

/// A route: its pattern, and each of its limits on its own.
fn route<'de>(item: Spanned<DeValue<'de>>, errors: &mut Vec<Error>) -> RouteSpec {
    let span = item.span();
    let mut table = match item.into_inner() {
        DeValue::Table(table) => table,
        // Not a table: its error, from reading it as a route.
        other => return read(Spanned::new(span, other), errors).unwrap_or_else(RouteSpec::broken),
    };
    let limits = table.remove("limit");
    let mut route = read_table(span, table, errors)
        .0
        .unwrap_or_else(RouteSpec::broken);
    route.limits = entries(limits, errors, limit);
    route
}

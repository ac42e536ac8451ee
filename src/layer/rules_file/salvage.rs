//! A TOML rules file whose fields do not all read: serde stops at the first field of the
//! wrong type, which would hide the file's other problems. Here each entry is read on its
//! own (the settings, each `[[limit]]`, each route's pattern and each of its limits), so the
//! entries that read still go through the layer's checks and every problem is reported at
//! once. An entry that does not read is marked broken and left out of the layer.

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
    let settings = Spanned::new(span, DeValue::Table(table));
    let mut file = read::<RulesFile>(settings, &mut errors).unwrap_or_default();
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
    read(item, errors).unwrap_or_else(LimitSpec::broken)
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
    let head = Spanned::new(span, DeValue::Table(table));
    let mut route = read(head, errors).unwrap_or_else(RouteSpec::broken);
    route.limits = entries(limits, errors, limit);
    route
}

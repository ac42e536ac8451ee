//! Where a problem is written: the line and column of each field of a TOML text, and the
//! problems found so far, each prefixed with `file:line:column: field.path`.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::error::ConfigError;
use crate::layer::routes::nearest;

/// The problems found so far, each with where it is written.
#[derive(Debug, Default)]
pub(super) struct Problems {
    /// Names the text in messages (a file name).
    origin: String,
    /// Line starts, in bytes.
    lines: Vec<usize>,
    /// Each field's path (`route[0].limit[1].name`) and its span, from its key on.
    fields: HashMap<String, Range<usize>>,
    /// Each problem's line and column when known, and its message.
    found: Vec<(Option<(usize, usize)>, String)>,
    /// Where each rule name and route pattern is written: (how the layer's messages name
    /// it, the path of the field that writes it).
    names: Vec<(String, String)>,
}

impl Problems {
    /// None yet, in `text` named `origin`, whose fields are `root`'s (none when it does
    /// not parse).
    pub(super) fn of(text: &str, origin: &str, root: Option<&DeTable<'_>>) -> Self {
        let mut problems = Problems {
            origin: origin.into(),
            lines: std::iter::once(0)
                .chain(text.match_indices('\n').map(|(i, _)| i + 1))
                .collect(),
            ..Self::default()
        };
        if let Some(root) = root {
            problems.walk_table(root, "");
        }
        problems
    }

    fn walk_table(&mut self, table: &DeTable<'_>, path: &str) {
        for (key, value) in table.iter() {
            let path = match path {
                "" => key.get_ref().to_string(),
                _ => format!("{path}.{}", key.get_ref()),
            };
            let span = key.span().start.min(value.span().start)..value.span().end;
            self.walk_value(value, &path, span);
        }
    }

    fn walk_value(&mut self, value: &Spanned<DeValue<'_>>, path: &str, span: Range<usize>) {
        self.fields.insert(path.to_owned(), span);
        match value.get_ref() {
            DeValue::Table(table) => self.walk_table(table, path),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.walk_value(item, &format!("{path}[{i}]"), item.span());
                }
            }
            _ => {}
        }
    }

    /// `:line:column` of a byte offset, 1-based.
    fn line_col(&self, offset: usize) -> Option<(usize, usize)> {
        let line = self.lines.partition_point(|&start| start <= offset);
        let start = self.lines.get(line.checked_sub(1)?)?;
        Some((line, offset - start + 1))
    }

    /// The line and column of a field, or of the nearest enclosing one written.
    fn at_path(&self, path: &str) -> Option<(usize, usize)> {
        let mut probe = path;
        loop {
            if let Some(span) = self.fields.get(probe) {
                return self.line_col(span.start);
            }
            let cut = probe.rfind(['.', '['])?;
            probe = &probe[..cut];
        }
    }

    /// Adds `origin:line:column: path: problem`, leaving out what is unknown.
    fn push(&mut self, at: Option<(usize, usize)>, path: &str, problem: impl fmt::Display) {
        let place = match at {
            Some((line, col)) => format!("{}:{line}:{col}", self.origin),
            None => self.origin.clone(),
        };
        let parts = [place, path.into(), problem.to_string()];
        let parts: Vec<String> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        self.found.push((at, parts.join(": ")));
    }

    /// How many were found.
    pub(super) fn len(&self) -> usize {
        self.found.len()
    }

    /// Reports `problem` at the field `path` (or the nearest enclosing one written).
    pub(super) fn at(&mut self, path: &str, problem: impl fmt::Display) {
        self.push(self.at_path(path), path, problem);
    }

    /// Reports each of `error`'s problems at the field `path`.
    pub(super) fn error_at(&mut self, path: &str, error: ConfigError) {
        for problem in error.problems() {
            self.at(path, problem);
        }
    }

    /// Reports a problem `toml` found, at its span and the innermost field that holds it,
    /// naming the name a typo stands for.
    pub(super) fn toml(&mut self, error: &toml::de::Error) {
        let problem = with_nearest_name(error.message().trim());
        let Some(span) = error.span() else {
            return self.push(None, "", problem);
        };
        let field = self
            .fields
            .iter()
            .filter(|(_, s)| s.start <= span.start && span.end <= s.end.max(s.start + 1))
            .min_by_key(|(_, s)| s.end - s.start)
            .map_or(String::new(), |(path, _)| path.clone());
        self.push(self.line_col(span.start), &field, problem);
    }

    /// Notes that the layer's messages call what is written at `path` `name` (`rule "x"`).
    pub(super) fn name(&mut self, name: String, path: String) {
        self.names.push((name, path));
    }

    /// All the problems found and the layer's own, each located where the rule or route it
    /// names is written: the layer knows the rule, the file knows its line.
    pub(super) fn located(mut self, error: &ConfigError) -> ConfigError {
        for problem in error.problems() {
            let place = (self.names.iter())
                .filter(|(name, _)| problem.contains(name.as_str()))
                .min_by_key(|(name, _)| problem.find(name.as_str()));
            let path = place.map_or(String::new(), |(_, path)| path.clone());
            self.at(&path, problem);
        }
        self.into_error()
    }

    /// All the problems found, as one error, in the order they are written (those of no
    /// line last).
    pub(super) fn into_error(mut self) -> ConfigError {
        self.found
            .sort_by_key(|(at, _)| at.unwrap_or((usize::MAX, 0)));
        let found = self
            .found
            .into_iter()
            .map(|(_, message)| ConfigError::new(message));
        ConfigError::collect(found)
            .unwrap_or_else(|| ConfigError::new("the rules file has a problem"))
    }
}

/// The name among `known` that the unknown `name` is most likely a typo of.
pub(super) fn typo_of<'k>(name: &str, known: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    // Short names have few letters to spare: one edit, two from eight letters on.
    nearest(name, known, (name.chars().count() / 8 + 1).min(2))
}

/// ` (did you mean "known"?)` for the name among `known` that `name` is a typo of, if any.
pub(super) fn did_you_mean<'k>(name: &str, known: impl IntoIterator<Item = &'k str>) -> String {
    typo_of(name, known)
        .map(|known| format!(" (did you mean {known:?}?)"))
        .unwrap_or_default()
}

/// serde's message for a name it does not know (`unknown field `x`, expected one of `a`,
/// `b``), with the name it most likely stands for in place of the list when one is near.
fn with_nearest_name(message: &str) -> String {
    let suggested = ["unknown field `", "unknown variant `"]
        .iter()
        .find_map(|prefix| {
            let rest = message.strip_prefix(prefix)?;
            let (name, expected) = rest.split_once("`, expected ")?;
            let known = expected.split('`').skip(1).step_by(2);
            let nearest = typo_of(name, known)?;
            Some(format!("{prefix}{name}`: did you mean `{nearest}`?"))
        });
    suggested.unwrap_or_else(|| message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules-file problems are placed at the 1-based line and column of the key, or of its
    /// table when the key is absent.
    #[test]
    fn lines_and_columns() {
        let text = "a = 1\n[t]\nb = \"x\"\n";
        let root = toml::de::DeTable::parse(text).unwrap();
        let mut problems = Problems::of(text, "f.toml", Some(root.get_ref()));
        assert_eq!(problems.line_col(0), Some((1, 1)));
        assert_eq!(problems.line_col(6), Some((2, 1)));
        assert_eq!(problems.at_path("t.b"), Some((3, 1)));
        assert_eq!(problems.at_path("t.c"), Some((2, 1)));
        problems.at("t.c", "x");
        assert_eq!(problems.found[0].1, "f.toml:2:1: t.c: x");
    }

    /// An unknown field or value close to a known one names it instead of listing them all;
    /// one far from every known name keeps serde's list.
    #[test]
    fn a_typo_names_the_nearest_name() {
        let field = "unknown field `token_bukcet`, expected one of `name`, `token_bucket`, `gcra`";
        assert_eq!(
            with_nearest_name(field),
            "unknown field `token_bukcet`: did you mean `token_bucket`?"
        );
        let variant = "unknown variant `enforc`, expected one of `enforce`, `shadow`, `wait`";
        assert_eq!(
            with_nearest_name(variant),
            "unknown variant `enforc`: did you mean `enforce`?"
        );
        let two = "unknown field `windw`, expected `limit` or `window`";
        assert_eq!(
            with_nearest_name(two),
            "unknown field `windw`: did you mean `window`?"
        );
        let far = "unknown field `colour`, expected `limit` or `window`";
        assert_eq!(with_nearest_name(far), far);
    }
}

//! Where a problem is written: the line and column of each field of a TOML text, and the
//! problems found so far, each prefixed with `file:line:column: field.path`.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use crate::error::ConfigError;
use crate::layer::routes::nearest;

/// A problem without `ConfigError`'s "invalid rate limit configuration" preamble.
pub(super) fn problem_text(e: &ConfigError) -> String {
    e.problems().collect::<Vec<_>>().join("; ")
}

/// Where each field of a TOML text is written.
#[derive(Debug, Default)]
pub(super) struct Index {
    origin: String,
    /// Line starts, in bytes.
    lines: Vec<usize>,
    /// Each field's path (`route[0].limit[1].name`) and its span, from its key on.
    fields: HashMap<String, Range<usize>>,
}

impl Index {
    /// The fields of `text`, named `origin` in messages.
    pub(super) fn of(text: &str, origin: &str) -> Self {
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

    /// Where the error's span is: its line and column, and the innermost field that holds
    /// it.
    fn at_span(&self, span: &Range<usize>) -> (Option<(usize, usize)>, Option<&str>) {
        let field = self
            .fields
            .iter()
            .filter(|(_, s)| s.start <= span.start && span.end <= s.end.max(s.start + 1))
            .min_by_key(|(_, s)| s.end - s.start)
            .map(|(path, _)| path.as_str());
        (self.line_col(span.start), field)
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

    /// `origin:line:column: path: problem`, leaving out what is unknown.
    fn message(
        &self,
        at: Option<(usize, usize)>,
        path: Option<&str>,
        problem: impl fmt::Display,
    ) -> String {
        let mut message = self.origin.clone();
        if let Some((line, col)) = at {
            message.push_str(&format!(":{line}:{col}"));
        }
        let problem = problem.to_string();
        let path = path.filter(|p| !p.is_empty());
        for part in path.into_iter().chain([problem.as_str()]) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(part);
        }
        message
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

/// The problems found so far, each with where it is written.
pub(super) struct Problems<'a> {
    index: &'a Index,
    /// Each problem's line and column when known, and its message.
    found: Vec<(Option<(usize, usize)>, String)>,
}

impl<'a> Problems<'a> {
    /// None yet, to be located in `index`.
    pub(super) fn new(index: &'a Index) -> Self {
        Self {
            index,
            found: Vec::new(),
        }
    }

    /// How many were found.
    pub(super) fn len(&self) -> usize {
        self.found.len()
    }

    /// Whether none was found.
    pub(super) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Reports `problem` at the field `path` (or the nearest enclosing one written).
    pub(super) fn at(&mut self, path: &str, problem: impl fmt::Display) {
        let at = self.index.at_path(path);
        let message = self.index.message(at, Some(path), problem);
        self.found.push((at, message));
    }

    /// Reports each of `error`'s problems at the field `path`.
    pub(super) fn error_at(&mut self, path: &str, error: ConfigError) {
        for problem in error.problems() {
            self.at(path, problem);
        }
    }

    /// Reports a problem `toml` found, at its span, naming the name a typo stands for.
    pub(super) fn toml(&mut self, error: &toml::de::Error) {
        let (at, path) = match error.span() {
            Some(span) => self.index.at_span(&span),
            None => (None, None),
        };
        let problem = with_nearest_name(error.message().trim());
        let message = self.index.message(at, path, problem);
        self.found.push((at, message));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules-file problems are placed at the 1-based line and column of the key, or of its
    /// table when the key is absent.
    #[test]
    fn lines_and_columns() {
        let index = Index::of("a = 1\n[t]\nb = \"x\"\n", "f.toml");
        assert_eq!(index.line_col(0), Some((1, 1)));
        assert_eq!(index.line_col(6), Some((2, 1)));
        assert_eq!(index.at_path("t.b"), Some((3, 1)));
        assert_eq!(index.at_path("t.c"), Some((2, 1)));
        assert_eq!(
            index.message(Some((2, 1)), Some("t.c"), "x"),
            "f.toml:2:1: t.c: x"
        );
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

//! Where a problem is written: the line and column of each field of a TOML text, and the
//! problems found so far, each prefixed with `file:line:column: field.path`.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use crate::error::ConfigError;

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

    /// `:line:column: path` for an error's span: the innermost field that holds it.
    pub(super) fn at_span(&self, span: &Range<usize>) -> String {
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
pub(super) struct Problems<'a> {
    index: &'a Index,
    found: Vec<ConfigError>,
}

impl<'a> Problems<'a> {
    /// None yet, to be located in `index`.
    pub(super) fn new(index: &'a Index) -> Self {
        Self {
            index,
            found: Vec::new(),
        }
    }

    /// Whether none was found.
    pub(super) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// Reports `problem` at the field `path` (or the nearest enclosing one written).
    pub(super) fn at(&mut self, path: &str, problem: impl fmt::Display) {
        let at = self.index.at_path(path);
        let message = match at.is_empty() {
            true => problem.to_string(),
            false => format!("{at}: {problem}"),
        };
        self.found.push(ConfigError::new(message));
    }

    /// Reports each of `error`'s problems at the field `path`.
    pub(super) fn error_at(&mut self, path: &str, error: ConfigError) {
        for problem in error.problems() {
            self.at(path, problem);
        }
    }

    /// All the problems found, as one error.
    pub(super) fn into_error(self) -> ConfigError {
        ConfigError::collect(self.found)
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
        assert_eq!(index.at_path("t.b"), "f.toml:3:1: t.b");
        assert_eq!(index.at_path("t.c"), "f.toml:2:1: t.c");
    }
}

//! Route patterns of the layer's route table: `"POST /sms/send"`, `"GET /files/{id}"`,
//! `"/pkg.Service/Method"`, `"/api/*"`.

use std::fmt;

use http::Method;

use crate::error::ConfigError;
use crate::key::KNOWN_METHODS;

/// A parsed route pattern; its syntax, its matching and the patterns refused:
/// [`RateLimitLayerBuilder::route`](super::RateLimitLayerBuilder::route).
#[derive(Clone)]
pub(crate) struct RoutePattern {
    text: Box<str>,
    method: Option<Method>,
    segments: Box<[Segment]>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(Box<str>),
    Param,
}

impl RoutePattern {
    pub(crate) fn parse(pattern: &str) -> Result<Self, ConfigError> {
        let text = pattern.trim();
        let invalid = |why: &str| ConfigError::new(format!("route {text:?}: {why}"));
        let (method, path) = match text.split_once(' ') {
            Some((m, p)) => (
                Some(parse_method(m).map_err(|why| invalid(&why))?),
                p.trim(),
            ),
            None => (None, text),
        };
        let path = path
            .strip_prefix('/')
            .ok_or_else(|| invalid("the path must start with '/'"))?;
        if let Some(c) = path.chars().find(|c| matches!(c, '?' | '#')) {
            return Err(invalid(&format!(
                "{c:?} never reaches the path a request is matched on; match the path alone"
            )));
        }
        if path.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(invalid(
                "spaces, control and non-ASCII characters reach a server percent-encoded; write them so",
            ));
        }
        if let Some(fix) = axum_07_syntax(path) {
            return Err(invalid(&fix));
        }
        let mut segments = Vec::new();
        let mut rest = false;
        let mut parts = path.split('/').filter(|p| !p.is_empty()).peekable();
        while let Some(part) = parts.next() {
            let is_rest = part == "*" || (part.starts_with("{*") && part.ends_with('}'));
            if part == "." || part == ".." {
                return Err(invalid(
                    "clients resolve '.' and '..' segments before sending",
                ));
            }
            if is_rest {
                if parts.peek().is_some() {
                    return Err(invalid("a wildcard may only end the path"));
                }
                rest = true;
            } else if part.len() >= 3 && part.starts_with('{') && part.ends_with('}') {
                segments.push(Segment::Param);
            } else if part.contains(['{', '}', '*']) {
                return Err(invalid(
                    "segments are literals, {name}, or a final * / {*name}",
                ));
            } else {
                segments.push(Segment::Literal(part.into()));
            }
        }
        Ok(Self {
            text: text.into(),
            method,
            segments: segments.into(),
            rest,
        })
    }

    /// The pattern as written (the key of [`crate::key::route`]).
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// How specific the pattern is, segment by segment, as axum's router (matchit) ranks
    /// routes: of two patterns matching one path, the lower is the route taken.
    pub(crate) fn ranks(&self) -> impl Iterator<Item = u8> + '_ {
        let segments = self.segments.iter().map(|s| match s {
            Segment::Literal(_) => 0,
            Segment::Param => 1,
        });
        segments.chain(self.rest.then_some(2))
    }

    /// Whether `self`, declared first, takes every request `later` matches (same rank), so
    /// `later` can never apply.
    pub(crate) fn covers(&self, later: &RoutePattern) -> bool {
        if !self.ranks().eq(later.ranks()) {
            return false;
        }
        let methods = match (&self.method, &later.method) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => a == b || (*a == Method::GET && *b == Method::HEAD),
        };
        if !methods || self.segments.len() > later.segments.len() {
            return false;
        }
        let segments = self
            .segments
            .iter()
            .zip(later.segments.iter())
            .all(|(a, b)| matches!(a, Segment::Param) || a == b);
        // Beyond our segments `later` may see more (its own or its wildcard's): only our
        // wildcard takes them.
        let longer = later.segments.len() > self.segments.len() || later.rest;
        segments && (self.rest || !longer)
    }

    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        // HEAD is a GET without the body, and routers (axum among them) serve it as one.
        let same_method = |m: &Method| m == method || (*m == Method::GET && method == Method::HEAD);
        if self.method.as_ref().is_some_and(|m| !same_method(m)) {
            return false;
        }
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        // Empty segments are skipped, as many routers do: `/sms/send/` and `//sms/send`
        // must not escape the limits of `/sms/send`.
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let segments = self
            .segments
            .iter()
            .all(|segment| match (segment, parts.next()) {
                (Segment::Literal(l), part) => part == Some(&**l),
                (Segment::Param, part) => part.is_some(),
            });
        segments && (self.rest || parts.next().is_none())
    }
}

/// The method a pattern names, or why it is refused (with the method it most likely
/// stands for).
fn parse_method(method: &str) -> Result<Method, String> {
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        let upper = method.to_ascii_uppercase();
        return Err(format!(
            "methods are case-sensitive and {method:?} is not one clients send; write {upper:?}"
        ));
    }
    let parsed = Method::from_bytes(method.as_bytes())
        .map_err(|_| "the method is not a valid HTTP method".to_owned())?;
    if KNOWN_METHODS.contains(&parsed.as_str()) {
        return Ok(parsed);
    }
    let fix = match nearest(method, KNOWN_METHODS.iter().copied(), 2) {
        Some(known) => format!("write {known:?}"),
        None => "name a registered method (GET, POST, PUT, PATCH, DELETE, …)".to_owned(),
    };
    Err(format!(
        "{method:?} is not an HTTP method clients send, so the route would never be limited: {fix}, or leave the method out to limit the path for every method"
    ))
}

/// The first nearest of `known` to `name`, at most `within` single-character edits away.
pub(super) fn nearest<'k>(
    name: &str,
    known: impl IntoIterator<Item = &'k str>,
    within: usize,
) -> Option<&'k str> {
    known
        .into_iter()
        .map(|known| (edit_distance(name, known), known))
        .filter(|(distance, _)| *distance <= within)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// The edit distance from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// For a path written in axum 0.7's syntax (`:id`, `*rest`), which axum 0.8 and this table
/// read as literal text that no request has, why it is refused and the path to write.
fn axum_07_syntax(path: &str) -> Option<String> {
    let segments = path.split('/');
    let old = |s: &str| s.len() > 1 && (s.starts_with(':') || s.starts_with('*'));
    if !segments.clone().any(old) {
        return None;
    }
    let fixed: Vec<String> = segments
        .map(|s| match (s.strip_prefix(':'), s.strip_prefix('*')) {
            (Some(name), _) if !name.is_empty() => format!("{{{name}}}"),
            (_, Some(name)) if !name.is_empty() => format!("{{*{name}}}"),
            _ => s.to_owned(),
        })
        .collect();
    Some(format!(
        "`:name` and `*name` are axum 0.7's syntax, which axum 0.8 reads as literal text no request has: write \"/{}\"",
        fixed.join("/")
    ))
}

impl fmt::Debug for RoutePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, method: Method, path: &str) -> bool {
        RoutePattern::parse(p).unwrap().matches(&method, path)
    }

    /// A route pattern matches its method (GET also HEAD) and whole path segments, and a
    /// trailing or doubled slash does not escape it.
    #[test]
    fn patterns() {
        assert!(m("POST /sms/send", Method::POST, "/sms/send"));
        assert!(!m("POST /sms/send", Method::GET, "/sms/send"));
        assert!(m("GET /files/{id}", Method::HEAD, "/files/1"));
        assert!(!m("HEAD /files/{id}", Method::GET, "/files/1"));
        assert!(!m("POST /sms/send", Method::POST, "/sms/send/x"));
        assert!(!m("POST /sms/send", Method::POST, "/sms"));
        assert!(m("GET /files/{id}", Method::GET, "/files/42"));
        assert!(!m("GET /files/{id}", Method::GET, "/files/"));
        assert!(!m("GET /files/{id}", Method::GET, "/files/42/x"));
        assert!(m("/pkg.Svc/Method", Method::POST, "/pkg.Svc/Method"));
        assert!(m("/pkg.Svc/*", Method::POST, "/pkg.Svc/Other"));
        assert!(m("/api/{*rest}", Method::GET, "/api"));
        assert!(m("/api/{*rest}", Method::GET, "/api/a/b/c"));
        assert!(!m("/api/*", Method::GET, "/apix"));
        assert!(m("/", Method::GET, "/"));
        assert!(m("/*", Method::GET, "/anything/at/all"));
        assert!(!m("/x", Method::GET, "x"));
        // A trailing or doubled slash does not escape a route's limits.
        assert!(m("POST /sms/send", Method::POST, "/sms/send/"));
        assert!(m("POST /sms/send", Method::POST, "//sms//send"));
        assert!(m("GET /files/{id}", Method::GET, "/files/42/"));
        assert!(!m("/", Method::GET, "/x"));
    }

    /// A malformed route pattern is an error; an upper-case extension method is a valid
    /// method.
    #[test]
    fn invalid_patterns_are_errors() {
        assert!(RoutePattern::parse("sms/send").is_err());
        assert!(RoutePattern::parse("P@ST /x").is_err());
        assert!(RoutePattern::parse("/a/*/b").is_err());
        assert!(RoutePattern::parse("/a{b}").is_err());
        assert!(RoutePattern::parse("post /x").is_err());
        assert!(RoutePattern::parse("/x?y").is_err());
        assert!(RoutePattern::parse("/x/..").is_err());
        // Extension methods in upper case are methods clients send.
        assert!(RoutePattern::parse("PURGE /cache").is_ok());
        assert!(RoutePattern::parse("PROPFIND /dav/{*path}").is_ok());
    }

    /// A method no client sends and axum 0.7's path syntax are refused with the fix.
    #[test]
    fn typos_and_old_syntax_are_refused_with_the_fix() {
        let error = |p: &str| RoutePattern::parse(p).unwrap_err().to_string();
        assert!(error("POTS /sms/send").contains("write \"POST\""));
        assert!(error("FROBNICATE /x").contains("leave the method out"));
        assert!(error("/files/:id").contains("write \"/files/{id}\""));
        assert!(error("/*rest").contains("write \"/{*rest}\""));
        assert!(error("GET /a/:b/*c").contains("write \"/a/{b}/{*c}\""));
        assert_eq!(edit_distance("POTS", "POST"), 2);
        assert_eq!(edit_distance("", "GET"), 3);
    }

    /// One route pattern covers another only when the other can never apply after it: the
    /// same path shape under any names, and a method set no wider.
    #[test]
    fn coverage() {
        let covers = |a: &str, b: &str| {
            RoutePattern::parse(a)
                .unwrap()
                .covers(&RoutePattern::parse(b).unwrap())
        };
        assert!(covers("/x", "/x"));
        assert!(covers("/x", "GET /x"));
        assert!(!covers("GET /x", "/x"));
        assert!(covers("GET /x", "HEAD /x"));
        assert!(!covers("HEAD /x", "GET /x"));
        // A more specific pattern declared later is the router's choice where it matches.
        assert!(!covers("/{a}/{b}", "/x/y"));
        assert!(!covers("/x/y", "/{a}/{b}"));
        assert!(!covers("/*", "/"));
        assert!(!covers("/a/*", "/a/{b}/*"));
        // The same shape under other names never applies after the first.
        assert!(covers("/{a}", "/{b}"));
        assert!(covers("/a/*", "/a/{*rest}"));
        assert!(!covers("/a/{b}", "/a/*"));
        assert!(!covers("/a/{b}", "/a"));
        assert!(!covers("/a/b/*", "/a/*"));
        assert!(!covers("/a", "/a/b"));
    }
}

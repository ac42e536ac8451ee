//! Who may use the admin router: the optional bearer token (compared in constant time),
//! the session cookie its login form sets, the anti-forgery token of the page's forms, and
//! the limit on failed attempts, enforced by tollgate itself.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::ConnectInfo;
use hmac::{Hmac, Mac};
use http::{header, HeaderMap, Request};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::text::{hex, unhex};
use tollgate::{store::MemoryStore, Check, Limiter, Rule};

/// The session cookie the login form sets.
pub(crate) const SESSION_COOKIE: &str = "tollgate_admin_session";
/// The cookie the page's anti-forgery tokens are derived from.
pub(crate) const CSRF_COOKIE: &str = "tollgate_admin_csrf";
/// The cookie of a browser that signed in here before: its attempts count apart from its
/// address's, so that others sharing the address cannot make it wait.
pub(crate) const DEVICE_COOKIE: &str = "tollgate_admin_device";
/// How long a browser is known by its [`DEVICE_COOKIE`].
pub(crate) const DEVICE: Duration = Duration::from_secs(30 * 86_400);
/// How long a session lasts.
pub(crate) const SESSION: Duration = Duration::from_secs(8 * 3600);
/// The shortest bearer token accepted: 32 bytes, as `openssl rand -hex 16` writes.
pub(crate) const MIN_TOKEN_LEN: usize = 32;

/// The least a token's [estimated entropy](estimated_bits) may be, in bits: a random one of
/// 32 hexadecimal digits falls below it about once in a million draws.
const MIN_TOKEN_BITS: f64 = 80.0;

/// Why `token` could be guessed, if it could: too short, holding anything but visible
/// ASCII (an `Authorization` header carries nothing else, and a space is easy to type
/// twice), repeating a shorter part, or too regular to be random.
pub(crate) fn guessable(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    if bytes.len() < MIN_TOKEN_LEN {
        return Some(format!(
            "of {} bytes is too short to be secret",
            bytes.len()
        ));
    }
    if !bytes.iter().all(u8::is_ascii_graphic) {
        return Some("holds spaces, control or non-ASCII characters".to_owned());
    }
    let repeats = (1..=bytes.len() / 2)
        .any(|period| bytes.chunks(period).all(|part| bytes.starts_with(part)));
    if repeats {
        return Some("repeats a shorter part".to_owned());
    }
    if estimated_bits(bytes) < MIN_TOKEN_BITS {
        return Some("is too regular to be random".to_owned());
    }
    None
}

/// A guesser's work for `bytes` as a crude estimate, in bits: the entropy of its
/// characters' frequencies, or of the steps between neighbours if lower (a run like
/// `abcdef…` has many characters and one step), times its length.
fn estimated_bits(bytes: &[u8]) -> f64 {
    let steps: Vec<u8> = bytes.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    frequency_bits(bytes).min(frequency_bits(&steps))
}

fn frequency_bits(symbols: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for &s in symbols {
        counts[usize::from(s)] += 1;
    }
    let n = symbols.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2() * n
        })
        .sum()
}

/// How a request was let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// With the bearer token: a script, not a browser, so no anti-forgery token is needed.
    Bearer,
    /// With the session cookie, or with no token configured (the application's own
    /// authentication in front decides): a browser, whose changes need the anti-forgery
    /// token.
    Browser,
    /// Not at all: only the login form is served.
    Denied,
}

/// The secrets of one router: the digest of its token, the key its cookies are signed with
/// (random per router, so a restart ends every session), and the sessions not ended.
pub(crate) struct Secrets {
    token: Option<[u8; 32]>,
    key: [u8; 32],
    /// Each live session's id and expiry, oldest first: a session cookie is valid only
    /// while its id is here, so signing out ends it wherever the cookie is replayed.
    sessions: Mutex<VecDeque<(String, u64)>>,
}

/// The most sessions a router keeps at once; a sign-in beyond ends the oldest. Only a
/// holder of the token signs in, so this bounds what an operator's own browsers cost.
const MAX_SESSIONS: usize = 1_024;

/// `n` random bytes from the operating system; should it fail, a digest of process-keyed
/// hashes and the time, which an attacker cannot predict either.
pub(crate) fn random() -> [u8; 32] {
    let mut bytes = [0; 32];
    if getrandom::fill(&mut bytes).is_err() {
        use std::hash::BuildHasher;
        let mut digest = Sha256::new();
        for i in 0..4u8 {
            let state = std::collections::hash_map::RandomState::new();
            digest.update(state.hash_one(i).to_le_bytes());
        }
        digest.update(format!("{:?}", SystemTime::now()));
        bytes = digest.finalize().into();
    }
    bytes
}

impl Secrets {
    pub(crate) fn new(token: Option<&[u8]>) -> Self {
        Self {
            token: token.map(|t| Sha256::digest(t).into()),
            key: random(),
            sessions: Mutex::default(),
        }
    }

    /// Whether a token is required.
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `given` is the token. Digests have one length whatever the token's, and
    /// `ct_eq` takes the same time whichever byte differs: timing tells a guesser nothing.
    pub(crate) fn token_matches(&self, given: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        self.token
            .is_some_and(|token| bool::from(digest.ct_eq(&token)))
    }

    fn mac(&self, purpose: &str, message: &str) -> Option<[u8; 32]> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).ok()?;
        mac.update(purpose.as_bytes());
        mac.update(b":");
        mac.update(message.as_bytes());
        Some(mac.finalize().into_bytes().into())
    }

    fn signed_matches(&self, purpose: &str, message: &str, given_hex: &str) -> bool {
        match (self.mac(purpose, message), unhex(given_hex)) {
            (Some(expected), Some(given)) => bool::from(expected.as_slice().ct_eq(&given)),
            _ => false,
        }
    }

    /// A new session cookie's value: its expiry and id, and their signature.
    pub(crate) fn new_session(&self) -> String {
        let now = unix_now();
        let until = now + SESSION.as_secs();
        let id = hex(&random()[..16]);
        let message = format!("{until}.{id}");
        let signature = self.mac("session", &message).unwrap_or_default();
        let mut sessions = self.sessions.lock();
        sessions.retain(|&(_, until)| until > now);
        if sessions.len() >= MAX_SESSIONS {
            sessions.pop_front();
        }
        sessions.push_back((id, until));
        format!("{message}.{}", hex(&signature))
    }

    /// The id of a session cookie's value if this router signed it and it is current.
    fn signed_session<'v>(&self, value: &'v str) -> Option<&'v str> {
        let (message, signature) = value.rsplit_once('.')?;
        let (until, id) = message.split_once('.')?;
        let current = until.parse::<u64>().is_ok_and(|until| until > unix_now());
        (current && self.signed_matches("session", message, signature)).then_some(id)
    }

    /// Whether a session cookie's value is one this router signed, still current and not
    /// ended.
    fn session_valid(&self, value: &str) -> bool {
        self.signed_session(value)
            .is_some_and(|id| self.sessions.lock().iter().any(|(live, _)| live == id))
    }

    /// Ends the session of the request's cookie, if it has one: replayed from anywhere,
    /// that cookie is refused from now on.
    pub(crate) fn end_session(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, SESSION_COOKIE).and_then(|v| self.signed_session(v)) {
            self.sessions.lock().retain(|(live, _)| live != id);
        }
    }

    /// The value of the device cookie of the browser `headers` come from: its own, if this
    /// router signed it, or a new one.
    pub(crate) fn device_cookie(&self, headers: &HeaderMap) -> String {
        if let Some(value) = cookie(headers, DEVICE_COOKIE).filter(|v| self.device(v).is_some()) {
            return value.to_owned();
        }
        let id = hex(&random()[..16]);
        let signature = self.mac("device", &id).unwrap_or_default();
        format!("{id}.{}", hex(&signature))
    }

    /// The id of a device cookie's value, if this router signed it.
    fn device<'v>(&self, value: &'v str) -> Option<&'v str> {
        let (id, signature) = value.split_once('.')?;
        self.signed_matches("device", id, signature).then_some(id)
    }

    /// Whom an attempt from `request` counts against: the browser, if it signed in here
    /// before (its device cookie), or else its [address](Failures::address).
    pub(crate) fn attempter<B>(&self, request: &Request<B>) -> String {
        let device = cookie(request.headers(), DEVICE_COOKIE).and_then(|v| self.device(v));
        device.map_or_else(|| Failures::address(request), |id| format!("device {id}"))
    }

    /// The anti-forgery token of the forms shown to the browser holding `csrf_cookie`.
    pub(crate) fn csrf_token(&self, csrf_cookie: &str) -> String {
        hex(&self.mac("csrf", csrf_cookie).unwrap_or_default())
    }

    /// Whether `given` is the anti-forgery token for the request's cookie: a page of
    /// another site can neither read that cookie nor send it (`SameSite=Strict`).
    pub(crate) fn csrf_valid(&self, headers: &HeaderMap, given: &str) -> bool {
        cookie(headers, CSRF_COOKIE).is_some_and(|c| self.signed_matches("csrf", c, given))
    }

    /// The bearer token `headers` offer, when the router asks for one: a guess to be
    /// checked under the [failure limit](Failures::attempt).
    pub(crate) fn offered<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        bearer(headers).filter(|_| self.has_token())
    }

    /// How `headers` authenticate without a bearer token ([`offered`](Self::offered)).
    pub(crate) fn access(&self, headers: &HeaderMap) -> Access {
        if !self.has_token() {
            return Access::Browser;
        }
        let session = cookie(headers, SESSION_COOKIE).is_some_and(|v| self.session_valid(v));
        if session {
            Access::Browser
        } else {
            Access::Denied
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The token of an `Authorization: Bearer` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(str::trim)
}

/// The value of the cookie `name`, if the request has it.
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// How the router's cookies are set: under the path the router is mounted at, and with
/// `Secure` unless the router was told its cookies travel over plain HTTP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CookieScope<'a> {
    pub(crate) path: &'a str,
    pub(crate) secure: bool,
}

/// A `Set-Cookie` value: readable by no script, sent by no other site, and only to the
/// router's own paths (a page of the application beside it never receives it).
pub(crate) fn set_cookie(
    scope: CookieScope<'_>,
    name: &str,
    value: &str,
    max_age: Duration,
) -> String {
    let path = if scope.path.is_empty() {
        "/"
    } else {
        scope.path
    };
    let secure = if scope.secure { "; Secure" } else { "" };
    format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    )
}

/// The `Set-Cookie` value of a new session.
pub(crate) fn session_cookie(scope: CookieScope<'_>, value: &str) -> String {
    set_cookie(scope, SESSION_COOKIE, value, SESSION)
}

/// The `Set-Cookie` value of a browser's device cookie.
pub(crate) fn device_cookie(scope: CookieScope<'_>, value: &str) -> String {
    set_cookie(scope, DEVICE_COOKIE, value, DEVICE)
}

/// The `Set-Cookie` value that ends the session (signing out).
pub(crate) fn session_cleared(scope: CookieScope<'_>) -> String {
    set_cookie(scope, SESSION_COOKIE, "", Duration::ZERO)
}

/// Whether a form posted with `headers` comes from a page of the router's own origin: its
/// `Sec-Fetch-Site` says `same-origin` (or `none`: typed by the user), or, without one, its
/// `Origin` is the request's own host; a client that sends neither (a browser too old to,
/// or not a browser) is taken. An opaque `Origin` (`null`) without `Sec-Fetch-Site` is not.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text(http::HeaderName::from_static("sec-fetch-site")) {
        return site == "same-origin" || site == "none";
    }
    match text(header::ORIGIN) {
        Some(origin) => {
            let authority = origin.split_once("://").map(|(_, rest)| rest);
            authority.is_some() && authority == text(header::HOST)
        }
        None => true,
    }
}

/// Attempts with the token (a bearer token, the login form's), limited per client with
/// tollgate itself: each takes a unit of the client's quota before it is checked, and the
/// right token gives it back, so only wrong ones count, and concurrent guesses cannot slip
/// past the count. Past the limit an attempt is refused (`429`) without being checked:
/// a guess then tells nothing, right or wrong. Others cannot lock the operator out: a
/// session cookie is no guess and is never refused, failures count per client, an IPv4
/// address or an IPv6 /64 (what one host is usually given), and a browser that signed in
/// here before counts apart by its device cookie, which no one without the token can get
/// ([`Secrets::attempter`]). The store holds at most [`MAX_CLIENTS`] clients.
pub(crate) struct Failures {
    limiter: Limiter<MemoryStore>,
    rule: Rule,
}

/// What an [attempt](Failures::attempt) with the token came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    Right,
    Wrong,
    /// Past the limit: not checked.
    Refused,
}

impl Failures {
    pub(crate) fn new() -> Self {
        Self {
            limiter: Limiter::new(MemoryStore::new().max_keys(MAX_CLIENTS)),
            rule: Rule::fixed_window("admin-failed-attempts", 10, Duration::from_secs(900)),
        }
    }

    /// The client failures count under: the peer's IPv4 address or IPv6 /64, or one key
    /// for all when the server gives no connection info.
    pub(crate) fn address<B>(request: &Request<B>) -> String {
        request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_owned(), |c| client(c.0.ip()))
    }

    /// Checks an attempt by `attempter` with `right` (whether the token given is the
    /// token), unless the attempter is past the limit.
    pub(crate) async fn attempt(&self, attempter: &str, right: impl FnOnce() -> bool) -> Attempt {
        let batch = [Check::new(&self.rule, attempter.as_bytes())];
        let mut taken = match self.limiter.reserve(&batch, Duration::ZERO).await {
            Ok(taken) if taken.outcome().is_admitted() => taken,
            // Past the limit, or no count to be had: unchecked.
            _ => return Attempt::Refused,
        };
        if right() {
            drop(taken.cancel().await);
            Attempt::Right
        } else {
            drop(taken.confirm().await);
            Attempt::Wrong
        }
    }
}

/// How many clients the failure counts hold at most (a flood of new addresses makes the
/// store forget the least telling counts, never a client refused now).
pub(crate) const MAX_CLIENTS: usize = 65_536;

/// A client as failures count it: an IPv4 address (an IPv4-mapped IPv6 one too), or the
/// /64 of an IPv6 address.
fn client(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv6 clients count per /64, IPv4 (mapped or not) per address.
    #[test]
    fn clients_are_addresses_or_slash_64s() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::7".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client(a), client(b));
        assert_eq!(client(a), "2001:db8:1:2::/64");
        assert_ne!(client(a), client(c));
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(client(mapped), "203.0.113.7");
    }

    /// A form is taken from the router's own origin, or from a client that says nothing;
    /// not from another site.
    #[test]
    fn forms_come_from_the_same_origin() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in pairs {
                h.insert(*n, v.parse().unwrap());
            }
            h
        };
        assert!(same_origin(&headers(&[
            ("host", "ops:8080"),
            ("origin", "https://ops:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "ops:8080"),
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "ops"),
            ("origin", "null")
        ])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        let null = [("origin", "null"), ("sec-fetch-site", "same-origin")];
        assert!(same_origin(&headers(&null)));
        let forged = [
            ("origin", "https://ops"),
            ("host", "ops"),
            ("sec-fetch-site", "cross-site"),
        ];
        assert!(!same_origin(&headers(&forged)));
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(same_origin(&headers(&[])));
    }

    /// Cookies are scoped to the router's path, `Secure` unless told otherwise.
    #[test]
    fn cookies_are_scoped_to_the_router() {
        let scope = CookieScope {
            path: "/ops/admin",
            secure: true,
        };
        let set = session_cookie(scope, "v");
        assert!(
            set.contains("Path=/ops/admin;") && set.ends_with("; Secure"),
            "{set}"
        );
        assert!(set.contains(&format!("Max-Age={}", SESSION.as_secs())));
        let plain = session_cleared(CookieScope {
            path: "",
            secure: false,
        });
        assert!(
            plain.contains("Path=/;") && plain.contains("Max-Age=0") && !plain.contains("Secure")
        );
    }

    /// A session this router signed is valid; a changed one, or another router's, is not;
    /// and the anti-forgery token matches only its own cookie.
    #[test]
    fn sessions_and_forms_are_signed() {
        let secrets = Secrets::new(Some(b"0123456789abcdef"));
        let session = secrets.new_session();
        assert!(secrets.session_valid(&session));
        assert!(!Secrets::new(Some(b"0123456789abcdef")).session_valid(&session));
        let forged = session.replacen('1', "2", 1);
        assert!(!secrets.session_valid(&forged));
        let mut signed_in = HeaderMap::new();
        let cookie = format!("{SESSION_COOKIE}={session}");
        signed_in.insert(header::COOKIE, cookie.parse().unwrap());
        secrets.end_session(&signed_in);
        assert!(!secrets.session_valid(&session));
        assert!(secrets.session_valid(&secrets.new_session()));

        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "a=b; tollgate_admin_csrf=c1".parse().unwrap(),
        );
        assert!(secrets.csrf_valid(&headers, &secrets.csrf_token("c1")));
        assert!(!secrets.csrf_valid(&headers, &secrets.csrf_token("c2")));
        assert!(!secrets.csrf_valid(&headers, ""));
    }

    /// Tokens that can be guessed are refused: short ones, blanks, one character, a run,
    /// a repeated part; random ones of 32 hexadecimal digits or more are taken.
    #[test]
    fn guessable_tokens_are_refused() {
        for token in [
            " ".repeat(16),
            " ".repeat(40),
            "\t".repeat(40),
            "a".repeat(16),
            "a".repeat(64),
            "0123456789abcdef".to_owned(),
            "0123456789abcdef0123456789abcdef".to_owned(),
            "abcdefghijklmnopqrstuvwxyz012345".to_owned(),
            "ab".repeat(20),
            "a secret of 16 characters or more".to_owned(),
        ] {
            assert!(guessable(&token).is_some(), "{token:?}");
        }
        for _ in 0..1_000 {
            let token = hex(&random()[..16]);
            assert_eq!(guessable(&token), None, "{token}");
        }
        assert_eq!(guessable("c3000dbcba30a94e90d4be5861183f6b"), None);
    }
}

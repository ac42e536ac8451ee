//! Address keys: the TCP peer, and the client behind trusted proxies.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{HeaderName, FORWARDED};
use http::Extensions;
use ipnet::{IpNet, Ipv4Net};
use smallvec::SmallVec;

use super::{KeyBuf, KeyError, KeyErrorKind, KeyExtractor, RequestHead};
use crate::error::ConfigError;

mod trust;

/// Why an address key found no peer address, and what to add (see [`no_peer`]).
const NO_PEER: &str = no_peer(cfg!(feature = "axum"));

/// Why an address key found no peer address, with the fix: without tollgate's `axum`
/// feature axum's connection info is unreadable, so that fix comes first.
const fn no_peer(axum: bool) -> &'static str {
    if axum {
        "the peer address is not in the request's extensions: \
serve axum with `into_make_service_with_connect_info::<SocketAddr>()`, \
insert the connection's `SocketAddr` into each request's extensions (hyper), \
or serve tonic over TCP, or over TLS streams of TCP (feature `tonic`)"
    } else {
        "the peer address is not in the request's extensions: \
on axum, enable tollgate's feature `axum` (`features = [\"axum\"]`), without which axum's \
`ConnectInfo` cannot be read, and serve with `into_make_service_with_connect_info::<SocketAddr>()`; \
on hyper, insert the connection's `SocketAddr` into each request's extensions; \
on tonic, serve over TCP, or over TLS streams of TCP (feature `tonic`)"
    }
}

/// The address of the TCP peer, from the request's extensions (see [`peer_ip`]).
pub(crate) fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    {
        use tonic::transport::server::TcpConnectInfo;
        if let Some(info) = extensions.get::<TcpConnectInfo>() {
            return info.remote_addr().map(|a| a.ip());
        }
        if let Some(info) = extensions.get::<TonicTlsConnectInfo>() {
            return info.get_ref().remote_addr().map(|a| a.ip());
        }
    }
    None
}

/// What a tonic server over TLS puts in the extensions: `TlsConnectInfo<TcpConnectInfo>`,
/// named through the stream's `Connected` impl because tonic exports the type only with a
/// TLS crypto provider enabled, which tollgate should not choose for its users.
#[cfg(feature = "tonic")]
type TonicTlsConnectInfo = <tokio_rustls::server::TlsStream<tokio::net::TcpStream> as
    tonic::transport::server::Connected>::ConnectInfo;

/// Writes `ip` as a key: IPv4 as is (an IPv4-mapped IPv6 address as its IPv4 address),
/// IPv6 as its network at `v6_prefix` bits (`2001:db8:1:2::/64`).
fn push_ip(key: &mut KeyBuf, ip: IpAddr, v6_prefix: u8) {
    // Writing to a KeyBuf cannot fail.
    let _ = match ip.to_canonical() {
        IpAddr::V4(v4) => {
            push_ipv4(key, v4);
            Ok(())
        }
        IpAddr::V6(v6) if v6_prefix >= 128 => write!(key, "{v6}"),
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6_prefix))
                .unwrap_or(0);
            let net = Ipv6Addr::from(u128::from(v6) & mask);
            write!(key, "{net}/{v6_prefix}")
        }
    };
}

/// Writes `ip` in dotted decimal, as `Display` does, without `fmt`'s machinery (every IPv4
/// key is written here): one table lookup per octet.
fn push_ipv4(key: &mut KeyBuf, ip: Ipv4Addr) {
    // At most 16 bytes ("255.255.255.255."), gathered on the stack and pushed at once
    // without the last dot.
    let mut text = [0u8; 16];
    let mut len = 0;
    for octet in ip.octets() {
        let (digits, width) = OCTETS[usize::from(octet)];
        if let Some(slot) = text.get_mut(len..len + 4) {
            slot.copy_from_slice(&digits);
        }
        len += usize::from(width);
    }
    key.push(text.get(..len - 1).unwrap_or_default());
}

/// Each octet's decimal digits followed by a dot (zeros after), and how many of those
/// bytes count: `7` is `("7.", 2)`, `255` is `("255.", 4)`.
static OCTETS: [([u8; 4], u8); 256] = {
    let mut table = [([0u8; 4], 0u8); 256];
    let mut n = 0;
    while n < 256 {
        // `n` < 256: each digit below is a single decimal digit.
        let (hundreds, tens, ones) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            ([b'0' + hundreds, b'0' + tens, b'0' + ones, b'.'], 4)
        } else if n >= 10 {
            ([b'0' + tens, b'0' + ones, b'.', 0], 3)
        } else {
            ([b'0' + ones, b'.', 0, 0], 2)
        };
        n += 1;
    }
    table
};

/// The TCP peer's address; see [`peer_ip`].
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    v6_prefix: u8,
}

/// The TCP peer's address, IPv6 aggregated to /64 ([`PeerIp::ipv6_prefix`]); an IPv4-mapped
/// IPv6 peer (`::ffff:192.0.2.1`) is keyed as its IPv4 address.
///
/// Reads a [`SocketAddr`] extension (insert it in a hyper server), axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`, off by default; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or tonic's `TcpConnectInfo`, bare
/// or inside `TlsConnectInfo` (feature `tonic`). Without one of them the key is a
/// [`KeyErrorKind::Misconfigured`] error whose message
/// names the fix: the request gets a 500, never a silent pass.
///
/// Behind a reverse proxy every request comes from the proxy; use [`client_ip`] there.
pub fn peer_ip() -> PeerIp {
    PeerIp { v6_prefix: 64 }
}

impl PeerIp {
    /// Aggregates IPv6 addresses to their first `bits` bits (default 64, from 1 to 128;
    /// anything else is reported by [`validate`](KeyExtractor::validate)). See
    /// [holders of whole IPv6 networks](super#holders-of-whole-ipv6-networks).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits;
        self
    }
}

/// Whether `bits` is an IPv6 prefix length: 1 to 128. (/0 would be one key for all of
/// IPv6; a [`global`](super::global) limit says that plainly.)
fn check_ipv6_prefix(bits: u8) -> Result<(), ConfigError> {
    if (1..=128).contains(&bits) {
        Ok(())
    } else {
        Err(ConfigError::new(format!(
            "IPv6 prefix /{bits} is not between /1 and /128"
        )))
    }
}

/// What an address key with a configuration problem answers instead of a key.
const INVALID_CONFIG: &str =
    "the key's configuration is invalid; KeyExtractor::validate names the problem";

impl KeyExtractor for PeerIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        if !(1..=128).contains(&self.v6_prefix) {
            return Err(KeyError::new(KeyErrorKind::Misconfigured, INVALID_CONFIG));
        }
        let ip = peer_addr(req.extensions())
            .ok_or_else(|| KeyError::new(KeyErrorKind::Misconfigured, NO_PEER))?;
        push_ip(key, ip, self.v6_prefix);
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        check_ipv6_prefix(self.v6_prefix)
    }
}

/// Which header a trusted proxy writes the client's address to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`, a single address set by the proxy.
    XRealIp,
}

/// The client's address behind trusted proxies; see [`client_ip`].
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    /// The entries of the trusted list that are not addresses or networks.
    invalid: Vec<Box<str>>,
    header: ForwardedHeader,
    v6_prefix: u8,
    /// Whether a network of every address may be trusted ([`ClientIp::allow_trusting_everyone`]).
    everyone: bool,
}

/// The client's address behind the reverse proxies in `trusted` (CIDRs such as
/// `"10.0.0.0/8"`, or single addresses).
///
/// A peer that is not a trusted proxy is keyed by its own address, its forwarding headers
/// ignored. From a trusted proxy, the chosen header
/// ([`X-Forwarded-For`](ForwardedHeader::XForwardedFor) by default) is read from the right:
/// the right-most address that is not a trusted proxy is the client; if every address is
/// trusted, the left-most. An entry that cannot be parsed ends the walk at the last good
/// hop; a proxy that sends no header is keyed as itself. Read exactly the one header your
/// proxy sets (see [the guide](crate::guide::ip_behind_proxy)).
///
/// IPv6 addresses are aggregated to /64 ([`ClientIp::ipv6_prefix`]). A trusted proxy may be
/// written IPv4-mapped (`::ffff:10.0.0.0/104`): it is the IPv4 proxy either way. The peer
/// address comes from the same place as [`peer_ip`]'s.
///
/// ```
/// use tollgate::key::{self, ForwardedHeader, KeyExtractor};
///
/// let behind_lb = key::client_ip(["10.0.0.0/8", "fd00::/8"]).header(ForwardedHeader::Forwarded);
/// // A mistake in the list is reported by the layer's `build`, naming the rule it keys.
/// assert!(key::client_ip(["not an address"]).validate().is_err());
/// ```
pub fn client_ip<I>(trusted: I) -> ClientIp
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut client = ClientIp {
        trusted: Vec::new(),
        invalid: Vec::new(),
        header: ForwardedHeader::default(),
        v6_prefix: 64,
        everyone: false,
    };
    for s in trusted {
        let s = s.as_ref().trim();
        match s
            .parse::<IpNet>()
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        {
            Ok(net) => client.trusted.push(unmapped_net(net)),
            Err(_) => client.invalid.push(s.into()),
        }
    }
    client
}

impl ClientIp {
    /// Reads the client's address from `header` (default `X-Forwarded-For`).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Aggregates IPv6 addresses to their first `bits` bits (see [`PeerIp::ipv6_prefix`]).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits;
        self
    }

    /// Allows trusted networks of every address (`0.0.0.0/0`, `::/0`), or of more public
    /// addresses than any proxy tier has (more than a /8 of IPv4 or a /16 of IPv6), which
    /// validation otherwise refuses: trusting nearly every peer lets nearly every client
    /// choose its own key. Right only where nothing but the proxy can reach the service.
    ///
    /// ```
    /// use tollgate::key::{self, KeyExtractor};
    ///
    /// assert!(key::client_ip(["0.0.0.0/0"]).validate().is_err());
    /// assert!(key::client_ip(["0.0.0.0/0"]).allow_trusting_everyone().validate().is_ok());
    /// ```
    pub fn allow_trusting_everyone(mut self) -> Self {
        self.everyone = true;
        self
    }

    /// Whether `ip` is a trusted proxy. The trusted networks hold no IPv4-mapped entries
    /// (see [`unmapped_net`]), so a mapped address is looked up as its IPv4 address.
    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address for a request from `peer`.
    fn client(&self, req: &RequestHead<'_>, peer: IpAddr) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let name: HeaderName = match self.header {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
            ForwardedHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        };
        let values: SmallVec<[&[u8]; 4]> = req
            .headers()
            .get_all(&name)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        if self.header == ForwardedHeader::XRealIp {
            // A single address, written by the proxy: only the last one counts.
            return values.last().and_then(|v| parse_node(v)).unwrap_or(peer);
        }
        let mut client = peer;
        for value in values.iter().rev() {
            for entry in value.rsplit(|b| *b == b',') {
                let ip = match self.header {
                    ForwardedHeader::Forwarded => forwarded_for(entry),
                    _ => parse_node(entry),
                };
                let Some(ip) = ip else {
                    return client;
                };
                client = ip;
                if !self.is_trusted(ip) {
                    return ip;
                }
            }
        }
        client
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), KeyError> {
        if !self.invalid.is_empty() || !(1..=128).contains(&self.v6_prefix) {
            return Err(KeyError::new(KeyErrorKind::Misconfigured, INVALID_CONFIG));
        }
        let peer = peer_addr(req.extensions())
            .ok_or_else(|| KeyError::new(KeyErrorKind::Misconfigured, NO_PEER))?;
        push_ip(key, self.client(req, peer), self.v6_prefix);
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = self
            .invalid
            .iter()
            .map(|s| ConfigError::new(format!("trusted proxy {s:?} is not an address or CIDR")));
        // Trusting every address, at once, in pieces or nearly, lets nearly every client
        // write its own key in the header.
        let everyone = trust::too_wide(&self.trusted)
            .filter(|_| !self.everyone)
            .map(|(nets, what)| {
                let (who, verb) = match nets.as_slice() {
                    [one] => (format!("trusted proxy \"{one}\""), "trusts"),
                    _ => {
                        let listed: Vec<String> = nets.iter().map(|n| format!("\"{n}\"")).collect();
                        (format!("trusted proxies {}", listed.join(", ")), "together trust")
                    }
                };
                ConfigError::new(format!(
                    "{who} {verb} {what}, more than any proxy tier, so nearly every client chooses its own key: list your proxies' addresses instead (or, if nothing but your proxy can reach this service, call `allow_trusting_everyone()`)"
                ))
            });
        let prefix = check_ipv6_prefix(self.v6_prefix).err();
        ConfigError::collect(invalid.chain(everyone).chain(prefix)).map_or(Ok(()), Err)
    }
}

/// `net`, or the IPv4 network an IPv4-mapped one stands for (`::ffff:10.0.0.0/104` is
/// `10.0.0.0/8`). A network wider than the mapped range (`::/0`) stays IPv6.
fn unmapped_net(net: IpNet) -> IpNet {
    let IpNet::V6(v6) = net else { return net };
    let mapped_bits = v6.prefix_len().checked_sub(96);
    match (v6.network().to_ipv4_mapped(), mapped_bits) {
        (Some(v4), Some(bits)) => Ipv4Net::new(v4, bits).map_or(net, IpNet::V4),
        _ => net,
    }
}

/// The `for=` address of one `Forwarded` element (`for=192.0.2.60;proto=http`).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    element.split(|b| *b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let (name, value) = pair.split_at(pair.iter().position(|b| *b == b'=')?);
        name.eq_ignore_ascii_case(b"for")
            .then(|| parse_node(&value[1..]))
            .flatten()
    })
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]:4711`, optionally quoted and padded with spaces.
fn parse_node(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(raw.trim_ascii()).ok()?;
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        return rest[..end].parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    // Else an address, or IPv4 with a port.
    s.parse::<IpAddr>()
        .or_else(|_| s.parse::<SocketAddr>().map(|a| a.ip()))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn key_of(e: &impl KeyExtractor, req: &Request<()>) -> String {
        let mut buf = KeyBuf::new();
        e.extract(&RequestHead::from_request(req), &mut buf)
            .unwrap();
        String::from_utf8(buf.as_bytes().to_vec()).unwrap()
    }

    fn from(peer: &str, headers: &[(&str, &[u8])]) -> Request<()> {
        let mut b = Request::get("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(SocketAddr::new(peer.parse().unwrap(), 1234));
        req
    }

    /// A peer-address key that finds no address says what to add, first the feature this
    /// build lacks: without `axum`, axum's `ConnectInfo` is in every request but unreadable.
    #[test]
    fn no_peer_names_the_missing_feature_first() {
        let without_axum = no_peer(false);
        let fix = without_axum.split(':').nth(1).unwrap_or_default();
        assert!(
            fix.contains("enable tollgate's feature `axum`"),
            "{without_axum}"
        );
        let with_axum = no_peer(true);
        assert!(!with_axum.contains("feature `axum`"), "{with_axum}");
        for message in [without_axum, with_axum] {
            assert!(message.contains("into_make_service_with_connect_info::<SocketAddr>()"));
        }
    }

    /// The key's IPv4 text is `Display`'s, so keys (in Redis, in allow-lists) stay as
    /// they were written.
    #[test]
    fn ipv4_keys_are_written_as_display_writes_them() {
        let octets = [0u8, 1, 9, 10, 42, 99, 100, 199, 200, 255];
        for a in 0..=255u8 {
            for b in octets {
                let ip = Ipv4Addr::new(a, b, a.wrapping_mul(7), b);
                let mut buf = KeyBuf::new();
                push_ipv4(&mut buf, ip);
                assert_eq!(buf.as_bytes(), ip.to_string().as_bytes());
            }
        }
    }

    /// IPv6 peers are keyed by their /64 or the configured prefix, mapped addresses as
    /// IPv4, and a prefix outside 1 to 128 is refused and, used anyway, finds no key.
    #[test]
    fn peer_ip_aggregates_ipv6() {
        let req = from("2001:db8:1:2:aaaa::1", &[]);
        assert_eq!(key_of(&peer_ip(), &req), "2001:db8:1:2::/64");
        assert_eq!(key_of(&peer_ip().ipv6_prefix(48), &req), "2001:db8:1::/48");
        assert_eq!(
            key_of(&peer_ip().ipv6_prefix(128), &req),
            "2001:db8:1:2:aaaa::1"
        );
        assert_eq!(key_of(&peer_ip().ipv6_prefix(1), &req), "::/1");
        assert_eq!(key_of(&peer_ip(), &from("::ffff:1.2.3.4", &[])), "1.2.3.4");
        for bits in [0, 129, 255] {
            let err = peer_ip().ipv6_prefix(bits).validate().unwrap_err();
            assert!(err.to_string().contains(&format!("/{bits} ")), "{err}");
            let client = client_ip(["10.0.0.0/8"]).ipv6_prefix(bits);
            assert!(client.validate().is_err());
            // Used anyway, it finds no key rather than a key of the wrong width.
            let e = client
                .extract(&RequestHead::from_request(&req), &mut KeyBuf::new())
                .unwrap_err();
            assert_eq!(e.kind(), super::super::KeyErrorKind::Misconfigured);
        }
    }

    /// Validation reports every bad trusted-proxy entry and a bad prefix at once, each by
    /// value.
    #[test]
    fn every_bad_trusted_entry_is_reported() {
        let client = client_ip(["10.0.0.0/8", "bad", "10.0.0.0/33"]).ipv6_prefix(0);
        let err = client.validate().unwrap_err();
        let problems: Vec<&str> = err.problems().collect();
        assert_eq!(problems.len(), 3, "{err}");
        assert!(problems[0].contains("\"bad\""), "{err}");
        assert!(problems[1].contains("\"10.0.0.0/33\""), "{err}");
        assert!(problems[2].contains("/0 "), "{err}");
    }

    /// A trusted proxy given as an IPv4-mapped address or network trusts that IPv4 proxy,
    /// and `::/0` trusts IPv6 peers only.
    #[test]
    fn mapped_trusted_proxies_are_ipv4_proxies() {
        let e = client_ip(["::ffff:10.0.0.0/104", "::ffff:192.0.2.7", "::/0"]);
        assert_eq!(
            e.trusted,
            [
                "10.0.0.0/8".parse::<IpNet>().unwrap(),
                "192.0.2.7/32".parse().unwrap(),
                "::/0".parse().unwrap()
            ]
        );
        let xff = |peer, v: &'static [u8]| from(peer, &[("x-forwarded-for", v)]);
        for proxy in [
            "10.1.2.3",
            "::ffff:10.1.2.3",
            "192.0.2.7",
            "::ffff:192.0.2.7",
        ] {
            assert_eq!(key_of(&e, &xff(proxy, b"1.2.3.4")), "1.2.3.4", "{proxy}");
        }
        // `::/0` trusts IPv6 peers only: a mapped address is IPv4.
        assert_eq!(key_of(&e, &xff("2001:db8::1", b"1.2.3.4")), "1.2.3.4");
        assert_eq!(key_of(&e, &xff("::ffff:8.8.8.8", b"1.2.3.4")), "8.8.8.8");
    }

    /// A peer-IP key without the peer address is misconfigured, and its error names the
    /// fix.
    #[test]
    fn missing_peer_names_the_fix() {
        let req = Request::get("/").body(()).unwrap();
        let mut buf = KeyBuf::new();
        let err = peer_ip()
            .extract(&RequestHead::from_request(&req), &mut buf)
            .unwrap_err();
        assert_eq!(err.kind(), super::super::KeyErrorKind::Misconfigured);
        assert!(err
            .message()
            .contains("into_make_service_with_connect_info"));
    }

    /// Behind trusted proxies the client is the right-most untrusted `X-Forwarded-For` hop,
    /// and an untrusted peer's headers are ignored.
    #[test]
    fn forwarded_headers_are_read_from_the_right() {
        let e = client_ip(["10.0.0.0/8"]);
        let xff = |v: &'static [u8]| from("10.0.0.1", &[("x-forwarded-for", v)]);
        // Untrusted peer: headers ignored.
        assert_eq!(
            key_of(&e, &from("5.5.5.5", &[("x-forwarded-for", b"1.2.3.4")])),
            "5.5.5.5"
        );
        assert_eq!(key_of(&e, &xff(b"1.2.3.4")), "1.2.3.4");
        // The client's own spoofed entries sit left of its real address.
        assert_eq!(key_of(&e, &xff(b"9.9.9.9, 1.2.3.4, 10.1.1.1")), "1.2.3.4");
        // All trusted: the left-most.
        assert_eq!(key_of(&e, &xff(b"10.2.2.2, 10.1.1.1")), "10.2.2.2");
        // Garbage ends the walk at the last good hop.
        assert_eq!(key_of(&e, &xff(b"1.2.3.4, nonsense, 10.1.1.1")), "10.1.1.1");
        assert_eq!(key_of(&e, &xff(b"\xff\xfe")), "10.0.0.1");
        assert_eq!(key_of(&e, &xff(b"1.2.3.4:5678")), "1.2.3.4");
        // No header: the proxy itself.
        assert_eq!(key_of(&e, &from("10.0.0.1", &[])), "10.0.0.1");
        // Several header lines are one list.
        let two = from(
            "10.0.0.1",
            &[
                ("x-forwarded-for", b"7.7.7.7"),
                ("x-forwarded-for", b"10.3.3.3"),
            ],
        );
        assert_eq!(key_of(&e, &two), "7.7.7.7");
    }

    /// The client is read from `Forwarded` `for=` or `X-Real-IP` as configured, from
    /// trusted peers only; a value that names no address leaves the peer.
    #[test]
    fn rfc7239_forwarded() {
        let e = client_ip(["10.0.0.0/8"]).header(ForwardedHeader::Forwarded);
        let fwd = |v: &'static [u8]| from("10.0.0.1", &[("forwarded", v)]);
        assert_eq!(
            key_of(&e, &fwd(b"for=192.0.2.60;proto=http;by=203.0.113.43")),
            "192.0.2.60"
        );
        assert_eq!(
            key_of(&e, &fwd(b"for=1.1.1.1, For=\"[2001:db8:cafe::17]:4711\"")),
            "2001:db8:cafe::/64"
        );
        assert_eq!(key_of(&e, &fwd(b"for=unknown")), "10.0.0.1");
        assert_eq!(key_of(&e, &fwd(b";;==,=;")), "10.0.0.1");
        assert_eq!(key_of(&e, &fwd(b"proto=https")), "10.0.0.1");
        let real = client_ip(["10.0.0.0/8"]).header(ForwardedHeader::XRealIp);
        assert_eq!(
            key_of(&real, &from("10.0.0.1", &[("x-real-ip", b"3.3.3.3")])),
            "3.3.3.3"
        );
        assert_eq!(
            key_of(&real, &from("8.8.8.8", &[("x-real-ip", b"3.3.3.3")])),
            "8.8.8.8"
        );
    }

    proptest::proptest! {
        /// Whatever a client or proxy writes, extraction answers with an address.
        #[test]
        fn any_forwarding_header_gives_an_address(value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let Ok(value) = http::HeaderValue::from_bytes(&value) else { return Ok(()) };
            for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded, ForwardedHeader::XRealIp] {
                let e = client_ip(["10.0.0.0/8"]).header(header);
                let mut req = Request::get("/").body(()).unwrap();
                for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
                    req.headers_mut().append(name, value.clone());
                }
                req.extensions_mut().insert(SocketAddr::from(([10, 0, 0, 1], 1)));
                let mut buf = KeyBuf::new();
                proptest::prop_assert!(e.extract(&RequestHead::from_request(&req), &mut buf).is_ok());
                proptest::prop_assert!(!buf.as_bytes().is_empty());
            }
        }
    }
}

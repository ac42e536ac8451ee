//! Trusted proxy lists too wide to be a proxy tier (see
//! [`ClientIp::allow_trusting_everyone`](crate::key::ClientIp::allow_trusting_everyone)).

use ipnet::IpNet;

/// The most public IPv4 addresses a list of proxies may hold: a /8 (the largest CDNs hold
/// a few million).
const MOST_PUBLIC_V4: u128 = 1 << 24;
/// The most public IPv6 addresses a list of proxies may hold: a /16.
const MOST_PUBLIC_V6: u128 = 1 << 112;

/// IPv4 networks no client on the internet sends from (RFC 6890): private, shared,
/// loopback, link-local, documentation, benchmarking, multicast and reserved. Disjoint.
const NOT_PUBLIC_V4: [&str; 14] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// Per address family whose public addresses `trusted` holds too many of: the networks of
/// that family (`0.0.0.0/0` alone where it is listed), and what they trust.
pub(super) fn too_wide(trusted: &[IpNet]) -> impl Iterator<Item = (Vec<IpNet>, &'static str)> + '_ {
    let aggregated = IpNet::aggregate(&trusted.to_vec());
    [true, false].into_iter().filter_map(move |v4| {
        let of_family = |nets: &[IpNet]| -> Vec<IpNet> {
            nets.iter()
                .filter(|net| net.addr().is_ipv4() == v4)
                .copied()
                .collect()
        };
        let family = of_family(&aggregated);
        let (public, most) = if v4 {
            (public(&family, "0.0.0.0/0", &NOT_PUBLIC_V4), MOST_PUBLIC_V4)
        } else {
            (
                public(&family, "2000::/3", &["2001:db8::/32"]),
                MOST_PUBLIC_V6,
            )
        };
        if public <= most {
            return None;
        }
        let what = match (family.iter().any(|n| n.prefix_len() == 0), v4) {
            (true, _) => "every address",
            (false, true) => "more public addresses than a /8",
            (false, false) => "more public addresses than a /16",
        };
        let mut nets = of_family(trusted);
        if let Some(whole) = nets.iter().find(|net| net.prefix_len() == 0) {
            return Some((vec![*whole], what));
        }
        nets.sort_unstable();
        nets.dedup();
        Some((nets, what))
    })
}

/// How many public addresses the disjoint networks `nets` hold: those in `space` outside
/// the disjoint `holes` within it (IPv6: global unicast outside documentation).
fn public(nets: &[IpNet], space: &str, holes: &[&str]) -> u128 {
    let in_nets = |list: &[&str]| -> u128 {
        let list: Vec<IpNet> = list.iter().filter_map(|n| n.parse().ok()).collect();
        nets.iter().map(|net| overlap(net, &list)).sum()
    };
    in_nets(&[space]) - in_nets(holes)
}

/// How many addresses `net` shares with the disjoint networks `others`: two networks are
/// nested or apart, so each shares all of the smaller or nothing.
fn overlap(net: &IpNet, others: &[IpNet]) -> u128 {
    others
        .iter()
        .filter(|other| other.addr().is_ipv4() == net.addr().is_ipv4())
        .map(|other| match (net.contains(other), other.contains(net)) {
            (true, _) => size(other),
            (_, true) => size(net),
            _ => 0,
        })
        .sum()
}

/// How many addresses `net` holds (all of IPv6, 2^128, saturates).
fn size(net: &IpNet) -> u128 {
    let host_bits = u32::from(net.max_prefix_len() - net.prefix_len());
    1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wide(list: &[&str]) -> Vec<&'static str> {
        let nets: Vec<IpNet> = list.iter().map(|n| n.parse().unwrap()).collect();
        too_wide(&nets).map(|(_, what)| what).collect()
    }

    /// Every address, all but one address, all but reserved space, half of IPv4 or all of
    /// global unicast IPv6 are too wide; private networks and a CDN's ranges are not.
    #[test]
    fn near_covers_of_the_internet_are_too_wide() {
        assert_eq!(wide(&["0.0.0.0/0"]), ["every address"]);
        assert_eq!(wide(&["0.0.0.0/1"]).len(), 1);
        assert_eq!(wide(&["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3"]).len(), 1);
        assert_eq!(wide(&["2000::/3"]), ["more public addresses than a /16"]);
        assert_eq!(wide(&["::/1"]).len(), 1);
        // Every address but 255.255.255.255: 32 networks, /1 to /32.
        let all_but_one: Vec<String> = (1..=32u32)
            .map(|len| {
                let base = if len == 1 { 0 } else { u32::MAX << (33 - len) };
                format!("{}/{len}", std::net::Ipv4Addr::from(base))
            })
            .collect();
        let all_but_one: Vec<&str> = all_but_one.iter().map(String::as_str).collect();
        assert_eq!(wide(&all_but_one).len(), 1);

        let private = [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
        ];
        assert!(wide(&private).is_empty());
        assert!(wide(&["fc00::/7", "fe80::/10", "::1/128"]).is_empty());
        let cdn = [
            "104.16.0.0/13",
            "172.64.0.0/13",
            "2606:4700::/32",
            "2a06:98c0::/29",
        ];
        assert!(wide(&cdn).is_empty());
    }
}

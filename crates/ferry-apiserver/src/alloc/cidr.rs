//! CIDR ranges and the index arithmetic the allocators need (no IO).
//!
//! A range's usable addresses are numbered from 0: index 0 is the address after the network
//! address. IPv4 ranges also exclude the broadcast address; IPv6 ranges only the network address
//! (as upstream's allocator does).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The name used in `spec.ipFamilies`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }
    fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// An IP network: address (host bits cleared) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub family: Family,
    network: u128,
    pub prefix: u8,
}

/// Parses a textual IP (IPv4 or IPv6) to its family and integer value.
pub fn ip_to_u128(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

fn u128_to_ip(family: Family, v: u128) -> IpAddr {
    match family {
        // Values of an IPv4 range always fit in 32 bits.
        Family::V4 => IpAddr::V4(std::net::Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(std::net::Ipv6Addr::from(v)),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}")]
pub struct CidrError(pub String);

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = || CidrError(s.to_string());
        let (addr, len) = s.trim().split_once('/').ok_or_else(err)?;
        let ip: IpAddr = addr.parse().map_err(|_| err())?;
        let prefix: u8 = len.parse().map_err(|_| err())?;
        let family = Family::of(&ip);
        if prefix > family.bits() {
            return Err(err());
        }
        let host_bits = u32::from(family.bits() - prefix);
        let mask = if host_bits >= 128 {
            0
        } else {
            !((1u128 << host_bits) - 1)
        };
        Ok(Cidr {
            family,
            network: ip_to_u128(&ip) & mask,
            prefix,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            u128_to_ip(self.family, self.network),
            self.prefix
        )
    }
}

impl Cidr {
    fn host_bits(&self) -> u32 {
        u32::from(self.family.bits() - self.prefix)
    }
    /// The number of addresses in the whole network (saturating at `u128::MAX`).
    pub fn total(&self) -> u128 {
        let h = self.host_bits();
        if h >= 128 { u128::MAX } else { 1u128 << h }
    }
    /// The number of allocatable addresses.
    pub fn usable(&self) -> u128 {
        let excluded = match self.family {
            Family::V4 => 2,
            Family::V6 => 1,
        };
        self.total().saturating_sub(excluded)
    }
    pub fn contains(&self, ip: &IpAddr) -> bool {
        if Family::of(ip) != self.family {
            return false;
        }
        let v = ip_to_u128(ip);
        v >= self.network && v - self.network < self.total()
    }
    /// The index of `ip` among the usable addresses, if it is one.
    pub fn index_of(&self, ip: &IpAddr) -> Option<u128> {
        if !self.contains(ip) {
            return None;
        }
        let off = ip_to_u128(ip) - self.network;
        if off == 0 {
            return None;
        }
        let i = off - 1;
        (i < self.usable()).then_some(i)
    }
    /// The usable address at `index`.
    pub fn at(&self, index: u128) -> Option<IpAddr> {
        (index < self.usable()).then(|| u128_to_ip(self.family, self.network + 1 + index))
    }
    /// The first usable address (the `kubernetes` Service's ClusterIP).
    pub fn first(&self) -> Option<IpAddr> {
        self.at(0)
    }
    /// Size of the static band at the bottom of the range (upstream's
    /// `min(max(16, size/16), 256)`, 0 for ranges smaller than 16 addresses).
    pub fn static_band(&self) -> u128 {
        static_band(self.total(), 16, 16, 256).min(self.usable())
    }
}

/// `min(max(min, size/step), max)`, or 0 when `size < min`.
pub fn static_band(size: u128, min: u128, step: u128, max: u128) -> u128 {
    if size < min {
        return 0;
    }
    (size / step).clamp(min, max)
}

/// Parses `--service-cluster-ip-range`: one CIDR, or two of different families.
pub fn parse_service_cidrs(s: &str) -> Result<Vec<Cidr>, CidrError> {
    let cidrs: Vec<Cidr> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.family != b.family => Ok(cidrs),
        _ => Err(CidrError(format!(
            "{s}: expected one CIDR or two of different IP families"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_index() {
        let cases: &[(&str, &str, u128, &str, u128)] = &[
            // cidr, display, usable, first, static band
            (
                "10.96.0.0/12",
                "10.96.0.0/12",
                (1 << 20) - 2,
                "10.96.0.1",
                256,
            ),
            ("10.0.0.5/24", "10.0.0.0/24", 254, "10.0.0.1", 16),
            ("10.0.0.0/28", "10.0.0.0/28", 14, "10.0.0.1", 14),
            ("10.0.0.0/29", "10.0.0.0/29", 6, "10.0.0.1", 0),
            ("fd00::/108", "fd00::/108", (1 << 20) - 1, "fd00::1", 256),
            ("192.168.0.0/20", "192.168.0.0/20", 4094, "192.168.0.1", 256),
            ("192.168.0.0/22", "192.168.0.0/22", 1022, "192.168.0.1", 64),
        ];
        for (s, disp, usable, first, band) in cases {
            let c: Cidr = s.parse().unwrap();
            assert_eq!(c.to_string(), *disp, "{s}");
            assert_eq!(c.usable(), *usable, "{s}");
            assert_eq!(c.first().unwrap().to_string(), *first, "{s}");
            assert_eq!(c.static_band(), *band, "{s}");
        }
    }

    #[test]
    fn bounds() {
        let c: Cidr = "10.0.0.0/24".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(c.index_of(&ip("10.0.0.0")), None);
        assert_eq!(c.index_of(&ip("10.0.0.1")), Some(0));
        assert_eq!(c.index_of(&ip("10.0.0.254")), Some(253));
        assert_eq!(c.index_of(&ip("10.0.0.255")), None);
        assert_eq!(c.index_of(&ip("10.0.1.1")), None);
        assert_eq!(c.index_of(&ip("fd00::1")), None);
        assert_eq!(c.at(254), None);
        let v6: Cidr = "fd00::/120".parse().unwrap();
        assert_eq!(v6.index_of(&ip("fd00::ff")), Some(254));
    }

    #[test]
    fn service_cidrs() {
        assert_eq!(parse_service_cidrs("10.96.0.0/12").unwrap().len(), 1);
        assert_eq!(
            parse_service_cidrs("10.96.0.0/12,fd00::/108")
                .unwrap()
                .len(),
            2
        );
        assert!(parse_service_cidrs("10.96.0.0/12,10.0.0.0/16").is_err());
        assert!(parse_service_cidrs("nonsense").is_err());
        assert!(parse_service_cidrs("10.0.0.0/33").is_err());
        assert!(parse_service_cidrs("").is_err());
    }

    #[test]
    fn index_round_trip() {
        for prefix in 8u8..31 {
            for i in [0u128, 1, 2, 13, 14, 15, 253, 254, 255, 4093, 4094, 99_999] {
                let c: Cidr = format!("10.0.0.0/{prefix}").parse().unwrap();
                if let Some(ip) = c.at(i) {
                    assert_eq!(c.index_of(&ip), Some(i));
                } else {
                    assert!(i >= c.usable());
                }
            }
        }
    }
}

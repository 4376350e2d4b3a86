//! PROXY protocol headers (HAProxy's spec, versions 1 and 2) sent to a backend before the
//! client's bytes, so that the backend learns the client and service addresses.

use std::net::SocketAddr;

use crate::model::ProxyProtocol;

/// The 12-byte version 2 signature.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The header for a TCP connection from `src` to `dst` (the address the client connected to).
pub fn header(version: ProxyProtocol, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    // Mixed families (IPv4 client, IPv6 frontend or the reverse) cannot be expressed: both
    // versions then describe an unknown connection.
    let same = src.is_ipv4() == dst.is_ipv4();
    match version {
        ProxyProtocol::V1 => {
            if !same {
                return b"PROXY UNKNOWN\r\n".to_vec();
            }
            let fam = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {fam} {} {} {} {}\r\n",
                src.ip(),
                dst.ip(),
                src.port(),
                dst.port()
            )
            .into_bytes()
        }
        ProxyProtocol::V2 => {
            let mut out = V2_SIGNATURE.to_vec();
            // Version 2, command PROXY.
            out.push(0x21);
            match (src, dst) {
                (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                    out.push(0x11); // AF_INET, STREAM
                    out.extend_from_slice(&12u16.to_be_bytes());
                    out.extend_from_slice(&s.ip().octets());
                    out.extend_from_slice(&d.ip().octets());
                    out.extend_from_slice(&s.port().to_be_bytes());
                    out.extend_from_slice(&d.port().to_be_bytes());
                }
                (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                    out.push(0x21); // AF_INET6, STREAM
                    out.extend_from_slice(&36u16.to_be_bytes());
                    out.extend_from_slice(&s.ip().octets());
                    out.extend_from_slice(&d.ip().octets());
                    out.extend_from_slice(&s.port().to_be_bytes());
                    out.extend_from_slice(&d.port().to_be_bytes());
                }
                _ => {
                    out.push(0x00); // AF_UNSPEC
                    out.extend_from_slice(&0u16.to_be_bytes());
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_table() {
        for (src, dst, want) in [
            (
                "192.0.2.202:12345",
                "10.0.42.7:7",
                "PROXY TCP4 192.0.2.202 10.0.42.7 12345 7\r\n",
            ),
            (
                "[::1]:1000",
                "[fd00::10]:80",
                "PROXY TCP6 ::1 fd00::10 1000 80\r\n",
            ),
            ("127.0.0.1:1", "[::1]:80", "PROXY UNKNOWN\r\n"),
        ] {
            assert_eq!(
                String::from_utf8(header(ProxyProtocol::V1, sa(src), sa(dst))).unwrap(),
                want
            );
        }
    }

    #[test]
    fn v2_layout() {
        let h = header(
            ProxyProtocol::V2,
            sa("192.0.2.202:12345"),
            sa("10.0.42.7:7"),
        );
        assert_eq!(&h[..12], &V2_SIGNATURE);
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 12);
        assert_eq!(&h[16..20], &[192, 0, 2, 202]);
        assert_eq!(&h[20..24], &[10, 0, 42, 7]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 12345);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 7);
        assert_eq!(h.len(), 28);
        let h6 = header(ProxyProtocol::V2, sa("[::1]:1"), sa("[::2]:2"));
        assert_eq!((h6[13], h6.len()), (0x21, 16 + 36));
        let mixed = header(ProxyProtocol::V2, sa("127.0.0.1:1"), sa("[::2]:2"));
        assert_eq!((mixed[13], mixed.len()), (0x00, 16));
    }
}

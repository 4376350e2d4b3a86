//! TCP keepalive for long-lived connections: a peer that vanished (host gone, cable pulled)
//! is detected in about `idle + 3 * interval` instead of being held until the idle timeout.
//! The values follow Go's dialer and listener defaults (probe after 15 s, every 15 s).

use std::os::fd::AsFd;
use std::time::Duration;

use rustix::net::sockopt;

/// Keepalive probe settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle: Duration::from_secs(15),
            interval: Duration::from_secs(15),
            count: 9,
        }
    }
}

/// Turns keepalive on for a TCP socket.
pub fn set(sock: impl AsFd, k: Keepalive) -> std::io::Result<()> {
    let fd = sock.as_fd();
    sockopt::set_socket_keepalive(fd, true)?;
    sockopt::set_tcp_keepidle(fd, k.idle)?;
    sockopt::set_tcp_keepintvl(fd, k.interval)?;
    sockopt::set_tcp_keepcnt(fd, k.count)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        set(&c, Keepalive::default()).unwrap();
        assert!(sockopt::socket_keepalive(&c).unwrap());
        assert_eq!(sockopt::tcp_keepidle(&c).unwrap(), Duration::from_secs(15));
        assert_eq!(sockopt::tcp_keepcnt(&c).unwrap(), 9);
    }
}

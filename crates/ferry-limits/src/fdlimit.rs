//! The process's file-descriptor limit and its split between components.
//!
//! Linux starts most processes with a soft `RLIMIT_NOFILE` of 1024 and a much higher hard
//! limit. A server that holds one descriptor per connection raises the soft limit to the hard
//! one at start (as Go's runtime has done since 1.19, and as systemd recommends for servers),
//! then gives every component its own share so that one flood cannot starve the rest.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Used when the hard limit is "unlimited" (the kernel still caps the soft limit at
/// `fs.nr_open`, 1048576 by default).
const UNLIMITED_AS: u64 = 1 << 20;

/// The limit in force after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (`None`: unlimited).
    pub hard: Option<u64>,
}

/// Why the limit could not be changed.
#[derive(Debug, thiserror::Error)]
#[error("setting RLIMIT_NOFILE to {wanted}: {source}")]
pub struct FdLimitError {
    pub wanted: u64,
    #[source]
    pub source: std::io::Error,
}

fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(UNLIMITED_AS)
}

/// The soft limit to ask for: `target` (or the hard limit when `None`), never above the hard
/// limit, nor above `nr_open` when the hard limit is unlimited.
pub fn wanted_soft(target: Option<u64>, hard: Option<u64>, nr_open: u64) -> u64 {
    let ceiling = hard.unwrap_or(nr_open);
    target.map_or(ceiling, |t| t.min(ceiling)).max(1)
}

/// The current soft limit.
pub fn current() -> FdLimit {
    let r = getrlimit(Resource::Nofile);
    let soft = r.current.unwrap_or(UNLIMITED_AS);
    FdLimit {
        before: soft,
        soft,
        hard: r.maximum,
    }
}

/// Sets the soft `RLIMIT_NOFILE` to `target`, or to the hard limit when `target` is `None`
/// (a lower `target` lowers it: tests use that to make exhaustion cheap to reach).
pub fn raise_nofile(target: Option<u64>) -> Result<FdLimit, FdLimitError> {
    let r = getrlimit(Resource::Nofile);
    let before = r.current.unwrap_or(UNLIMITED_AS);
    let wanted = wanted_soft(target, r.maximum, nr_open());
    if r.current == Some(wanted) {
        return Ok(FdLimit {
            before,
            soft: wanted,
            hard: r.maximum,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted),
            maximum: r.maximum,
        },
    )
    .map_err(|e| FdLimitError {
        wanted,
        source: e.into(),
    })?;
    Ok(FdLimit {
        before,
        soft: wanted,
        hard: r.maximum,
    })
}

/// Which components share the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Parts {
    pub apiserver: bool,
    pub dns: bool,
    pub proxy: bool,
}

impl Parts {
    /// `ferry up`: everything in one process.
    pub const ALL: Parts = Parts {
        apiserver: true,
        dns: true,
        proxy: true,
    };
}

/// Connection caps derived from a descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The limit the budget was cut from.
    pub limit: u64,
    /// Descriptors kept for everything that is not a capped connection: the store, watch
    /// clients between components, the agent's pod pipes, upstream DNS sockets, logs.
    pub reserve: u64,
    /// Concurrent API server connections (one descriptor each).
    pub apiserver: usize,
    /// Concurrent DNS-over-TCP connections (one descriptor each).
    pub dns_tcp: usize,
    /// Concurrent proxied connections or UDP flows (two descriptors per TCP connection).
    pub proxy: usize,
}

/// The smallest cap a present component gets, however low the limit.
pub const MIN_CAP: usize = 16;

const W_APISERVER: u64 = 2;
const W_DNS: u64 = 1;
const W_PROXY: u64 = 5;

/// Splits `limit` descriptors: a reserve of 128 + limit/16, the rest by weight between the
/// components present (API server 2, DNS 1, proxy 5; the proxy's share is halved into
/// connections since each holds a client and a backend socket). Absent components get 0.
pub fn plan(limit: u64, parts: Parts) -> Budget {
    let reserve = (128 + limit / 16).min(limit);
    let avail = limit - reserve;
    let total = u64::from(parts.apiserver) * W_APISERVER
        + u64::from(parts.dns) * W_DNS
        + u64::from(parts.proxy) * W_PROXY;
    let share = |present: bool, w: u64, per_conn: u64| -> usize {
        if !present || total == 0 {
            return 0;
        }
        let fds = avail.saturating_mul(w) / total;
        usize::try_from(fds / per_conn)
            .unwrap_or(usize::MAX)
            .max(MIN_CAP)
    };
    Budget {
        limit,
        reserve,
        apiserver: share(parts.apiserver, W_APISERVER, 1),
        dns_tcp: share(parts.dns, W_DNS, 1),
        proxy: share(parts.proxy, W_PROXY, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wanted() {
        assert_eq!(wanted_soft(None, Some(524_288), 1 << 20), 524_288);
        assert_eq!(wanted_soft(None, None, 1 << 20), 1 << 20);
        assert_eq!(wanted_soft(Some(1024), Some(524_288), 1 << 20), 1024);
        assert_eq!(wanted_soft(Some(1 << 30), Some(4096), 1 << 20), 4096);
        assert_eq!(wanted_soft(Some(0), Some(4096), 1 << 20), 1);
    }

    #[test]
    fn plans() {
        for (limit, parts, want) in [
            (1024, Parts::ALL, (192, 208, 104, 260)),
            (20_000, Parts::ALL, (1378, 4655, 2327, 5819)),
            (
                1024,
                Parts {
                    proxy: true,
                    ..Parts::default()
                },
                (192, 0, 0, 416),
            ),
            (
                1024,
                Parts {
                    dns: true,
                    ..Parts::default()
                },
                (192, 0, 832, 0),
            ),
            // Too small for anything: every present part still gets the minimum.
            (100, Parts::ALL, (100, MIN_CAP, MIN_CAP, MIN_CAP)),
        ] {
            let b = plan(limit, parts);
            assert_eq!(
                (b.reserve, b.apiserver, b.dns_tcp, b.proxy),
                (want.0, want.1, want.2, want.3),
                "{limit} {parts:?}"
            );
        }
    }

    proptest! {
        /// Above a few hundred descriptors the caps never add up to more than the limit.
        #[test]
        fn fits(limit in 600u64..(1 << 24), a: bool, d: bool, p: bool) {
            let b = plan(limit, Parts { apiserver: a, dns: d, proxy: p });
            let used = b.reserve + b.apiserver as u64 + b.dns_tcp as u64 + 2 * b.proxy as u64;
            prop_assert!(used <= limit, "{b:?}");
            prop_assert_eq!(b.apiserver > 0, a);
            prop_assert_eq!(b.dns_tcp > 0, d);
            prop_assert_eq!(b.proxy > 0, p);
        }
    }

    #[test]
    fn raise_and_restore() {
        // Setting the soft limit to its current value always works (no privilege needed).
        let now = current();
        let r = raise_nofile(Some(now.soft)).unwrap();
        assert_eq!(r.soft, now.soft);
        assert_eq!(current().soft, now.soft);
    }
}

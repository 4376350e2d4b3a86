//! Why the redb backend cannot write, and when it may try again: the decisions are pure
//! functions here (table tested); the writer thread does the I/O (`statvfs`, `stat`).
//!
//! Like etcd's `NOSPACE` alarm, a fault refuses every write with a message that names the cause
//! ([`StoreError::WritesRefused`]) while reads go on; unlike the alarm it clears by itself: the
//! writer probes the data directory every second (and before each write) and resumes when the
//! cause is gone.

use std::io;
use std::path::Path;

use crate::StoreError;

/// What stops the store from writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// ENOSPC / EDQUOT, or less free space than a write needs.
    NoSpace,
    /// EROFS: the file system was (re)mounted read-only.
    ReadOnly,
    /// EACCES / EPERM.
    Denied,
    /// The database file is no longer at its path (its directory removed, unmounted, replaced).
    Missing,
    /// Any other I/O error (EIO, ...).
    Io,
}

/// The fault an I/O error stands for.
pub(crate) fn classify(e: &io::Error) -> FaultKind {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    const EROFS: i32 = 30;
    const EACCES: i32 = 13;
    const EPERM: i32 = 1;
    const ENOENT: i32 = 2;
    match e.raw_os_error() {
        Some(ENOSPC | EDQUOT) => FaultKind::NoSpace,
        Some(EROFS) => FaultKind::ReadOnly,
        Some(EACCES | EPERM) => FaultKind::Denied,
        Some(ENOENT) => FaultKind::Missing,
        _ => match e.kind() {
            io::ErrorKind::StorageFull => FaultKind::NoSpace,
            io::ErrorKind::ReadOnlyFilesystem => FaultKind::ReadOnly,
            io::ErrorKind::PermissionDenied => FaultKind::Denied,
            io::ErrorKind::NotFound => FaultKind::Missing,
            _ => FaultKind::Io,
        },
    }
}

/// What the writer saw of its data directory just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirState {
    /// Bytes available to the store's user (`f_bavail * f_frsize`).
    pub(crate) free: u64,
    pub(crate) read_only: bool,
    /// The database file at its path is the one the store has open (same device and inode).
    pub(crate) same_file: bool,
}

/// Whether a write needing `needed` bytes may go ahead (pure).
pub(crate) fn check(state: &DirState, needed: u64) -> Option<FaultKind> {
    if !state.same_file {
        Some(FaultKind::Missing)
    } else if state.read_only {
        Some(FaultKind::ReadOnly)
    } else if state.free < needed {
        Some(FaultKind::NoSpace)
    } else {
        None
    }
}

/// The free space a batch of `batch_bytes` needs when `pending` bytes of write-ahead log are not
/// yet in a durable redb commit: the log record, the redb pages of the batch (its value in `kv`
/// and its event in `log`, twice over for copy-on-write) and of the pending writes, and a
/// reserve so that a checkpoint and a clean shutdown can still write.
pub(crate) fn needed(batch_bytes: u64, pending: u64, reserve: u64) -> u64 {
    reserve
        .saturating_add(batch_bytes.saturating_mul(5))
        .saturating_add(pending.saturating_mul(2))
}

/// The error every refused write gets (upstream-like wording, naming the cause).
pub(crate) fn refused(kind: FaultKind, dir: &Path, detail: &str) -> StoreError {
    let dir = dir.display();
    let msg = match kind {
        FaultKind::NoSpace => {
            format!("store: no space left on device ({dir}): writes refused until space is freed")
        }
        FaultKind::ReadOnly => format!(
            "store: read-only file system ({dir}): writes refused until the data directory is writable again"
        ),
        FaultKind::Denied => format!(
            "store: permission denied ({dir}): writes refused until the data directory is writable again"
        ),
        FaultKind::Missing => format!(
            "store: database file missing from {dir} (removed or replaced): writes refused until it is back; \
             the store never starts over empty on its own (restart ferry to open what is there now)"
        ),
        FaultKind::Io => {
            format!("store: I/O error ({dir}): {detail}: writes refused until the store recovers")
        }
    };
    StoreError::WritesRefused(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_errors() {
        let cases = [
            (28, FaultKind::NoSpace),
            (122, FaultKind::NoSpace),
            (30, FaultKind::ReadOnly),
            (13, FaultKind::Denied),
            (1, FaultKind::Denied),
            (2, FaultKind::Missing),
            (5, FaultKind::Io),
        ];
        for (errno, want) in cases {
            assert_eq!(
                classify(&io::Error::from_raw_os_error(errno)),
                want,
                "{errno}"
            );
        }
        assert_eq!(classify(&io::Error::other("something else")), FaultKind::Io);
    }

    #[test]
    fn check_decisions() {
        let ok = DirState {
            free: 100,
            read_only: false,
            same_file: true,
        };
        // (state, needed, fault)
        let cases = [
            (ok, 100, None),
            (ok, 101, Some(FaultKind::NoSpace)),
            (
                DirState {
                    read_only: true,
                    ..ok
                },
                1,
                Some(FaultKind::ReadOnly),
            ),
            // A missing file wins: nothing else about the directory matters then.
            (
                DirState {
                    same_file: false,
                    read_only: true,
                    free: 0,
                },
                1,
                Some(FaultKind::Missing),
            ),
        ];
        for (state, need, want) in cases {
            assert_eq!(check(&state, need), want, "{state:?} {need}");
        }
    }

    #[test]
    fn needed_grows_with_batch_and_pending_log() {
        assert_eq!(needed(0, 0, 10), 10);
        assert_eq!(needed(1, 0, 10), 15);
        assert_eq!(needed(1, 3, 10), 21);
        assert_eq!(needed(u64::MAX, 1, 1), u64::MAX);
    }

    #[test]
    fn messages_name_the_cause() {
        let dir = Path::new("/data");
        let text = |k| refused(k, dir, "EIO").to_string();
        assert_eq!(
            text(FaultKind::NoSpace),
            "store: no space left on device (/data): writes refused until space is freed"
        );
        assert!(text(FaultKind::ReadOnly).starts_with("store: read-only file system (/data)"));
        assert!(text(FaultKind::Denied).starts_with("store: permission denied (/data)"));
        assert!(text(FaultKind::Missing).contains("never starts over empty"));
        assert!(text(FaultKind::Io).contains("EIO"));
    }
}

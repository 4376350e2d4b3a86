//! The embedded backend: a [`Store`] on one [`redb`] file.
//!
//! # Layout
//!
//! * `kv`: key -> `create_revision | mod_revision | value` (the current state).
//! * `log`: revision -> event (encoded by the private `codec` module), including the previous value of updates
//!   and deletes. `watch` replays it and `range` at an old revision undoes it.
//! * `meta`: `"revision"` (last written revision) and `"compacted"` (log entries at or below it
//!   are gone).
//!
//! # Writes: group commit
//!
//! Every write goes over a channel to one writer thread. The writer takes everything queued (up
//! to [`RedbOptions::max_batch`]), applies the requests in order in one write transaction (each
//! request succeeds or fails on its own; failures use no revision), makes the batch durable,
//! commits it, publishes the batch of events to watchers, and only then answers the callers. A
//! write is therefore acknowledged only once it is on disk, and many concurrent writers share
//! one sync.
//!
//! Durable how: by default ([`RedbOptions::write_ahead_log`]) the batch's log entries are
//! appended to a write-ahead log beside the database (`<file>.wal`) and synced — one sequential
//! write — and then the redb transaction is committed without durability; every
//! [`RedbOptions::checkpoint_bytes`] of log, a durable redb commit persists everything and the
//! log starts over. Opening the store replays the log entries that continue the revision redb
//! holds durably (see the private `wal` module). Compactions are always durable redb commits.
//! Without the log, every batch is a redb commit with immediate durability, which writes each
//! touched B-tree page and syncs the file: several times the cost of one append.
//!
//! # Faults: a full disk, a read-only file system, a vanished data directory
//!
//! Before each batch the writer looks at the data directory (`statvfs`, and whether the
//! database file at its path is still the one it has open). A batch is refused, before
//! anything is written, when the file system is read-only, the file is gone or replaced, or
//! the free space is below [`RedbOptions::reserve_bytes`] plus room for the batch and for a
//! checkpoint of the pending log. Refused writes get [`StoreError::WritesRefused`] naming the
//! cause (`store: no space left on device (<dir>): writes refused until space is freed`, as
//! etcd answers `mvcc: database space exceeded`); they change nothing: no revision, no event.
//! An I/O error of the log or of redb itself (another process filled the disk between the
//! check and the write) refuses the batch the same way; the log's end does not move (the
//! next record overwrites the failed one), and a record already synced for a batch that redb
//! then failed to commit is blanked.
//!
//! While faulted the writer probes every second (and before each write) and resumes by itself
//! when the cause is gone. redb poisons its database after an I/O error ("Previous I/O error
//! occurred"), so then the writer first re-opens it in place behind the same handle: it opens
//! the file again, replays the log up to the last *acknowledged* revision only, makes that
//! durable and starts a new log. The revision does not move, so watch streams go on; a watch
//! replaying history at the moment of the re-open, and reads while the database is closed or
//! poisoned, get [`StoreError::Unavailable`] (the API server's watch cache resumes). A vanished
//! data directory is never re-created: writes resume only when the same file is back at its
//! path (moved back, re-mounted); anything else needs a restart, which opens what is there
//! (so an empty store never silently replaces lost data while this process runs).
//!
//! # Reads
//!
//! Reads use redb read transactions (snapshots) directly, without going through the writer.
//! `range` at `revision == 0` (or the current revision) scans `kv`; at an older, not compacted
//! revision it scans `kv` and the log entries after that revision, taking for every key changed
//! since then the value it had before its first later change. That costs time proportional to
//! the number of writes since the revision asked for.
//!
//! # Watch
//!
//! A watch subscribes to the live broadcast *first*, then notes the current revision `S`,
//! replays the log in `(after, S]` in chunks, and then passes on live events with revision
//! `> S`, so there is neither a gap nor a duplicate between replay and live phases. A watcher
//! that falls more than [`RedbOptions::watch_buffer`] batches behind gets
//! [`StoreError::WatchLagged`] as its last item.
//!
//! # Compaction
//!
//! `compact(rev)` deletes the log entries at or below `rev` and persists `rev` as the compacted
//! revision. Afterwards `watch(prefix, after)` needs `after >= rev` and `range` at a revision
//! needs `revision >= rev`; older ones get [`StoreError::Compacted`]. Compacting at or below
//! the compacted revision is a no-op, above the current revision is
//! [`StoreError::FutureRevision`]. (etcd also accepts a watch from `after == rev - 1`; callers
//! should not rely on that edge.) [`crate::spawn_compactor`] runs it periodically.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::codec::{decode_event, decode_kv, encode_event, encode_kv, event_key};
use crate::fault::{self, DirState, FaultKind};
use crate::wal::{self, LogFile, RecordBuilder, Wal};
use crate::{
    Event, KeyValue, RangeOptions, RangeResult, Result, Revision, Store, StoreError, WatchStream,
};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const LOG: TableDefinition<i64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";

/// The file name used when [`RedbStore::open`] is given a directory.
pub const DEFAULT_FILE_NAME: &str = "ferry.redb";

/// Log entries read per replay step of a watch.
const REPLAY_CHUNK: usize = 1024;

/// Tuning knobs for [`RedbStore::open_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedbOptions {
    /// The most write requests applied in one transaction (one fsync).
    pub max_batch: usize,
    /// How many requests may wait for the writer before callers wait to enqueue.
    pub queue: usize,
    /// How many committed batches a watcher may fall behind before it is cancelled with
    /// [`StoreError::WatchLagged`].
    pub watch_buffer: usize,
    /// redb page cache size in bytes (`None` = redb's default).
    pub cache_size: Option<usize>,
    /// Make each batch durable by appending it to a write-ahead log (one sequential write and
    /// one sync) and commit it to redb without durability, with a durable redb commit every
    /// [`RedbOptions::checkpoint_bytes`]. Off: every batch is a durable redb commit. Either way
    /// a write is acknowledged only once it is durable. See [the module docs](self).
    pub write_ahead_log: bool,
    /// How many bytes of write-ahead log may accumulate before a checkpoint (a durable redb
    /// commit, after which the log starts over). Bounds the work of recovery after a crash.
    pub checkpoint_bytes: u64,
    /// Free space the store keeps on its file system: a write that would leave less than this
    /// (plus room for itself and for a checkpoint) is refused with
    /// [`StoreError::WritesRefused`] ("no space left on device") before anything is written,
    /// so that redb never runs out of space in the middle of a commit.
    pub reserve_bytes: u64,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            max_batch: 1024,
            queue: 8192,
            watch_buffer: 4096,
            cache_size: None,
            write_ahead_log: true,
            checkpoint_bytes: 8 << 20,
            reserve_bytes: 1 << 20,
        }
    }
}

/// One committed write transaction's events, shared by all watchers.
type Batch = Arc<Vec<Event>>;

struct Shared {
    /// The database; `None` while the writer re-opens it after an I/O error.
    db: RwLock<Option<Arc<Database>>>,
    /// The last committed revision (updated after the commit, before watchers are told).
    revision: AtomicI64,
    compacted: AtomicI64,
    /// Why writes are refused right now (see [`Store::write_fault`]).
    fault: Mutex<Option<StoreError>>,
}

impl Shared {
    fn db(&self) -> Result<Arc<Database>> {
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Unavailable("store is re-opening its database".into()))
    }
}

/// A [`Store`] on a redb file. Cheap to share behind an `Arc`; dropping the last handle stops
/// the writer thread once queued writes are done.
pub struct RedbStore {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Msg>,
    events: broadcast::Sender<Batch>,
    path: PathBuf,
    /// Fires when the writer thread has stopped and released its database handle.
    stopped: oneshot::Receiver<()>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .field("revision", &self.shared.revision.load(Ordering::Acquire))
            .field("compacted", &self.shared.compacted.load(Ordering::Acquire))
            .finish()
    }
}

enum Op {
    Create {
        key: String,
        value: Bytes,
    },
    Update {
        key: String,
        value: Bytes,
        expected: Revision,
    },
    Delete {
        key: String,
        expected: Option<Revision>,
    },
    Compact {
        revision: Revision,
    },
}

enum Reply {
    Kv(KeyValue),
    Deleted(KeyValue, Revision),
    Compacted,
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Reply>>,
}

/// What the writer thread is asked to do, in order.
enum Msg {
    Write(Request),
    /// Finish the writes queued before, make everything durable in redb, retire the log and
    /// refuse later writes.
    Shutdown(oneshot::Sender<Result<()>>),
}

/// Wraps the write-ahead log's file (see [`RedbStore::open_inner`]); applied again to the log a
/// re-open creates.
pub(crate) type WrapLogFile = Arc<dyn Fn(Box<dyn LogFile>) -> Box<dyn LogFile> + Send + Sync>;

fn internal(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Internal(e.into().to_string())
}

impl RedbStore {
    /// Opens (creating if needed) the store at `path`, with default options. If `path` is an
    /// existing directory, the file [`DEFAULT_FILE_NAME`] inside it is used; otherwise `path` is
    /// the database file and missing parent directories are created. The file is `0600` and new
    /// directories `0700` (see [`crate::private_fs`]); a looser existing file is tightened.
    ///
    /// Opening needs no Tokio runtime (the writer is a plain thread), but `range` and `watch`
    /// use `tokio::task::spawn_blocking` and so must run inside one. A file can be open only
    /// once at a time (see [`RedbStore::close`]).
    pub fn open(path: &Path) -> Result<RedbStore> {
        Self::open_with(path, RedbOptions::default())
    }

    /// [`RedbStore::open`] with explicit options.
    pub fn open_with(path: &Path, options: RedbOptions) -> Result<RedbStore> {
        Self::open_inner(path, options, None, true)
    }

    /// [`RedbStore::open_with`], the write-ahead log writing through `wrap(file)` if given
    /// (tests put a file that fails on demand there).
    pub(crate) fn open_inner(
        path: &Path,
        options: RedbOptions,
        wrap: Option<WrapLogFile>,
        space_guard: bool,
    ) -> Result<RedbStore> {
        let file = if path.is_dir() {
            path.join(DEFAULT_FILE_NAME)
        } else {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
                && !parent.exists()
            {
                crate::private_fs::ensure_private_dir(parent).map_err(|e| {
                    StoreError::Unavailable(format!("creating {}: {e}", parent.display()))
                })?;
            }
            path.to_path_buf()
        };
        // The store holds every Secret: only its owner may read it. Created `0600` before redb
        // opens it (so no umask widens it), and tightened if an older file is looser.
        crate::private_fs::ensure_private_file(&file)
            .map_err(|e| StoreError::Unavailable(format!("opening {}: {e}", file.display())))?;
        let (db, revision, compacted) = open_db(&file, options.cache_size)?;
        // Writes acknowledged through the write-ahead log but not yet in a durable redb commit.
        let wal_path = Wal::path_for(&file);
        let revision = recover(&db, &wal_path, revision, None)?;
        let identity = file_identity(&file)
            .map_err(|e| StoreError::Unavailable(format!("opening {}: {e}", file.display())))?;
        let wal = if options.write_ahead_log {
            let wal = Wal::open(&wal_path).map_err(|e| {
                StoreError::Unavailable(format!("opening {}: {e}", wal_path.display()))
            })?;
            Some(match &wrap {
                Some(wrap) => wal.wrap_file(|f| wrap(f)),
                None => wal,
            })
        } else {
            match std::fs::remove_file(&wal_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "removing {}: {e}",
                        wal_path.display()
                    )));
                }
            }
            None
        };

        let shared = Arc::new(Shared {
            db: RwLock::new(Some(Arc::new(db))),
            revision: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            fault: Mutex::new(None),
        });
        let (writes, rx) = mpsc::channel(options.queue.max(1));
        let (events, _) = broadcast::channel(options.watch_buffer.max(1));
        let (stopped_tx, stopped) = oneshot::channel();
        let writer = Writer {
            shared: shared.clone(),
            events: events.clone(),
            max_batch: options.max_batch.max(1),
            wal,
            checkpoint_bytes: options.checkpoint_bytes,
            stopped: None,
            shut_down: false,
            revision,
            compacted,
            dir: file
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            file: file.clone(),
            identity,
            cache_size: options.cache_size,
            write_ahead_log: options.write_ahead_log,
            wrap,
            reserve: if space_guard {
                Some(options.reserve_bytes)
            } else {
                None
            },
            fault: None,
            needs_reopen: false,
            refused_need: 0,
            last_probe: Instant::now(),
        };
        std::thread::Builder::new()
            .name("ferry-store-writer".into())
            .spawn(move || {
                writer.run(rx);
                let _ = stopped_tx.send(());
            })
            .map_err(|e| StoreError::Internal(format!("spawning the writer thread: {e}")))?;
        tracing::debug!(file = %file.display(), revision, compacted, "opened redb store");
        Ok(RedbStore {
            shared,
            writes,
            events,
            path: file,
            stopped,
        })
    }

    /// Finishes the queued writes and closes the database, leaving everything in the database
    /// file (as [`Store::shutdown`] does). The file can be opened again once this returns and
    /// every watch stream of this store has been dropped.
    pub async fn close(self) {
        let RedbStore {
            shared,
            writes,
            events,
            stopped,
            ..
        } = self;
        drop((shared, writes, events));
        let _ = stopped.await;
    }

    /// The database file in use.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn submit(&self, op: Op) -> Result<Reply> {
        let (reply, rx) = oneshot::channel();
        self.writes
            .send(Msg::Write(Request { op, reply }))
            .await
            .map_err(|_| StoreError::Unavailable("store writer stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("store writer stopped".into()))?
    }
}

fn read_meta(meta: &impl ReadableTable<&'static str, i64>, name: &str) -> Result<i64> {
    Ok(meta.get(name).map_err(internal)?.map_or(0, |g| g.value()))
}

fn unexpected_reply() -> StoreError {
    StoreError::Internal("unexpected reply from the store writer".into())
}

/// The single writer: owns the revision counter and applies queued requests in batches.
struct Writer {
    shared: Arc<Shared>,
    events: broadcast::Sender<Batch>,
    max_batch: usize,
    /// The write-ahead log (`None`: every batch is a durable redb commit).
    wal: Option<Wal>,
    checkpoint_bytes: u64,
    /// Set when writing can no longer go on safely, or after a shutdown: every later write
    /// fails with it.
    stopped: Option<String>,
    /// A shutdown completed (everything durable in redb, the log retired).
    shut_down: bool,
    /// Last committed revision and compacted revision.
    revision: Revision,
    compacted: Revision,
    /// The database file, its directory and its identity (device, inode) when opened.
    file: PathBuf,
    dir: PathBuf,
    identity: (u64, u64),
    cache_size: Option<usize>,
    write_ahead_log: bool,
    wrap: Option<WrapLogFile>,
    /// [`RedbOptions::reserve_bytes`]; `None`: no free-space check before writes (tests that
    /// let redb itself run out of space).
    reserve: Option<u64>,
    /// Why writes are refused until a probe finds the cause gone.
    fault: Option<(FaultKind, StoreError)>,
    /// redb failed an I/O (and poisons itself after one): the database and the log must be
    /// opened again before the next write.
    needs_reopen: bool,
    /// The free space the last batch refused for want of room needed: the fault stays until
    /// that much is free, so readiness does not flap between the probe's smaller need and the
    /// refused write's.
    refused_need: u64,
    last_probe: Instant,
}

/// How often a faulted writer checks whether it can write again.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often a faulted writer looks for queued writes between probes.
const FAULTED_POLL: Duration = Duration::from_millis(20);

/// The result of applying one batch in a (not yet committed) transaction.
struct Applied {
    outcomes: Vec<Result<Reply>>,
    events: Vec<Event>,
    revision: Revision,
    compacted: Revision,
    /// The batch's write-ahead log record (its log entries).
    record: RecordBuilder,
}

/// Why a batch failed as a whole.
enum BatchError {
    /// Before anything of it reached a file: the batch is refused, the store is unchanged.
    Store(StoreError),
    /// An I/O error of the log or of redb: the store refuses writes until a probe succeeds.
    Io(FaultKind, String, bool),
}

impl From<StoreError> for BatchError {
    fn from(e: StoreError) -> Self {
        BatchError::Store(e)
    }
}

/// The bytes a request adds to the files (roughly: its key and value).
fn op_bytes(op: &Op) -> u64 {
    match op {
        Op::Create { key, value } | Op::Update { key, value, .. } => {
            (key.len() + value.len()) as u64
        }
        Op::Delete { key, .. } => key.len() as u64,
        Op::Compact { .. } => 0,
    }
}

fn file_identity(file: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file)?;
    Ok((m.dev(), m.ino()))
}

impl Writer {
    /// Runs until every sender is gone; consumes the writer so that its database handle is
    /// released when this returns.
    fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            let first = if self.fault.is_some() {
                // Faulted: probe every second so that writes (and readiness) come back by
                // themselves once the cause is gone.
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        std::thread::sleep(FAULTED_POLL);
                        if self.last_probe.elapsed() >= PROBE_EVERY {
                            self.probe();
                        }
                        continue;
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                }
            } else {
                match rx.blocking_recv() {
                    Some(m) => m,
                    None => break,
                }
            };
            // The writes queued before a shutdown request are one batch; the shutdown follows.
            let mut shutdown = None;
            match first {
                Msg::Write(r) => batch.push(r),
                Msg::Shutdown(reply) => shutdown = Some(reply),
            }
            while shutdown.is_none() && batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(Msg::Write(r)) => batch.push(r),
                    Ok(Msg::Shutdown(reply)) => shutdown = Some(reply),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit_batch(&mut batch);
                if self.fault.is_none()
                    && self
                        .wal
                        .as_ref()
                        .is_some_and(|w| w.len() >= self.checkpoint_bytes)
                    && let Err(e) = self.checkpoint()
                {
                    tracing::warn!(error = %e, "store checkpoint failed; the write-ahead log keeps the writes");
                    let kind = match e {
                        StoreError::WritesRefused(_) => FaultKind::NoSpace,
                        _ => FaultKind::Io,
                    };
                    self.io_failed(kind, &e.to_string(), true);
                }
            }
            if let Some(reply) = shutdown {
                let _ = reply.send(self.shut_down());
            }
        }
        // A clean stop leaves everything in redb.
        if let Err(e) = self.shut_down() {
            tracing::warn!(error = %e, "store did not stop cleanly");
        }
        tracing::debug!("store writer stopped");
    }

    /// Makes everything durable in redb, retires the log and refuses later writes. Idempotent.
    /// Fails (and keeps the log, which a restart replays) if the durable commit fails or
    /// writing had already stopped on an error.
    fn shut_down(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
        if let Some(reason) = &self.stopped {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        if self.fault.is_some() {
            self.probe();
        }
        if let Some((_, e)) = &self.fault {
            return Err(e.clone());
        }
        self.checkpoint()?;
        if let Some(wal) = self.wal.take() {
            let path = wal.path().to_path_buf();
            // Every record is durable in redb now: a log left behind only costs a read at the
            // next start (nothing in it continues the durable revision).
            if let Err(e) = wal.retire() {
                tracing::warn!(error = %e, wal = %path.display(), "removing the write-ahead log");
            }
        }
        self.shut_down = true;
        self.stopped = Some("store is shut down".into());
        tracing::debug!(revision = self.revision, "store shut down");
        Ok(())
    }

    /// The free space a batch of `bytes` needs with `pending` bytes of log not in redb yet.
    fn need(&self, bytes: u64, pending: u64) -> u64 {
        self.reserve
            .map_or(0, |reserve| fault::needed(bytes, pending, reserve))
    }

    /// What the data directory looks like now.
    fn dir_state(&self) -> std::io::Result<DirState> {
        let vfs = rustix::fs::statvfs(&self.dir).map_err(std::io::Error::from)?;
        let same_file = match file_identity(&self.file) {
            Ok(id) => id == self.identity,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        Ok(DirState {
            free: vfs.f_bavail.saturating_mul(vfs.f_frsize),
            read_only: vfs.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
            same_file,
        })
    }

    /// Records a fault (and logs it when it is new or changes); returns the error refused
    /// writes get.
    fn set_fault(&mut self, kind: FaultKind, detail: &str) -> StoreError {
        let err = fault::refused(kind, &self.dir, detail);
        if self.fault.as_ref().is_none_or(|(k, _)| *k != kind) {
            tracing::error!(error = %err, "store refuses writes");
        }
        self.fault = Some((kind, err.clone()));
        *self.shared.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(err.clone());
        err
    }

    fn clear_fault(&mut self) {
        if self.fault.take().is_some() {
            tracing::info!(dir = %self.dir.display(), "store writes again");
        }
        self.refused_need = 0;
        *self.shared.fault.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Checks whether the store can write again (re-opening the database if an I/O error
    /// poisoned it) and clears the fault if so.
    fn probe(&mut self) {
        self.last_probe = Instant::now();
        if self.fault.is_none() {
            return;
        }
        let pending = self.wal.as_ref().map_or(0, Wal::len);
        match self.dir_state() {
            Err(e) => {
                self.set_fault(fault::classify(&e), &e.to_string());
                return;
            }
            Ok(state) => {
                let need = self.need(0, pending).max(self.refused_need);
                if let Some(kind) = fault::check(&state, need) {
                    self.set_fault(kind, "");
                    return;
                }
            }
        }
        if self.needs_reopen
            && let Err(e) = self.reopen()
        {
            tracing::warn!(error = %e, "re-opening the store failed; trying again");
            let kind = match &self.fault {
                Some((kind, _)) => *kind,
                None => FaultKind::Io,
            };
            self.set_fault(kind, &e.to_string());
            return;
        }
        self.clear_fault();
    }

    /// Refuses a batch of `bytes` that the data directory has no room (or no writable file
    /// system) for, before anything is written.
    fn admit(&mut self, bytes: u64) -> Result<()> {
        if self.fault.is_some() {
            self.probe();
        }
        if let Some((_, e)) = &self.fault {
            return Err(e.clone());
        }
        let pending = self.wal.as_ref().map_or(0, Wal::len);
        let state = self.dir_state();
        let verdict = match state {
            Err(e) => Some((fault::classify(&e), e.to_string())),
            Ok(state) => {
                let mut verdict = fault::check(&state, self.need(bytes, pending));
                if verdict == Some(FaultKind::NoSpace) && pending > 0 {
                    // The pending log needs room in redb at the next checkpoint: take it now,
                    // while there is some, and look again.
                    if let Err(e) = self.checkpoint() {
                        return Err(self.io_failed(FaultKind::NoSpace, &e.to_string(), true));
                    }
                    verdict = match self.dir_state() {
                        Ok(state) => fault::check(&state, self.need(bytes, 0)),
                        Err(e) => Some(fault::classify(&e)),
                    };
                }
                verdict.map(|k| (k, String::new()))
            }
        };
        match verdict {
            Some((kind, detail)) => {
                if kind == FaultKind::NoSpace {
                    self.refused_need = self.need(bytes, 0);
                }
                Err(self.set_fault(kind, &detail))
            }
            None => Ok(()),
        }
    }

    /// An I/O error hit the log or redb: refuse writes until a probe succeeds; `reopen`: redb
    /// (or the log) must be opened again first. The cause named is the directory's state if it
    /// explains the error, else `kind`.
    fn io_failed(&mut self, kind: FaultKind, detail: &str, reopen: bool) -> StoreError {
        self.needs_reopen |= reopen;
        let kind = match self.dir_state() {
            Ok(state) => fault::check(&state, self.need(0, 0)).unwrap_or(kind),
            Err(e) => fault::classify(&e),
        };
        self.set_fault(kind, detail)
    }

    /// Opens the database and the log again in place (after an I/O error poisoned redb):
    /// replays the log's acknowledged writes (never the record of a batch that failed), makes
    /// them durable in redb and starts a new log. The revision does not move, so watchers
    /// keep their streams.
    fn reopen(&mut self) -> Result<()> {
        drop(self.wal.take());
        let old = self
            .shared
            .db
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(old);
        // Fails with "already open" while a reader still holds the old handle: tried again at
        // the next probe.
        let (db, durable, _) = open_db(&self.file, self.cache_size)?;
        let wal_path = Wal::path_for(&self.file);
        let reached = recover(&db, &wal_path, durable, Some(self.revision))?;
        if reached != self.revision {
            // Cannot happen while every acknowledged write is in redb or the log; never go on
            // from a store that lost some.
            let reason = format!(
                "re-opened store holds revision {reached} but {} was acknowledged; restart ferry",
                self.revision
            );
            tracing::error!("{reason}");
            self.stopped = Some(reason.clone());
            *self.shared.db.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(db));
            return Err(StoreError::Unavailable(reason));
        }
        durable_commit(&db)?;
        if self.write_ahead_log {
            // Everything acknowledged is durable in redb now; the old log may still hold the
            // record of a failed batch, which must never be replayed.
            match std::fs::remove_file(&wal_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "removing {}: {e}",
                        wal_path.display()
                    )));
                }
            }
            let mut wal = Wal::open(&wal_path)
                .and_then(|mut w| w.preallocate().map(|()| w))
                .map_err(|e| {
                    StoreError::Unavailable(format!("opening {}: {e}", wal_path.display()))
                })?;
            if let Some(wrap) = &self.wrap {
                wal = wal.wrap_file(|f| wrap(f));
            }
            self.wal = Some(wal);
        }
        *self.shared.db.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(db));
        self.needs_reopen = false;
        tracing::info!(revision = self.revision, file = %self.file.display(), "re-opened the store");
        Ok(())
    }

    fn commit_batch(&mut self, batch: &mut Vec<Request>) {
        if let Some(reason) = &self.stopped {
            for req in batch.drain(..) {
                let _ = req.reply.send(Err(StoreError::Unavailable(reason.clone())));
            }
            return;
        }
        let bytes = batch.iter().map(|r| op_bytes(&r.op)).sum();
        if let Err(e) = self.admit(bytes) {
            for req in batch.drain(..) {
                let _ = req.reply.send(Err(e.clone()));
            }
            return;
        }
        match self.apply(batch) {
            Ok(applied) => {
                self.revision = applied.revision;
                self.compacted = applied.compacted;
                self.shared
                    .revision
                    .store(applied.revision, Ordering::Release);
                self.shared
                    .compacted
                    .store(applied.compacted, Ordering::Release);
                if !applied.events.is_empty() {
                    // No receivers is fine: nobody is watching.
                    let _ = self.events.send(Arc::new(applied.events));
                }
                for (req, outcome) in batch.drain(..).zip(applied.outcomes) {
                    let _ = req.reply.send(outcome);
                }
            }
            Err(e) => {
                let e = match e {
                    // redb failed (an I/O error poisons it): re-open before the next write.
                    BatchError::Store(StoreError::Internal(detail)) => {
                        self.io_failed(FaultKind::Io, &detail, true)
                    }
                    BatchError::Store(e) => e,
                    BatchError::Io(kind, detail, reopen) => self.io_failed(kind, &detail, reopen),
                };
                tracing::error!(error = %e, requests = batch.len(), "store write transaction failed");
                for req in batch.drain(..) {
                    let _ = req.reply.send(Err(e.clone()));
                }
            }
        }
    }

    fn apply(&mut self, batch: &[Request]) -> std::result::Result<Applied, BatchError> {
        let db = self.shared.db()?;
        let mut txn = db.begin_write().map_err(internal)?;
        let mut applied = Applied {
            outcomes: Vec::with_capacity(batch.len()),
            events: Vec::new(),
            revision: self.revision,
            compacted: self.compacted,
            record: RecordBuilder::new(),
        };
        {
            let mut kv = txn.open_table(KV).map_err(internal)?;
            let mut log = txn.open_table(LOG).map_err(internal)?;
            let mut meta = txn.open_table(META).map_err(internal)?;
            for req in batch {
                let outcome = apply_one(&mut kv, &mut log, &mut meta, &mut applied, &req.op)?;
                applied.outcomes.push(outcome);
            }
            if applied.revision != self.revision {
                meta.insert(META_REVISION, applied.revision)
                    .map_err(internal)?;
            }
        }
        if applied.revision == self.revision && applied.compacted == self.compacted {
            // Nothing changed (every request failed its precondition).
            txn.abort().map_err(internal)?;
        } else if self.wal.is_some() && applied.compacted == self.compacted {
            // Durable once the log record is synced; redb gets the batch without a sync. The
            // record is synced before the commit, so no reader sees a write that is not durable.
            set_durability(&mut txn, Durability::None)?;
            let record = std::mem::take(&mut applied.record).finish();
            if let Some(Err(e)) = self.wal.as_mut().map(|wal| wal.append(&record)) {
                // Nothing of the batch is durable or visible: drop it. The log's end has not
                // moved, so its next record overwrites whatever of this one reached the file.
                // An error other than "full"/"read-only" may have left the file in an unknown
                // state: a new log is started before the next write.
                let kind = fault::classify(&e);
                let reopen = kind == FaultKind::Io;
                if let Err(abort) = txn.abort() {
                    return Err(BatchError::Io(kind, format!("{e}; {abort}"), true));
                }
                return Err(BatchError::Io(kind, e.to_string(), reopen));
            }
            if let Err(e) = txn.commit() {
                // The log holds the batch but it was not applied: blank its record (so that a
                // crash does not bring it back) and re-open redb before the next write; the
                // re-open replays the log only up to the last acknowledged revision.
                if let Some(wal) = self.wal.as_mut()
                    && let Err(blank) = wal.blank_last()
                {
                    tracing::warn!(error = %blank, "blanking the failed batch's log record");
                }
                return Err(BatchError::Io(commit_fault(&e), e.to_string(), true));
            }
        } else {
            // No log, or a compaction (which must not be undone by a replay): a durable commit,
            // which also persists every earlier batch, so the log starts over.
            set_durability(&mut txn, Durability::Immediate)?;
            txn.commit()
                .map_err(|e| BatchError::Io(commit_fault(&e), e.to_string(), true))?;
            if let Some(wal) = self.wal.as_mut() {
                wal.restart();
            }
        }
        Ok(applied)
    }

    /// Persists every batch committed without durability (a durable redb commit) and starts the
    /// log over. On failure the log keeps its records (they are still durable there).
    fn checkpoint(&mut self) -> Result<()> {
        let Some(wal) = self.wal.as_mut() else {
            return Ok(());
        };
        if wal.len() == 0 {
            return Ok(());
        }
        durable_commit(&*self.shared.db()?)?;
        wal.restart();
        Ok(())
    }
}

/// The fault a failed redb commit stands for (its I/O error's).
fn commit_fault(e: &redb::CommitError) -> FaultKind {
    match e {
        redb::CommitError::Storage(redb::StorageError::Io(io)) => fault::classify(io),
        _ => FaultKind::Io,
    }
}

/// An empty durable commit: persists every commit made without durability.
fn durable_commit(db: &Database) -> Result<()> {
    let mut txn = db.begin_write().map_err(internal)?;
    set_durability(&mut txn, Durability::Immediate)?;
    txn.commit().map_err(|e| match commit_fault(&e) {
        FaultKind::NoSpace => StoreError::WritesRefused(format!("no space left on device: {e}")),
        _ => internal(e),
    })
}

/// Opens (creating) the database file, creates the tables (so read transactions can always
/// open them) and loads the revision and the compacted revision.
fn open_db(file: &Path, cache_size: Option<usize>) -> Result<(Database, Revision, Revision)> {
    let mut builder = Database::builder();
    if let Some(bytes) = cache_size {
        builder.set_cache_size(bytes);
    }
    let db = builder
        .create(file)
        .map_err(|e| StoreError::Unavailable(format!("opening {}: {e}", file.display())))?;
    let (revision, compacted) = {
        let mut txn = db.begin_write().map_err(internal)?;
        set_durability(&mut txn, Durability::Immediate)?;
        let counters = {
            txn.open_table(KV).map_err(internal)?;
            txn.open_table(LOG).map_err(internal)?;
            let meta = txn.open_table(META).map_err(internal)?;
            (
                read_meta(&meta, META_REVISION)?,
                read_meta(&meta, META_COMPACTED)?,
            )
        };
        txn.commit().map_err(internal)?;
        counters
    };
    Ok((db, revision, compacted))
}
fn set_durability(txn: &mut redb::WriteTransaction, d: Durability) -> Result<()> {
    txn.set_durability(d)
        .map_err(|e| StoreError::Internal(e.to_string()))
}

/// Applies the write-ahead log's entries that continue the durable revision `durable` (up to
/// `upto` if given: the last acknowledged revision on a re-open), in one durable commit;
/// returns the revision reached.
fn recover(
    db: &Database,
    wal_path: &Path,
    durable: Revision,
    upto: Option<Revision>,
) -> Result<Revision> {
    let entries = Wal::read(wal_path)
        .map_err(|e| StoreError::Unavailable(format!("reading {}: {e}", wal_path.display())))?;
    let mut redo = wal::redo(entries, durable);
    if let Some(upto) = upto {
        redo.retain(|e| e.revision <= upto);
    }
    let Some(last) = redo.last().map(|e| e.revision) else {
        return Ok(durable);
    };
    let mut txn = db.begin_write().map_err(internal)?;
    set_durability(&mut txn, Durability::Immediate)?;
    {
        let mut kv = txn.open_table(KV).map_err(internal)?;
        let mut log = txn.open_table(LOG).map_err(internal)?;
        let mut meta = txn.open_table(META).map_err(internal)?;
        for entry in &redo {
            match decode_event(entry.revision, &entry.raw)? {
                Event::Put { kv: new, .. } => {
                    let value = encode_kv(new.create_revision, new.mod_revision, &new.value);
                    kv.insert(new.key.as_str(), value.as_slice())
                        .map_err(internal)?;
                }
                Event::Delete { prev, .. } => {
                    kv.remove(prev.key.as_str()).map_err(internal)?;
                }
            }
            log.insert(entry.revision, entry.raw.as_slice())
                .map_err(internal)?;
        }
        meta.insert(META_REVISION, last).map_err(internal)?;
    }
    txn.commit().map_err(internal)?;
    tracing::info!(
        writes = redo.len(),
        revision = last,
        "recovered writes from the write-ahead log"
    );
    Ok(last)
}

type KvTable<'t> = redb::Table<'t, &'static str, &'static [u8]>;
type LogTable<'t> = redb::Table<'t, i64, &'static [u8]>;
type MetaTable<'t> = redb::Table<'t, &'static str, i64>;

fn current(kv: &KvTable<'_>, key: &str) -> Result<Option<KeyValue>> {
    match kv.get(key).map_err(internal)? {
        Some(raw) => Ok(Some(decode_kv(key, raw.value())?)),
        None => Ok(None),
    }
}

/// Applies one request. `Err` means the transaction is unusable; a failed precondition is an
/// `Ok(Err(..))` outcome.
fn apply_one(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    meta: &mut MetaTable<'_>,
    applied: &mut Applied,
    op: &Op,
) -> Result<Result<Reply>> {
    let put = |kv: &mut KvTable<'_>,
               log: &mut LogTable<'_>,
               applied: &mut Applied,
               key: &str,
               value: &Bytes,
               prev: Option<KeyValue>|
     -> Result<Result<Reply>> {
        let revision = applied.revision + 1;
        let new = KeyValue {
            key: key.to_owned(),
            value: value.clone(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
        };
        kv.insert(
            key,
            encode_kv(new.create_revision, revision, value).as_slice(),
        )
        .map_err(internal)?;
        let event = Event::Put {
            kv: new.clone(),
            prev,
        };
        let raw = encode_event(&event);
        log.insert(revision, raw.as_slice()).map_err(internal)?;
        applied.record.push(revision, &raw);
        applied.events.push(event);
        applied.revision = revision;
        Ok(Ok(Reply::Kv(new)))
    };
    match op {
        Op::Create { key, value } => match current(kv, key)? {
            Some(_) => Ok(Err(StoreError::AlreadyExists)),
            None => put(kv, log, applied, key, value, None),
        },
        Op::Update {
            key,
            value,
            expected,
        } => match current(kv, key)? {
            None => Ok(Err(StoreError::NotFound)),
            Some(cur) if cur.mod_revision != *expected => Ok(Err(StoreError::Conflict {
                current: Box::new(cur),
            })),
            Some(cur) => put(kv, log, applied, key, value, Some(cur)),
        },
        Op::Delete { key, expected } => match current(kv, key)? {
            None => Ok(Err(StoreError::NotFound)),
            Some(cur) if expected.is_some_and(|e| e != cur.mod_revision) => {
                Ok(Err(StoreError::Conflict {
                    current: Box::new(cur),
                }))
            }
            Some(cur) => {
                let revision = applied.revision + 1;
                kv.remove(key.as_str()).map_err(internal)?;
                let event = Event::Delete {
                    prev: cur.clone(),
                    revision,
                };
                let raw = encode_event(&event);
                log.insert(revision, raw.as_slice()).map_err(internal)?;
                applied.record.push(revision, &raw);
                applied.events.push(event);
                applied.revision = revision;
                Ok(Ok(Reply::Deleted(cur, revision)))
            }
        },
        Op::Compact { revision } => {
            if *revision > applied.revision {
                return Ok(Err(StoreError::FutureRevision(*revision)));
            }
            if *revision <= applied.compacted {
                return Ok(Ok(Reply::Compacted));
            }
            log.retain_in(..=*revision, |_, _| false)
                .map_err(internal)?;
            meta.insert(META_COMPACTED, *revision).map_err(internal)?;
            applied.compacted = *revision;
            Ok(Ok(Reply::Compacted))
        }
    }
}

/// The state of a key at an old revision, from the first log event after that revision.
fn state_before(event: Event) -> Option<KeyValue> {
    match event {
        Event::Put { prev, .. } => prev,
        Event::Delete { prev, .. } => Some(prev),
    }
}

fn range_blocking(shared: &Shared, prefix: &str, opts: &RangeOptions) -> Result<RangeResult> {
    let txn = shared.db()?.begin_read().map_err(internal)?;
    let meta = txn.open_table(META).map_err(internal)?;
    let current_rev = read_meta(&meta, META_REVISION)?;
    let compacted = read_meta(&meta, META_COMPACTED)?;
    let at = if opts.revision <= 0 {
        current_rev
    } else {
        opts.revision
    };
    if at > current_rev {
        return Err(StoreError::FutureRevision(at));
    }
    if at < compacted {
        return Err(StoreError::Compacted {
            requested: at,
            compacted,
        });
    }
    let lower = match &opts.start_after {
        Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
        _ => Bound::Included(prefix),
    };
    let limit = if opts.limit == 0 {
        usize::MAX
    } else {
        opts.limit
    };
    let kv = txn.open_table(KV).map_err(internal)?;
    let mut current_iter = kv
        .range::<&str>((lower, Bound::Unbounded))
        .map_err(internal)?
        .map(|entry| -> Result<KeyValue> {
            let (k, v) = entry.map_err(internal)?;
            decode_kv(k.value(), v.value())
        })
        .take_while(|r| r.as_ref().map_or(true, |kv| kv.key.starts_with(prefix)));

    let mut kvs = Vec::new();
    let mut more = false;
    if at == current_rev {
        for item in current_iter {
            let item = item?;
            if kvs.len() == limit {
                more = true;
                break;
            }
            kvs.push(item);
        }
        return Ok(RangeResult {
            kvs,
            revision: at,
            more,
        });
    }

    // Undo the writes after `at`: for each key changed since, its state before the first change.
    let log = txn.open_table(LOG).map_err(internal)?;
    let mut undone: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
    for entry in log.range((at + 1)..).map_err(internal)? {
        let (rev, raw) = entry.map_err(internal)?;
        let raw = raw.value();
        let key = event_key(raw)?;
        let in_range =
            key.starts_with(prefix) && opts.start_after.as_deref().is_none_or(|after| key > after);
        if in_range && !undone.contains_key(key) {
            let event = decode_event(rev.value(), raw)?;
            undone.insert(key.to_owned(), state_before(event));
        }
    }
    // Merge the current keys not changed since `at` with the undone ones, in key order.
    let mut old = undone.into_values().flatten().peekable();
    let mut now = None;
    loop {
        if now.is_none() {
            now = loop {
                match current_iter.next().transpose()? {
                    Some(kv) if changed_since(&kv, at) => continue,
                    other => break other,
                }
            };
        }
        let next = match (&now, old.peek()) {
            (None, None) => break,
            (Some(_), None) => now.take(),
            (None, Some(_)) => old.next(),
            (Some(n), Some(o)) => {
                if n.key < o.key {
                    now.take()
                } else {
                    old.next()
                }
            }
        };
        let Some(next) = next else { break };
        if kvs.len() == limit {
            more = true;
            break;
        }
        kvs.push(next);
    }
    Ok(RangeResult {
        kvs,
        revision: at,
        more,
    })
}

/// A current key whose last change is after `at` was changed since; its old state (if any) comes
/// from the log instead.
fn changed_since(kv: &KeyValue, at: Revision) -> bool {
    kv.mod_revision > at
}

/// Reads log entries in `(cursor, until]` for keys under `prefix`, at most [`REPLAY_CHUNK`] of
/// them scanned. Returns the matching events and the revision scanned up to.
fn replay_chunk(
    shared: &Shared,
    prefix: &str,
    cursor: Revision,
    until: Revision,
) -> Result<(Vec<Event>, Revision)> {
    let txn = shared.db()?.begin_read().map_err(internal)?;
    let meta = txn.open_table(META).map_err(internal)?;
    let compacted = read_meta(&meta, META_COMPACTED)?;
    if cursor < compacted {
        return Err(StoreError::Compacted {
            requested: cursor,
            compacted,
        });
    }
    let log = txn.open_table(LOG).map_err(internal)?;
    let mut events = Vec::new();
    let mut scanned_to = until;
    for (n, entry) in log
        .range((cursor + 1)..=until)
        .map_err(internal)?
        .enumerate()
    {
        let (rev, raw) = entry.map_err(internal)?;
        let rev = rev.value();
        let raw = raw.value();
        if event_key(raw)?.starts_with(prefix) {
            events.push(decode_event(rev, raw)?);
        }
        if n + 1 == REPLAY_CHUNK {
            scanned_to = rev;
            break;
        }
    }
    Ok((events, scanned_to))
}

struct WatchState {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    live: broadcast::Receiver<Batch>,
    /// Every event at or below this revision has been delivered (or did not match).
    cursor: Revision,
    /// The revision the replay phase reads up to; live events above it follow.
    replay_until: Revision,
    pending: VecDeque<Event>,
    done: bool,
}

impl WatchState {
    async fn next(mut self) -> Option<(Result<Event>, WatchState)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((Ok(event), self));
            }
            if self.done {
                return None;
            }
            if self.cursor < self.replay_until {
                let (shared, prefix) = (self.shared.clone(), self.prefix.clone());
                let (cursor, until) = (self.cursor, self.replay_until);
                let chunk = tokio::task::spawn_blocking(move || {
                    replay_chunk(&shared, &prefix, cursor, until)
                })
                .await
                .map_err(|e| StoreError::Internal(format!("watch replay task: {e}")))
                .and_then(|r| r);
                match chunk {
                    Ok((events, scanned_to)) => {
                        self.pending.extend(events);
                        self.cursor = scanned_to;
                    }
                    Err(e) => {
                        self.done = true;
                        return Some((Err(e), self));
                    }
                }
                continue;
            }
            match self.live.recv().await {
                Ok(batch) => {
                    for event in batch.iter() {
                        if event.revision() > self.cursor && event.key().starts_with(&*self.prefix)
                        {
                            self.pending.push_back(event.clone());
                        }
                    }
                    if let Some(last) = batch.last() {
                        self.cursor = self.cursor.max(last.revision());
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.done = true;
                    return Some((Err(StoreError::WatchLagged), self));
                }
                Err(broadcast::error::RecvError::Closed) => {
                    self.done = true;
                    return Some((Err(StoreError::Unavailable("store closed".into())), self));
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Store for RedbStore {
    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.shared.revision.load(Ordering::Acquire))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let txn = self.shared.db()?.begin_read().map_err(internal)?;
        let kv = txn.open_table(KV).map_err(internal)?;
        match kv.get(key).map_err(internal)? {
            Some(raw) => Ok(Some(decode_kv(key, raw.value())?)),
            None => Ok(None),
        }
    }

    async fn range(&self, prefix: &str, opts: RangeOptions) -> Result<RangeResult> {
        let shared = self.shared.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || range_blocking(&shared, &prefix, &opts))
            .await
            .map_err(|e| StoreError::Internal(format!("range task: {e}")))?
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        crate::check_value_size(&value)?;
        match self
            .submit(Op::Create {
                key: key.to_owned(),
                value,
            })
            .await?
        {
            Reply::Kv(kv) => Ok(kv),
            _ => Err(unexpected_reply()),
        }
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        crate::check_value_size(&value)?;
        let op = Op::Update {
            key: key.to_owned(),
            value,
            expected,
        };
        match self.submit(op).await? {
            Reply::Kv(kv) => Ok(kv),
            _ => Err(unexpected_reply()),
        }
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<(KeyValue, Revision)> {
        match self
            .submit(Op::Delete {
                key: key.to_owned(),
                expected,
            })
            .await?
        {
            Reply::Deleted(kv, revision) => Ok((kv, revision)),
            _ => Err(unexpected_reply()),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        // Subscribe before noting the revision: everything committed later is received live.
        let live = self.events.subscribe();
        let compacted = self.shared.compacted.load(Ordering::Acquire);
        let after = after.max(0);
        if after < compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted,
            });
        }
        let replay_until = self.shared.revision.load(Ordering::Acquire);
        let state = WatchState {
            shared: self.shared.clone(),
            prefix: Arc::from(prefix),
            live,
            cursor: after,
            replay_until,
            pending: VecDeque::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(state, WatchState::next)))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        match self.submit(Op::Compact { revision }).await? {
            Reply::Compacted => Ok(()),
            _ => Err(unexpected_reply()),
        }
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        Ok(self.shared.compacted.load(Ordering::Acquire))
    }

    fn write_fault(&self) -> Option<StoreError> {
        self.shared
            .fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn shutdown(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.writes
            .send(Msg::Shutdown(reply))
            .await
            .map_err(|_| StoreError::Unavailable("store writer stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("store writer stopped".into()))?
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::AtomicU8;

    /// The log file's failure switch.
    const OK: u8 = 0;
    const FAIL_WRITE: u8 = 1;
    const FAIL_SYNC: u8 = 2;

    /// A log file that fails its writes or syncs (ENOSPC / EIO) while the switch says so.
    #[derive(Debug)]
    struct Faulty {
        inner: Box<dyn LogFile>,
        mode: Arc<AtomicU8>,
    }

    impl LogFile for Faulty {
        fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            if self.mode.load(Ordering::Acquire) == FAIL_WRITE {
                return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
            }
            self.inner.write_all_at(buf, offset)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            if self.mode.load(Ordering::Acquire) == FAIL_SYNC {
                return Err(std::io::Error::from_raw_os_error(5)); // EIO
            }
            self.inner.sync_data()
        }
    }

    fn open_faulty(dir: &Path) -> (RedbStore, Arc<AtomicU8>) {
        let mode = Arc::new(AtomicU8::new(OK));
        let m = mode.clone();
        let wrap: WrapLogFile = Arc::new(move |inner| {
            Box::new(Faulty {
                inner,
                mode: m.clone(),
            })
        });
        let store = RedbStore::open_inner(dir, RedbOptions::default(), Some(wrap), true).unwrap();
        (store, mode)
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Opens a copy of the database file alone (what a crash would leave if the log were
    /// lost): the state redb holds durably.
    async fn durable_in_redb(dir: &Path) -> (Revision, Vec<String>) {
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(
            dir.join(DEFAULT_FILE_NAME),
            copy.path().join(DEFAULT_FILE_NAME),
        )
        .unwrap();
        let s = RedbStore::open(copy.path()).unwrap();
        let rev = s.current_revision().await.unwrap();
        let keys = s
            .range("/", RangeOptions::default())
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        s.close().await;
        (rev, keys)
    }

    /// A failed log append (its write fails with ENOSPC, or its sync with EIO): every write of
    /// the batch is refused with an error naming the cause, nothing of it is visible, watched or
    /// counted, reads go on and the fault shows in `write_fault`; once the file takes writes
    /// again the next write succeeds without re-creating the store (after EIO, the store
    /// re-opens its database and starts a new log in place), continuing the revisions without a
    /// gap; the watch sees exactly the acknowledged writes, and after a restart the store holds
    /// exactly them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_log_append_refuses_writes_until_the_file_takes_them() {
        for (name, fault, want) in [
            ("write", FAIL_WRITE, "store: no space left on device ("),
            ("sync", FAIL_SYNC, "store: I/O error ("),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let (store, mode) = open_faulty(dir.path());
            let store = Arc::new(store);
            let a = store.create("/f/a", b("1")).await.unwrap();
            let a2 = store.update("/f/a", b("2"), a.mod_revision).await.unwrap();
            let mut w = store.watch("/f/", a2.mod_revision).await.unwrap();
            assert!(store.write_fault().is_none());

            mode.store(fault, Ordering::Release);
            let failed: Vec<_> = (0..8)
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move { store.create(&format!("/f/lost-{i}"), b("x")).await })
                })
                .collect();
            for t in failed {
                match t.await.unwrap() {
                    Err(StoreError::WritesRefused(msg)) => {
                        assert!(msg.starts_with(want), "{name}: {msg}");
                        assert!(
                            msg.ends_with("writes refused until space is freed")
                                || fault != FAIL_WRITE,
                            "{name}: {msg}"
                        );
                    }
                    other => panic!("{name}: {other:?}"),
                }
            }
            assert_eq!(
                store.current_revision().await.unwrap(),
                a2.mod_revision,
                "{name}"
            );
            assert!(
                matches!(store.write_fault(), Some(StoreError::WritesRefused(m)) if m.starts_with(want)),
                "{name}"
            );
            // Reads go on.
            assert_eq!(store.get("/f/a").await.unwrap(), Some(a2.clone()), "{name}");
            assert_eq!(store.get("/f/lost-0").await.unwrap(), None, "{name}");
            assert_eq!(
                store
                    .range("/f/", RangeOptions::default())
                    .await
                    .unwrap()
                    .kvs,
                vec![a2.clone()],
                "{name}"
            );

            // The file takes writes again: the very next write succeeds.
            mode.store(OK, Ordering::Release);
            let c = store.create("/f/c", b("3")).await.unwrap();
            assert_eq!(c.mod_revision, a2.mod_revision + 1, "{name}");
            assert!(store.write_fault().is_none(), "{name}");
            let d = store.create("/f/d", b("4")).await.unwrap();

            // The watch saw the acknowledged writes only, in order, without a gap.
            let mut watched = Vec::new();
            while watched.len() < 2 {
                let e = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                watched.push((e.key().to_string(), e.revision()));
            }
            assert_eq!(
                watched,
                [
                    ("/f/c".to_string(), c.mod_revision),
                    ("/f/d".to_string(), d.mod_revision)
                ],
                "{name}"
            );

            drop(w);
            Arc::into_inner(store).unwrap().close().await;
            let again = RedbStore::open(dir.path()).unwrap();
            assert_eq!(
                again.current_revision().await.unwrap(),
                d.mod_revision,
                "{name}"
            );
            let keys: Vec<_> = again
                .range("/f/", RangeOptions::default())
                .await
                .unwrap()
                .kvs
                .into_iter()
                .map(|kv| kv.key)
                .collect();
            assert_eq!(keys, ["/f/a", "/f/c", "/f/d"], "{name}");
            again.close().await;
        }
    }

    /// A crash while the failed batch's record is still in the log (the sync failed after the
    /// write reached the file): the store re-opened in place has dropped it, so it never comes
    /// back, even when the process is killed before a clean stop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_batch_never_comes_back_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mode) = open_faulty(dir.path());
        let a = store.create("/h/a", b("1")).await.unwrap();
        mode.store(FAIL_SYNC, Ordering::Release);
        assert!(store.create("/h/lost", b("x")).await.is_err());
        mode.store(OK, Ordering::Release);
        let c = store.create("/h/c", b("3")).await.unwrap();
        assert_eq!(c.mod_revision, a.mod_revision + 1);
        // "Crash": copy the files as they are now, without a clean stop.
        let copy = tempfile::tempdir().unwrap();
        for f in [DEFAULT_FILE_NAME, "ferry.redb.wal"] {
            std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
        }
        store.close().await;
        let again = RedbStore::open(copy.path()).unwrap();
        assert_eq!(again.current_revision().await.unwrap(), c.mod_revision);
        assert_eq!(again.get("/h/lost").await.unwrap(), None);
        assert_eq!(again.get("/h/c").await.unwrap(), Some(c));
        again.close().await;
    }

    /// A small tmpfs under a temp dir (root only), unmounted when dropped.
    struct Tmpfs {
        dir: tempfile::TempDir,
    }

    impl Tmpfs {
        fn mount(size: &str) -> Option<Tmpfs> {
            if !rustix::process::geteuid().is_root() {
                eprintln!("skipped: mounting a tmpfs needs root");
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("skipped: mount -t tmpfs failed");
                return None;
            }
            Some(Tmpfs { dir })
        }
        fn path(&self) -> &Path {
            self.dir.path()
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.dir.path())
                .status();
        }
    }

    /// A real full disk (a 16 MiB tmpfs, half of it a filler file), with and without the free-space check (without it,
    /// redb and the log themselves run into ENOSPC and redb poisons its database): writes fail
    /// with "no space left on device", nothing refused is counted, reads keep working (once the
    /// store has re-opened, for a poisoned redb), and after the test frees space (removes its
    /// filler file) writes succeed again through the same store; every acknowledged write is
    /// there after a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_disk_refuses_writes_and_recovers_in_place() {
        for space_guard in [true, false] {
            let Some(fs) = Tmpfs::mount("16m") else {
                return;
            };
            let data = fs.path().join("data");
            std::fs::create_dir(&data).unwrap();
            let filler = fs.path().join("filler");
            std::fs::write(&filler, vec![1u8; 8 << 20]).unwrap();
            let options = RedbOptions {
                checkpoint_bytes: 2 << 20,
                ..Default::default()
            };
            let store = RedbStore::open_inner(&data, options, None, space_guard).unwrap();
            let value = Bytes::from(vec![7u8; 200 << 10]);
            let mut acked = Vec::new();
            let mut refused = None;
            for i in 0..200 {
                match store.create(&format!("/d/{i:03}"), value.clone()).await {
                    Ok(kv) => acked.push(kv),
                    Err(e) => {
                        refused = Some((i, e));
                        break;
                    }
                }
            }
            let (i, e) = refused.expect("the disk fills up");
            let rev = store.current_revision().await.unwrap();
            let msg = e.to_string();
            assert!(
                msg.starts_with("store: no space left on device (")
                    && msg.ends_with("writes refused until space is freed"),
                "guard {space_guard}: {msg}"
            );
            assert!(!acked.is_empty(), "guard {space_guard}");
            // Refused again, nothing counted.
            assert!(
                store
                    .create(&format!("/d/{i:03}"), value.clone())
                    .await
                    .is_err()
            );
            assert_eq!(store.current_revision().await.unwrap(), rev);
            assert!(store.write_fault().is_some());
            if space_guard {
                // Nothing reached redb: reads go on throughout.
                let last = acked.last().unwrap();
                assert_eq!(store.get(&last.key).await.unwrap().as_ref(), Some(last));
            }

            std::fs::remove_file(&filler).unwrap();
            let freed = Instant::now();
            let kv = store
                .create(&format!("/d/{i:03}"), value.clone())
                .await
                .unwrap_or_else(|e| panic!("guard {space_guard}: {e}"));
            eprintln!(
                "guard {space_guard}: {} writes acknowledged, then refused; first write {:?} after space was freed",
                acked.len(),
                freed.elapsed()
            );
            assert_eq!(kv.mod_revision, rev + 1);
            acked.push(kv);
            assert!(store.write_fault().is_none());
            let listed = store.range("/d/", RangeOptions::default()).await.unwrap();
            assert_eq!(listed.kvs, acked);
            store.close().await;

            let again = RedbStore::open(&data).unwrap();
            let listed = again.range("/d/", RangeOptions::default()).await.unwrap();
            assert_eq!(listed.kvs, acked, "guard {space_guard}");
            again.close().await;
            drop(fs);
        }
    }

    /// The writer's shutdown: idempotent, makes the log's writes durable in redb and removes
    /// the log; with the log off it only refuses later writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_checkpoints_and_removes_the_log() {
        for write_ahead_log in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let wal_path = dir.path().join("ferry.redb.wal");
            let options = RedbOptions {
                write_ahead_log,
                ..Default::default()
            };
            let store = RedbStore::open_with(dir.path(), options).unwrap();
            let mut last = None;
            for i in 0..100 {
                last = Some(store.create(&format!("/s/{i:03}"), b("v")).await.unwrap());
            }
            let last = last.unwrap();
            assert_eq!(wal_path.exists(), write_ahead_log);
            store.shutdown().await.unwrap();
            assert!(!wal_path.exists());
            // redb alone holds everything.
            let (rev, keys) = durable_in_redb(dir.path()).await;
            assert_eq!(rev, last.mod_revision);
            assert_eq!(keys.len(), 100);
            store.shutdown().await.unwrap();
            assert!(matches!(
                store.create("/s/late", b("x")).await,
                Err(StoreError::Unavailable(m)) if m == "store is shut down"
            ));
            store.close().await;
            assert!(!wal_path.exists());
            // Closing (or dropping the last handle) without a shutdown stops cleanly too.
            let store = RedbStore::open_with(dir.path(), RedbOptions::default()).unwrap();
            let more = store.create("/s/more", b("v")).await.unwrap();
            assert!(wal_path.exists());
            store.close().await;
            assert!(!wal_path.exists());
            let (rev, _) = durable_in_redb(dir.path()).await;
            assert_eq!(rev, more.mod_revision);
        }
    }
}

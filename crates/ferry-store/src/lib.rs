//! Ferry's storage layer: a key-value store with etcd's semantics.
//!
//! * One global, monotonically increasing revision. Every successful write (create, update,
//!   delete) gets the next revision; a key's `mod_revision` is the revision of its last write and
//!   `create_revision` the revision that created it.
//! * Reads: `get` one key, `range` over a prefix (ordered by key, with a limit, a key to continue
//!   after, and an optional revision to read at).
//! * Writes: `create` (fails if the key exists), `update` and `delete` guarded by the expected
//!   `mod_revision` (compare-and-swap), a write returns only once it is durable.
//! * `watch` a prefix from a revision: every event with a revision greater than the one given, in
//!   revision order, then live events. Watching from a compacted revision fails with
//!   [`StoreError::Compacted`] ("too old").
//! * `compact` forgets history at or below a revision.
//!
//! Backends: [`redb`](crate::redb_store) (embedded, the default) and
//! [`etcd`](crate::etcd_store) (etcd v3 over gRPC, for several API servers). The conformance suite in
//! [`conformance`] is written against the trait so that every backend runs the same tests.

use std::pin::Pin;

mod codec;
mod compactor;
pub mod conformance;
pub mod etcd_store;
mod fault;
pub mod private_fs;
pub mod redb_store;
mod wal;

pub use compactor::{CompactorHandle, compaction_target, spawn_compactor};
pub use etcd_store::{EtcdOptions, EtcdStore};
pub use redb_store::{RedbOptions, RedbStore};

use bytes::Bytes;
use futures::Stream;

pub type Revision = i64;

/// The largest value a write may store: etcd's default `--max-request-bytes` (1.5 MiB), so
/// that every backend refuses the same writes. Larger values are [`StoreError::TooLarge`].
pub const MAX_VALUE_BYTES: usize = 1_572_864;

/// One stored key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

/// What `range` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    /// The store revision the range was read at.
    pub revision: Revision,
    /// More keys matched than `limit` allowed.
    pub more: bool,
}

/// Options for `range`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeOptions {
    /// At most this many keys (0 = no limit).
    pub limit: usize,
    /// Only keys strictly greater than this one (for paging).
    pub start_after: Option<String>,
    /// Read at this revision (0 = current). A compacted revision gives `Compacted`.
    pub revision: Revision,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A create or an update; `prev` is the value before (None on create).
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// A delete at `revision`; `prev` is the last value the key had.
    Delete { prev: KeyValue, revision: Revision },
}

impl Event {
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }
    pub fn key(&self) -> &str {
        match self {
            Event::Put { kv, .. } => &kv.key,
            Event::Delete { prev, .. } => &prev.key,
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("key already exists")]
    AlreadyExists,
    #[error("key not found")]
    NotFound,
    /// The key's mod revision differs from the expected one; `current` is what is stored now.
    #[error("revision conflict")]
    Conflict { current: Box<KeyValue> },
    /// The revision asked for has been compacted away.
    #[error("required revision {requested} has been compacted (oldest available {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    /// The revision asked for is in the future.
    #[error("required revision {0} is a future revision")]
    FutureRevision(Revision),
    /// The watch fell too far behind and was cancelled; re-list and watch again.
    #[error("watch cancelled: consumer too slow")]
    WatchLagged,
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The value is larger than the store takes ([`MAX_VALUE_BYTES`], or etcd's own limit);
    /// nothing was written.
    #[error("etcdserver: request is too large ({size} bytes, limit is {limit})")]
    TooLarge { size: usize, limit: usize },
    /// The store cannot write for now (its disk is full, its file system read-only, its data
    /// directory gone, ...): the message names the cause. Nothing was written; reads keep
    /// working and writes succeed again once the cause is gone (see
    /// [`Store::write_fault`]). The analogue of etcd's `mvcc: database space exceeded`.
    #[error("{0}")]
    WritesRefused(String),
    #[error("store error: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A stream of watch events, in revision order. An `Err` item ends the stream.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// Refuses a value over [`MAX_VALUE_BYTES`].
pub fn check_value_size(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(StoreError::TooLarge {
            size: value.len(),
            limit: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

/// The storage contract. Implementations must be safe to share between tasks.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The current revision (of the last write; 0 on an empty store... or the backend's start).
    async fn current_revision(&self) -> Result<Revision>;
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;
    async fn range(&self, prefix: &str, opts: RangeOptions) -> Result<RangeResult>;
    /// Stores `value` under `key` if the key is absent. Values over [`MAX_VALUE_BYTES`] are
    /// [`StoreError::TooLarge`] (also for `update`).
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue>;
    /// Replaces the value if the key's mod revision equals `expected`.
    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue>;
    /// Deletes the key if its mod revision equals `expected` (any revision when `None`).
    /// Returns the deleted value and the revision of the delete.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<(KeyValue, Revision)>;
    /// Events for keys under `prefix` with revision > `after`.
    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream>;
    /// Forgets history at or below `revision`.
    async fn compact(&self, revision: Revision) -> Result<()>;
    /// The oldest revision still available for watch and range-at-revision.
    async fn compacted_revision(&self) -> Result<Revision>;
    /// A clean stop, for when the server has drained: finishes the writes already submitted,
    /// leaves everything durable in the backend's own files (redb: a durable commit and no
    /// write-ahead log left to replay) and refuses later writes with
    /// [`StoreError::Unavailable`]. Reads and watches keep working. Idempotent: later calls
    /// return `Ok` at once. An `Err` means the stop was not clean (what the store holds is
    /// still durable: a restart recovers it).
    async fn shutdown(&self) -> Result<()>;
    /// Why the store refuses writes right now (`None`: it can write), for readiness checks.
    /// Backends that cannot tell answer `None`.
    fn write_fault(&self) -> Option<StoreError> {
        None
    }
}

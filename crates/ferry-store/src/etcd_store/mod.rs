//! The etcd v3 backend: a [`Store`] on an etcd cluster, spoken to over gRPC.
//!
//! # Client
//!
//! The few etcd v3 messages Ferry needs are declared by hand below (module `pb`, field numbers
//! from etcd's `rpc.proto` / `kv.proto`) and sent with tonic's generic gRPC client and prost's
//! codec. Nothing is generated at build time, so building Ferry needs no `protoc`.
//!
//! There is one lazily connected HTTP/2 channel per endpoint; requests go to the current one.
//! When an endpoint fails (connection refused, timeout, "no leader") the store moves on to the
//! next. Reads are retried on the next endpoint; writes are retried only when they cannot have
//! reached etcd (connection refused, no leader), otherwise the error is returned
//! ([`StoreError::Unavailable`]) and the caller decides: a write is acknowledged only when etcd
//! acknowledged it.
//!
//! # Keys
//!
//! The trait's keys are Kubernetes registry keys, `/registry/<resource>/<ns>/<name>` and
//! `/registry/<group>/<resource>/<ns>/<name>`. The leading `/registry` is replaced by the
//! configured prefix (default `/registry`, like kube-apiserver's `--etcd-prefix`), so with the
//! default prefix the etcd keys are exactly Kubernetes' keys. Keys outside `/registry/` (only
//! tests use them) are kept under `<prefix>/-/...`.
//!
//! # Semantics
//!
//! Revisions are etcd's revisions (so several API servers on one etcd agree on resourceVersions).
//! `create`, `update` and `delete` are single transactions guarded by `create_revision == 0` or
//! `mod_revision == expected`. `watch` is etcd's watch with `prev_kv`; when its stream breaks
//! (the member died), it is reopened on another endpoint from the revision after the last event
//! delivered, so the consumer sees neither a gap nor a duplicate. Compaction is etcd's compaction;
//! a watch or a read below it gets [`StoreError::Compacted`]. The compacted revision is recorded
//! in the key `compact_rev_key` (as kube-apiserver does) and checked against etcd.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use crate::{
    Event, KeyValue, RangeOptions, RangeResult, Result, Revision, Store, StoreError, WatchStream,
};

mod client;
/// The etcd v3 messages Ferry uses (a subset of their fields; unknown fields are skipped).
#[allow(clippy::derive_partial_eq_without_eq)]
pub(crate) mod pb;
use client::*;
mod watch;
use watch::*;
pub mod testing;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

const RANGE: &str = "/etcdserverpb.KV/Range";
const TXN: &str = "/etcdserverpb.KV/Txn";
const COMPACT: &str = "/etcdserverpb.KV/Compact";
const WATCH: &str = "/etcdserverpb.Watch/Watch";
const STATUS: &str = "/etcdserverpb.Maintenance/Status";

/// Where kube-apiserver (and Ferry) record the last compaction (outside any prefix).
const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// Options of [`EtcdStore::connect`].
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs (`http://127.0.0.1:2379`; a bare `host:port` means `http://`).
    pub endpoints: Vec<String>,
    /// Replaces `/registry` at the start of every key (default `/registry`).
    pub prefix: String,
    /// How long one request may take before the endpoint is considered failed.
    pub request_timeout: Duration,
    /// How long a broken watch keeps trying other endpoints before it reports
    /// [`StoreError::Unavailable`].
    pub watch_resume_for: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/registry".into(),
            request_timeout: Duration::from_secs(5),
            watch_resume_for: Duration::from_secs(60),
        }
    }
}

/// Maps the trait's keys to etcd keys and back (pure; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMap {
    prefix: String,
}

impl KeyMap {
    /// `prefix` loses any trailing `/`; an empty prefix keeps keys as they are under `/registry`
    /// removed (not useful, but well defined).
    pub fn new(prefix: &str) -> Self {
        KeyMap {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// The etcd key for a trait key.
    pub fn to_etcd(&self, key: &str) -> Vec<u8> {
        match key.strip_prefix("/registry") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                format!("{}{rest}", self.prefix).into_bytes()
            }
            _ => format!("{}/-{key}", self.prefix).into_bytes(),
        }
    }

    /// The trait key for an etcd key, `None` for keys outside the prefix.
    pub fn from_etcd(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(self.prefix.as_str())?;
        if let Some(other) = rest.strip_prefix("/-") {
            return Some(other.to_string());
        }
        if rest.is_empty() || rest.starts_with('/') {
            return Some(format!("/registry{rest}"));
        }
        None
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's `range_end` for a
/// prefix); empty (= no end) when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

/// Where a range over the trait prefix `prefix` starts, given `start_after`; `None` when no key
/// can match.
pub fn range_start(prefix: &str, start_after: Option<&str>) -> Option<RangeStart> {
    match start_after {
        None => Some(RangeStart::Prefix),
        Some(after) if after < prefix => Some(RangeStart::Prefix),
        Some(after) if after.starts_with(prefix) => Some(RangeStart::After(after.to_string())),
        Some(_) => None,
    }
}

/// See [`range_start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeStart {
    /// From the first key of the prefix.
    Prefix,
    /// From the first key greater than this one.
    After(String),
}

/// A [`Store`] on etcd v3.
pub struct EtcdStore {
    client: Arc<Client>,
    keys: KeyMap,
    opts: EtcdOptions,
    /// `false` once [`Store::shutdown`] ran. Writes hold a read guard while they run, so the
    /// shutdown (a write guard) waits for the ones in flight.
    open: tokio::sync::RwLock<bool>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.client.urls)
            .field("prefix", &self.keys.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connects (lazily) to the endpoints and checks that one of them answers.
    pub async fn connect(opts: EtcdOptions) -> Result<EtcdStore> {
        let store = EtcdStore::new(opts)?;
        store.current_revision().await?;
        Ok(store)
    }

    /// Builds the store without contacting etcd.
    pub fn new(opts: EtcdOptions) -> Result<EtcdStore> {
        let client = Arc::new(Client::new(&opts.endpoints, opts.request_timeout)?);
        Ok(EtcdStore {
            client,
            keys: KeyMap::new(&opts.prefix),
            opts,
            open: tokio::sync::RwLock::new(true),
        })
    }

    /// A write may go ahead while the guard is held; after a shutdown it is refused.
    async fn writable(&self) -> Result<tokio::sync::RwLockReadGuard<'_, bool>> {
        let open = self.open.read().await;
        if !*open {
            return Err(StoreError::Unavailable("store is shut down".into()));
        }
        Ok(open)
    }

    fn kv(&self, kv: pb::KeyValue) -> Option<KeyValue> {
        Some(KeyValue {
            key: self.keys.from_etcd(&kv.key)?,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        })
    }

    fn kv_for(&self, key: &str, kv: pb::KeyValue) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }

    async fn range_raw(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse> {
        let revision = req.revision;
        match self.client.call(RANGE, req, true).await {
            Err(StoreError::Compacted { .. }) => Err(StoreError::Compacted {
                requested: revision,
                compacted: self.compacted_probe().await.unwrap_or(revision),
            }),
            Err(StoreError::FutureRevision(_)) => Err(StoreError::FutureRevision(revision)),
            other => other,
        }
    }

    /// Whether a read at `revision` works (`false` when it is compacted).
    async fn readable_at(&self, revision: Revision) -> Result<bool> {
        let req = pb::RangeRequest {
            key: COMPACT_REV_KEY.to_vec(),
            revision,
            count_only: true,
            ..Default::default()
        };
        match self
            .client
            .call::<_, pb::RangeResponse>(RANGE, req, true)
            .await
        {
            Ok(_) => Ok(true),
            Err(StoreError::Compacted { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The recorded compaction revision, checked against etcd (another client, or etcd's own
    /// auto-compaction, may have compacted further).
    async fn compacted_probe(&self) -> Result<Revision> {
        let req = pb::RangeRequest {
            key: COMPACT_REV_KEY.to_vec(),
            ..Default::default()
        };
        let resp: pb::RangeResponse = self.client.call(RANGE, req, true).await?;
        let current = resp.header.as_ref().map_or(0, |h| h.revision);
        let recorded = resp
            .kvs
            .first()
            .and_then(|kv| {
                std::str::from_utf8(&kv.value)
                    .ok()?
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .unwrap_or(0);
        let lo = recorded.max(1);
        if lo >= current || self.readable_at(lo).await? {
            return Ok(recorded);
        }
        // Smallest readable revision in (lo, current]: that is where etcd compacted.
        let (mut bad, mut good) = (lo, current);
        while good - bad > 1 {
            let mid = bad + (good - bad) / 2;
            if self.readable_at(mid).await? {
                good = mid;
            } else {
                bad = mid;
            }
        }
        Ok(good)
    }

    async fn current_value(&self, key: &str) -> Result<Option<KeyValue>> {
        self.get(key).await
    }

    fn txn_header_rev(resp: &pb::TxnResponse) -> Result<Revision> {
        resp.header
            .as_ref()
            .map(|h| h.revision)
            .ok_or_else(|| StoreError::Internal("etcd: response without header".into()))
    }

    /// The failure branch of our transactions reads the key: its value explains the failure.
    fn failure_kv(&self, key: &str, resp: pb::TxnResponse) -> Option<KeyValue> {
        resp.responses.into_iter().find_map(|op| match op.response {
            Some(pb::response_op::Response::Range(r)) => {
                r.kvs.into_iter().next().map(|kv| self.kv_for(key, kv))
            }
            _ => None,
        })
    }
}

fn get_op(key: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::Range(pb::RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

fn cmp(key: &[u8], result: i32, target: i32, value: pb::compare::TargetUnion) -> pb::Compare {
    pb::Compare {
        result,
        target,
        key: key.to_vec(),
        target_union: Some(value),
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn current_revision(&self) -> Result<Revision> {
        let req = pb::RangeRequest {
            key: COMPACT_REV_KEY.to_vec(),
            count_only: true,
            ..Default::default()
        };
        let resp: pb::RangeResponse = self.client.call(RANGE, req, true).await?;
        Ok(resp.header.map_or(0, |h| h.revision))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self
            .range_raw(pb::RangeRequest {
                key: self.keys.to_etcd(key),
                ..Default::default()
            })
            .await?;
        Ok(resp.kvs.into_iter().next().map(|kv| self.kv_for(key, kv)))
    }

    async fn range(&self, prefix: &str, opts: RangeOptions) -> Result<RangeResult> {
        let start = match range_start(prefix, opts.start_after.as_deref()) {
            Some(s) => s,
            None => {
                // Nothing can match; still answer at a real revision.
                let revision = if opts.revision > 0 {
                    opts.revision
                } else {
                    self.current_revision().await?
                };
                return Ok(RangeResult {
                    kvs: Vec::new(),
                    revision,
                    more: false,
                });
            }
        };
        let etcd_prefix = self.keys.to_etcd(prefix);
        let key = match start {
            RangeStart::Prefix => etcd_prefix.clone(),
            RangeStart::After(after) => {
                let mut k = self.keys.to_etcd(&after);
                k.push(0);
                k
            }
        };
        let limit = i64::try_from(opts.limit).unwrap_or(i64::MAX);
        let resp = self
            .range_raw(pb::RangeRequest {
                key,
                range_end: prefix_end(&etcd_prefix),
                limit,
                revision: opts.revision,
                ..Default::default()
            })
            .await?;
        let revision = if opts.revision > 0 {
            opts.revision
        } else {
            resp.header.as_ref().map_or(0, |h| h.revision)
        };
        let kvs = resp
            .kvs
            .into_iter()
            .filter_map(|kv| self.kv(kv))
            .filter(|kv| kv.key.starts_with(prefix))
            .collect();
        Ok(RangeResult {
            kvs,
            revision,
            more: resp.more,
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        crate::check_value_size(&value)?;
        let _open = self.writable().await?;
        let k = self.keys.to_etcd(key);
        let req = pb::TxnRequest {
            compare: vec![cmp(
                &k,
                pb::CMP_EQUAL,
                pb::TARGET_CREATE,
                pb::compare::TargetUnion::CreateRevision(0),
            )],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::Put(pb::PutRequest {
                    key: k.clone(),
                    value: value.clone(),
                    prev_kv: false,
                })),
            }],
            failure: vec![],
        };
        let resp: pb::TxnResponse = self.client.call(TXN, req, false).await?;
        if !resp.succeeded {
            return Err(StoreError::AlreadyExists);
        }
        let rev = Self::txn_header_rev(&resp)?;
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision: rev,
            mod_revision: rev,
        })
    }

    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<KeyValue> {
        crate::check_value_size(&value)?;
        let _open = self.writable().await?;
        let k = self.keys.to_etcd(key);
        let req = pb::TxnRequest {
            compare: vec![
                cmp(
                    &k,
                    pb::CMP_GREATER,
                    pb::TARGET_VERSION,
                    pb::compare::TargetUnion::Version(0),
                ),
                cmp(
                    &k,
                    pb::CMP_EQUAL,
                    pb::TARGET_MOD,
                    pb::compare::TargetUnion::ModRevision(expected),
                ),
            ],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::Put(pb::PutRequest {
                    key: k.clone(),
                    value: value.clone(),
                    prev_kv: true,
                })),
            }],
            failure: vec![get_op(k)],
        };
        let resp: pb::TxnResponse = self.client.call(TXN, req, false).await?;
        if !resp.succeeded {
            return match self.failure_kv(key, resp) {
                None => Err(StoreError::NotFound),
                Some(current) => Err(StoreError::Conflict {
                    current: Box::new(current),
                }),
            };
        }
        let rev = Self::txn_header_rev(&resp)?;
        let prev = resp.responses.into_iter().find_map(|op| match op.response {
            Some(pb::response_op::Response::Put(p)) => p.prev_kv,
            _ => None,
        });
        let create_revision = match prev {
            Some(p) => p.create_revision,
            // Not expected (etcd returns prev_kv when asked); read it back.
            None => self
                .current_value(key)
                .await?
                .map_or(rev, |kv| kv.create_revision),
        };
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision,
            mod_revision: rev,
        })
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<(KeyValue, Revision)> {
        let _open = self.writable().await?;
        let k = self.keys.to_etcd(key);
        let mut compare = vec![cmp(
            &k,
            pb::CMP_GREATER,
            pb::TARGET_VERSION,
            pb::compare::TargetUnion::Version(0),
        )];
        if let Some(expected) = expected {
            compare.push(cmp(
                &k,
                pb::CMP_EQUAL,
                pb::TARGET_MOD,
                pb::compare::TargetUnion::ModRevision(expected),
            ));
        }
        let req = pb::TxnRequest {
            compare,
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::DeleteRange(
                    pb::DeleteRangeRequest {
                        key: k.clone(),
                        range_end: Vec::new(),
                        prev_kv: true,
                    },
                )),
            }],
            failure: vec![get_op(k)],
        };
        let resp: pb::TxnResponse = self.client.call(TXN, req, false).await?;
        if !resp.succeeded {
            return match self.failure_kv(key, resp) {
                None => Err(StoreError::NotFound),
                Some(current) => Err(StoreError::Conflict {
                    current: Box::new(current),
                }),
            };
        }
        let rev = Self::txn_header_rev(&resp)?;
        let prev = resp.responses.into_iter().find_map(|op| match op.response {
            Some(pb::response_op::Response::DeleteRange(d)) => d.prev_kvs.into_iter().next(),
            _ => None,
        });
        match prev {
            Some(p) => Ok((self.kv_for(key, p), rev)),
            None => Err(StoreError::Internal(
                "etcd: delete succeeded without the previous value".into(),
            )),
        }
    }

    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        let after = after.max(0);
        let (tx, rx) = mpsc::channel(1024);
        let task = WatchTask {
            client: self.client.clone(),
            keys: self.keys.clone(),
            prefix: prefix.to_string(),
            resume_for: self.opts.watch_resume_for,
        };
        // Open the first stream here so that "too old" is reported by `watch` itself.
        let first = task.open(after).await;
        let first = match first {
            Ok(s) => Some(s),
            Err(WatchEnd::Fatal(e)) => return Err(e),
            Err(_) => None,
        };
        tokio::spawn(task.run(after, first, tx));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let _open = self.writable().await?;
        let req = pb::CompactionRequest {
            revision,
            physical: false,
        };
        match self
            .client
            .call::<_, pb::CompactionResponse>(COMPACT, req, true)
            .await
        {
            Ok(_) => {}
            // Already compacted at or above `revision`.
            Err(StoreError::Compacted { .. }) => return Ok(()),
            Err(StoreError::FutureRevision(_)) => {
                return Err(StoreError::FutureRevision(revision));
            }
            Err(e) => return Err(e),
        }
        // Record it (only ever raising the recorded value).
        let read = pb::RangeRequest {
            key: COMPACT_REV_KEY.to_vec(),
            ..Default::default()
        };
        let resp: pb::RangeResponse = self.client.call(RANGE, read, true).await?;
        let (recorded, mod_rev) = resp.kvs.first().map_or((0, 0), |kv| {
            let v = std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .unwrap_or(0);
            (v, kv.mod_revision)
        });
        if recorded >= revision {
            return Ok(());
        }
        let req = pb::TxnRequest {
            compare: vec![cmp(
                COMPACT_REV_KEY,
                pb::CMP_EQUAL,
                pb::TARGET_MOD,
                pb::compare::TargetUnion::ModRevision(mod_rev),
            )],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::Put(pb::PutRequest {
                    key: COMPACT_REV_KEY.to_vec(),
                    value: Bytes::from(revision.to_string()),
                    prev_kv: false,
                })),
            }],
            failure: vec![],
        };
        // Losing the race means someone else recorded a compaction: fine either way.
        self.client
            .call::<_, pb::TxnResponse>(TXN, req, false)
            .await?;
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.compacted_probe().await
    }

    /// etcd acknowledges a write once it is durable in its own log, so there is nothing to
    /// flush: the writes in flight finish, later ones are refused.
    async fn shutdown(&self) -> Result<()> {
        *self.open.write().await = false;
        Ok(())
    }
}

/// Status of one etcd member (for tests and diagnostics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
    pub version: String,
}

/// Asks one endpoint for its status (no failover).
pub async fn member_status(endpoint: &str, timeout: Duration) -> Result<MemberStatus> {
    let client = Client::new(&[endpoint.to_string()], timeout)?;
    let (_, ch) = client.pick();
    let resp: pb::StatusResponse = client
        .call_on(ch, STATUS, pb::StatusRequest {})
        .await
        .map_err(|f| match f {
            Failure::Final(e) => e,
            Failure::Endpoint(w) | Failure::NotSent(w) => StoreError::Unavailable(w),
        })?;
    Ok(MemberStatus {
        member_id: resp.header.map_or(0, |h| h.member_id),
        leader: resp.leader,
        version: resp.version,
    })
}

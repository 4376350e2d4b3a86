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

/// The etcd v3 messages Ferry uses (a subset of their fields; unknown fields are skipped).
#[allow(clippy::derive_partial_eq_without_eq)]
pub(crate) mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(uint64, tag = "1")]
        pub cluster_id: u64,
        #[prost(uint64, tag = "2")]
        pub member_id: u64,
        #[prost(int64, tag = "3")]
        pub revision: i64,
        #[prost(uint64, tag = "4")]
        pub raft_term: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(int64, tag = "2")]
        pub create_revision: i64,
        #[prost(int64, tag = "3")]
        pub mod_revision: i64,
        #[prost(int64, tag = "4")]
        pub version: i64,
        #[prost(bytes = "bytes", tag = "5")]
        pub value: bytes::Bytes,
        #[prost(int64, tag = "6")]
        pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub limit: i64,
        #[prost(int64, tag = "4")]
        pub revision: i64,
        #[prost(bool, tag = "7")]
        pub serializable: bool,
        #[prost(bool, tag = "8")]
        pub keys_only: bool,
        #[prost(bool, tag = "9")]
        pub count_only: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
        #[prost(bool, tag = "3")]
        pub more: bool,
        #[prost(int64, tag = "4")]
        pub count: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "bytes", tag = "2")]
        pub value: bytes::Bytes,
        #[prost(bool, tag = "4")]
        pub prev_kv: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, optional, tag = "2")]
        pub prev_kv: Option<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(bool, tag = "3")]
        pub prev_kv: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub deleted: i64,
        #[prost(message, repeated, tag = "3")]
        pub prev_kvs: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(oneof = "request_op::Request", tags = "1, 2, 3")]
        pub request: Option<request_op::Request>,
    }

    pub mod request_op {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Request {
            #[prost(message, tag = "1")]
            Range(super::RangeRequest),
            #[prost(message, tag = "2")]
            Put(super::PutRequest),
            #[prost(message, tag = "3")]
            DeleteRange(super::DeleteRangeRequest),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseOp {
        #[prost(oneof = "response_op::Response", tags = "1, 2, 3")]
        pub response: Option<response_op::Response>,
    }

    pub mod response_op {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Response {
            #[prost(message, tag = "1")]
            Range(super::RangeResponse),
            #[prost(message, tag = "2")]
            Put(super::PutResponse),
            #[prost(message, tag = "3")]
            DeleteRange(super::DeleteRangeResponse),
        }
    }

    /// `Compare.result`.
    pub const CMP_EQUAL: i32 = 0;
    pub const CMP_GREATER: i32 = 1;
    /// `Compare.target`.
    pub const TARGET_VERSION: i32 = 0;
    pub const TARGET_CREATE: i32 = 1;
    pub const TARGET_MOD: i32 = 2;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        #[prost(int32, tag = "1")]
        pub result: i32,
        #[prost(int32, tag = "2")]
        pub target: i32,
        #[prost(bytes = "vec", tag = "3")]
        pub key: Vec<u8>,
        #[prost(oneof = "compare::TargetUnion", tags = "4, 5, 6")]
        pub target_union: Option<compare::TargetUnion>,
    }

    pub mod compare {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum TargetUnion {
            #[prost(int64, tag = "4")]
            Version(i64),
            #[prost(int64, tag = "5")]
            CreateRevision(i64),
            #[prost(int64, tag = "6")]
            ModRevision(i64),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")]
        pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")]
        pub succeeded: bool,
        #[prost(message, repeated, tag = "3")]
        pub responses: Vec<ResponseOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompactionRequest {
        #[prost(int64, tag = "1")]
        pub revision: i64,
        #[prost(bool, tag = "2")]
        pub physical: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompactionResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchRequest {
        #[prost(oneof = "watch_request::RequestUnion", tags = "1")]
        pub request_union: Option<watch_request::RequestUnion>,
    }

    pub mod watch_request {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum RequestUnion {
            #[prost(message, tag = "1")]
            CreateRequest(super::WatchCreateRequest),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchCreateRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub start_revision: i64,
        #[prost(bool, tag = "4")]
        pub progress_notify: bool,
        #[prost(bool, tag = "6")]
        pub prev_kv: bool,
    }

    /// `Event.type`.
    pub const EVENT_DELETE: i32 = 1;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(int32, tag = "1")]
        pub r#type: i32,
        #[prost(message, optional, tag = "2")]
        pub kv: Option<KeyValue>,
        #[prost(message, optional, tag = "3")]
        pub prev_kv: Option<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub watch_id: i64,
        #[prost(bool, tag = "3")]
        pub created: bool,
        #[prost(bool, tag = "4")]
        pub canceled: bool,
        #[prost(int64, tag = "5")]
        pub compact_revision: i64,
        #[prost(string, tag = "6")]
        pub cancel_reason: String,
        #[prost(message, repeated, tag = "11")]
        pub events: Vec<Event>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(string, tag = "2")]
        pub version: String,
        #[prost(uint64, tag = "4")]
        pub leader: u64,
    }
}

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

/// How a failed request is treated.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// etcd answered with an error that does not depend on the endpoint.
    Final(StoreError),
    /// The endpoint failed; the request may have been applied.
    Endpoint(String),
    /// The endpoint failed before the request could be applied; safe to retry elsewhere.
    NotSent(String),
}

fn classify(status: &tonic::Status) -> Failure {
    use tonic::Code;
    let msg = status.message();
    let lower = msg.to_ascii_lowercase();
    if lower.contains("required revision has been compacted") {
        return Failure::Final(StoreError::Compacted {
            requested: 0,
            compacted: 0,
        });
    }
    if lower.contains("future revision") {
        return Failure::Final(StoreError::FutureRevision(0));
    }
    if lower.contains("request is too large") {
        return Failure::Final(StoreError::TooLarge {
            size: 0,
            limit: crate::MAX_VALUE_BYTES,
        });
    }
    let not_sent = lower.contains("connect")
        || lower.contains("connection refused")
        || lower.contains("no leader");
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::ResourceExhausted
        | Code::Aborted => {
            let what = format!("etcd: {:?}: {msg}", status.code());
            if not_sent {
                Failure::NotSent(what)
            } else {
                Failure::Endpoint(what)
            }
        }
        code => Failure::Final(StoreError::Internal(format!("etcd: {code:?}: {msg}"))),
    }
}

struct Client {
    channels: Vec<Channel>,
    urls: Vec<String>,
    current: AtomicUsize,
    timeout: Duration,
}

impl Client {
    fn new(endpoints: &[String], timeout: Duration) -> Result<Client> {
        if endpoints.is_empty() {
            return Err(StoreError::Internal("no etcd endpoints given".into()));
        }
        let mut channels = Vec::new();
        let mut urls = Vec::new();
        for e in endpoints {
            let url = normalize_endpoint(e)?;
            let ep = Endpoint::from_shared(url.clone())
                .map_err(|err| StoreError::Internal(format!("etcd endpoint {e}: {err}")))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5));
            channels.push(ep.connect_lazy());
            urls.push(url);
        }
        Ok(Client {
            channels,
            urls,
            current: AtomicUsize::new(0),
            timeout,
        })
    }

    fn pick(&self) -> (usize, Channel) {
        let i = self.current.load(Ordering::Relaxed) % self.channels.len();
        (i, self.channels[i].clone())
    }

    /// Moves on from endpoint `i` (if no one else did already).
    fn failed(&self, i: usize, why: &str) {
        let next = (i + 1) % self.channels.len();
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.channels.len() > 1
        {
            tracing::warn!(
                failed = %self.urls[i],
                next = %self.urls[next],
                "etcd endpoint failed ({why}); switching"
            );
        }
    }

    async fn call_on<Req, Resp>(
        &self,
        channel: Channel,
        path: &'static str,
        req: Req,
    ) -> std::result::Result<Resp, Failure>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let fut = async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.map_err(|e| {
                Failure::NotSent(format!("etcd: connecting: {e}{}", source_chain(&e)))
            })?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(
                tonic::Request::new(req),
                PathAndQuery::from_static(path),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify(&s))
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Endpoint(format!(
                "etcd: no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// One request with failover. `idempotent` requests are retried on every endpoint failure;
    /// others only when they were not sent.
    async fn call<Req, Resp>(&self, path: &'static str, req: Req, idempotent: bool) -> Result<Resp>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let attempts = 2 * self.channels.len() + 1;
        let mut last = String::new();
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
            }
            let (i, ch) = self.pick();
            match self.call_on::<Req, Resp>(ch, path, req.clone()).await {
                Ok(r) => return Ok(r),
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::NotSent(why)) => {
                    self.failed(i, &why);
                    last = why;
                }
                Err(Failure::Endpoint(why)) => {
                    self.failed(i, &why);
                    if !idempotent {
                        return Err(StoreError::Unavailable(why));
                    }
                    last = why;
                }
            }
        }
        Err(StoreError::Unavailable(last))
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn normalize_endpoint(e: &str) -> Result<String> {
    let e = e.trim();
    if e.starts_with("https://") {
        return Err(StoreError::Internal(format!(
            "etcd endpoint {e}: TLS is not supported yet; use http:// on a trusted network"
        )));
    }
    if e.starts_with("http://") {
        Ok(e.trim_end_matches('/').to_string())
    } else {
        Ok(format!("http://{}", e.trim_end_matches('/')))
    }
}

/// A [`Store`] on etcd v3.
pub struct EtcdStore {
    client: Arc<Client>,
    keys: KeyMap,
    opts: EtcdOptions,
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
        })
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
}

/// Why one watch stream ended.
enum WatchEnd {
    /// The consumer dropped the stream.
    ConsumerGone,
    /// Report this error and stop.
    Fatal(StoreError),
    /// The endpoint failed; resume elsewhere.
    Broken(String),
}

struct WatchTask {
    client: Arc<Client>,
    keys: KeyMap,
    prefix: String,
    resume_for: Duration,
}

type Outbound = mpsc::Sender<pb::WatchRequest>;
type Inbound = tonic::Streaming<pb::WatchResponse>;
/// An open etcd watch: the endpoint index, the request side (kept open), the responses.
type Opened = (usize, Outbound, Inbound);

impl WatchTask {
    /// Opens an etcd watch for events after `after` and waits for its `created` answer.
    async fn open(&self, after: Revision) -> std::result::Result<Opened, WatchEnd> {
        let (i, channel) = self.client.pick();
        match tokio::time::timeout(self.client.timeout, self.open_on(channel, after)).await {
            Ok(Ok((out, inbound))) => Ok((i, out, inbound)),
            Ok(Err(WatchEnd::Broken(why))) => {
                self.client.failed(i, &why);
                Err(WatchEnd::Broken(why))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                let why = "etcd: watch not created in time".to_string();
                self.client.failed(i, &why);
                Err(WatchEnd::Broken(why))
            }
        }
    }

    async fn open_on(
        &self,
        channel: Channel,
        after: Revision,
    ) -> std::result::Result<(Outbound, Inbound), WatchEnd> {
        let key = self.keys.to_etcd(&self.prefix);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    range_end: prefix_end(&key),
                    key,
                    start_revision: after + 1,
                    progress_notify: false,
                    prev_kv: true,
                },
            )),
        };
        let (out_tx, out_rx) = mpsc::channel(4);
        out_tx
            .send(create)
            .await
            .map_err(|_| WatchEnd::Broken("watch request channel closed".into()))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| WatchEnd::Broken(format!("etcd: connecting: {e}{}", source_chain(&e))))?;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(out_rx));
        // Have the member cancel the watch when it loses its leader (etcd's WithRequireLeader),
        // so that a partitioned member does not silently stall the watch.
        request.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let codec = tonic_prost::ProstCodec::<pb::WatchRequest, pb::WatchResponse>::default();
        let mut inbound = grpc
            .streaming(request, PathAndQuery::from_static(WATCH), codec)
            .await
            .map_err(|s| match classify(&s) {
                Failure::Final(e) => WatchEnd::Fatal(e),
                Failure::Endpoint(w) | Failure::NotSent(w) => WatchEnd::Broken(w),
            })?
            .into_inner();
        loop {
            let msg = inbound
                .message()
                .await
                .map_err(|s| WatchEnd::Broken(format!("etcd watch: {}", s.message())))?;
            let Some(msg) = msg else {
                return Err(WatchEnd::Broken("etcd watch stream ended".into()));
            };
            if msg.canceled {
                return Err(cancel_reason(&msg, after));
            }
            if msg.created {
                return Ok((out_tx, inbound));
            }
        }
    }

    async fn run(
        self,
        mut after: Revision,
        mut stream: Option<Opened>,
        tx: mpsc::Sender<Result<Event>>,
    ) {
        let mut broken_since: Option<Instant> = None;
        let mut backoff = Duration::from_millis(50);
        loop {
            let (endpoint, out, inbound) = match stream.take() {
                Some(s) => s,
                None => {
                    let since = *broken_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.resume_for {
                        let _ = tx
                            .send(Err(StoreError::Unavailable(
                                "etcd watch could not be resumed".into(),
                            )))
                            .await;
                        return;
                    }
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    match self.open(after).await {
                        Ok(s) => s,
                        Err(WatchEnd::Fatal(e)) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                        Err(WatchEnd::ConsumerGone) => return,
                        Err(WatchEnd::Broken(why)) => {
                            tracing::debug!("etcd watch resume failed: {why}");
                            continue;
                        }
                    }
                }
            };
            match self.pump(&mut after, inbound, &tx, &mut broken_since).await {
                WatchEnd::ConsumerGone => return,
                WatchEnd::Fatal(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                WatchEnd::Broken(why) => {
                    tracing::warn!(after, "etcd watch broke ({why}); resuming");
                    backoff = Duration::from_millis(50);
                    self.client.failed(endpoint, &why);
                }
            }
            drop(out);
        }
    }

    /// Passes events on until the stream ends. `after` follows the last delivered revision.
    async fn pump(
        &self,
        after: &mut Revision,
        mut inbound: Inbound,
        tx: &mpsc::Sender<Result<Event>>,
        broken_since: &mut Option<Instant>,
    ) -> WatchEnd {
        loop {
            let msg = tokio::select! {
                _ = tx.closed() => return WatchEnd::ConsumerGone,
                m = inbound.message() => m,
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => return WatchEnd::Broken("etcd watch stream ended".into()),
                Err(s) => return WatchEnd::Broken(format!("etcd watch: {}", s.message())),
            };
            *broken_since = None;
            if msg.canceled {
                return cancel_reason(&msg, *after);
            }
            for ev in msg.events {
                let Some(event) = convert_event(&self.keys, ev) else {
                    continue;
                };
                let rev = event.revision();
                if rev <= *after {
                    continue;
                }
                if !event.key().starts_with(self.prefix.as_str()) {
                    *after = rev;
                    continue;
                }
                if tx.send(Ok(event)).await.is_err() {
                    return WatchEnd::ConsumerGone;
                }
                *after = rev;
            }
        }
    }
}

fn cancel_reason(msg: &pb::WatchResponse, after: Revision) -> WatchEnd {
    if msg.compact_revision > 0 {
        WatchEnd::Fatal(StoreError::Compacted {
            requested: after,
            compacted: msg.compact_revision,
        })
    } else {
        WatchEnd::Broken(format!("etcd cancelled the watch: {}", msg.cancel_reason))
    }
}

/// An etcd watch event as a store event (`None` for keys outside the prefix).
fn convert_event(keys: &KeyMap, ev: pb::Event) -> Option<Event> {
    let to_kv = |kv: pb::KeyValue| -> Option<KeyValue> {
        Some(KeyValue {
            key: keys.from_etcd(&kv.key)?,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        })
    };
    let kv = ev.kv?;
    if ev.r#type == pb::EVENT_DELETE {
        let revision = kv.mod_revision;
        let prev = match ev.prev_kv.and_then(to_kv) {
            Some(p) => p,
            // The previous value is gone (compacted): keep the key, without a value.
            None => KeyValue {
                key: keys.from_etcd(&kv.key)?,
                value: Bytes::new(),
                create_revision: 0,
                mod_revision: 0,
            },
        };
        Some(Event::Delete { prev, revision })
    } else {
        let created = kv.version == 1;
        let prev = if created {
            None
        } else {
            ev.prev_kv.and_then(to_kv)
        };
        Some(Event::Put {
            kv: to_kv(kv)?,
            prev,
        })
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

pub mod testing {
    //! Starting real etcd processes on loopback for tests (Debian's `etcd-server`; the binary is
    //! `$FERRY_ETCD_BIN`, else `/usr/bin/etcd`, else `etcd` on `PATH`).

    use super::*;
    use std::process::{Child, Command, Stdio};

    /// The etcd binary to run, if there is one.
    pub fn etcd_binary() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("FERRY_ETCD_BIN") {
            return Some(PathBuf::from(p));
        }
        let debian = PathBuf::from("/usr/bin/etcd");
        if debian.exists() {
            return Some(debian);
        }
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("etcd"))
                .find(|p| p.exists())
        })
    }

    fn free_port() -> std::io::Result<u16> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(l.local_addr()?.port())
    }

    struct Member {
        name: String,
        client_url: String,
        peer_url: String,
        data_dir: PathBuf,
        child: Option<Child>,
    }

    /// An etcd cluster of one or more members on loopback; every process is killed on drop.
    pub struct EtcdCluster {
        members: Vec<Member>,
        binary: PathBuf,
        initial_cluster: String,
        log_dir: PathBuf,
    }

    impl EtcdCluster {
        /// Starts `n` members with their data under `dir` and waits until the cluster answers.
        pub async fn start(dir: &Path, n: usize) -> std::io::Result<EtcdCluster> {
            std::fs::create_dir_all(dir)?;
            let binary = etcd_binary().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "etcd not found (install Debian's etcd-server: scripts/test-deps.sh)",
                )
            })?;
            let mut members = Vec::new();
            for i in 0..n {
                members.push(Member {
                    name: format!("m{i}"),
                    client_url: format!("http://127.0.0.1:{}", free_port()?),
                    peer_url: format!("http://127.0.0.1:{}", free_port()?),
                    data_dir: dir.join(format!("m{i}")),
                    child: None,
                });
            }
            let initial_cluster = members
                .iter()
                .map(|m| format!("{}={}", m.name, m.peer_url))
                .collect::<Vec<_>>()
                .join(",");
            let mut cluster = EtcdCluster {
                members,
                binary,
                initial_cluster,
                log_dir: dir.to_path_buf(),
            };
            for i in 0..n {
                cluster.spawn(i)?;
            }
            cluster.wait_ready(Duration::from_secs(20)).await?;
            Ok(cluster)
        }

        fn spawn(&mut self, i: usize) -> std::io::Result<()> {
            let m = &mut self.members[i];
            let log = std::fs::File::create(self.log_dir.join(format!("{}.log", m.name)))?;
            let child = Command::new(&self.binary)
                .arg("--name")
                .arg(&m.name)
                .arg("--data-dir")
                .arg(&m.data_dir)
                .arg("--listen-client-urls")
                .arg(&m.client_url)
                .arg("--advertise-client-urls")
                .arg(&m.client_url)
                .arg("--listen-peer-urls")
                .arg(&m.peer_url)
                .arg("--initial-advertise-peer-urls")
                .arg(&m.peer_url)
                .arg("--initial-cluster")
                .arg(&self.initial_cluster)
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--initial-cluster-token")
                .arg("ferry-test")
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            m.child = Some(child);
            Ok(())
        }

        /// Waits until a write-capable read (linearizable) succeeds on every running member.
        pub async fn wait_ready(&self, within: Duration) -> std::io::Result<()> {
            let deadline = Instant::now() + within;
            for m in self.members.iter().filter(|m| m.child.is_some()) {
                let store = EtcdStore::new(EtcdOptions {
                    endpoints: vec![m.client_url.clone()],
                    request_timeout: Duration::from_secs(1),
                    ..Default::default()
                })
                .map_err(std::io::Error::other)?;
                loop {
                    match store.current_revision().await {
                        Ok(_) => break,
                        Err(e) if Instant::now() > deadline => {
                            return Err(std::io::Error::other(format!(
                                "etcd {} not ready: {e}",
                                m.client_url
                            )));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
            Ok(())
        }

        /// Client URLs of all members.
        pub fn endpoints(&self) -> Vec<String> {
            self.members.iter().map(|m| m.client_url.clone()).collect()
        }

        /// The index of the current leader, asking the running members.
        pub async fn leader(&self) -> Option<usize> {
            for m in self.members.iter().filter(|m| m.child.is_some()) {
                if let Ok(st) = member_status(&m.client_url, Duration::from_secs(1)).await {
                    if st.leader == 0 {
                        continue;
                    }
                    for (j, other) in self.members.iter().enumerate() {
                        if other.child.is_none() {
                            continue;
                        }
                        if let Ok(o) =
                            member_status(&other.client_url, Duration::from_secs(1)).await
                            && o.member_id == st.leader
                        {
                            return Some(j);
                        }
                    }
                }
            }
            None
        }

        /// SIGKILLs member `i`.
        pub fn kill(&mut self, i: usize) {
            if let Some(mut c) = self.members[i].child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }

        /// Starts member `i` again on its old data.
        pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
            self.kill(i);
            self.spawn(i)
        }

        /// A store on this cluster.
        pub fn store(&self, prefix: &str) -> Result<EtcdStore> {
            EtcdStore::new(EtcdOptions {
                endpoints: self.endpoints(),
                prefix: prefix.to_string(),
                ..Default::default()
            })
        }
    }

    impl Drop for EtcdCluster {
        fn drop(&mut self) {
            for i in 0..self.members.len() {
                self.kill(i);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn key_mapping() {
        let cases = [
            // prefix, trait key, etcd key
            ("/registry", "/registry/pods/ns/a", "/registry/pods/ns/a"),
            ("/registry", "/registry/", "/registry/"),
            (
                "/registry",
                "/registry/apps/deployments/ns/d",
                "/registry/apps/deployments/ns/d",
            ),
            ("/ferry/a/", "/registry/pods/ns/a", "/ferry/a/pods/ns/a"),
            ("/ferry", "/registry/", "/ferry/"),
            ("/ferry", "/conformance/x", "/ferry/-/conformance/x"),
            ("/registry", "/registryx/y", "/registry/-/registryx/y"),
            ("/registry", "/other", "/registry/-/other"),
        ];
        for (prefix, key, etcd) in cases {
            let m = KeyMap::new(prefix);
            assert_eq!(m.to_etcd(key), etcd.as_bytes(), "{prefix} {key}");
            assert_eq!(
                m.from_etcd(etcd.as_bytes()).as_deref(),
                Some(key),
                "{prefix} {etcd}"
            );
        }
        let m = KeyMap::new("/ferry");
        assert_eq!(m.from_etcd(b"/ferryx/pods"), None);
        assert_eq!(m.from_etcd(b"/other/pods"), None);
        assert_eq!(m.from_etcd(b"compact_rev_key"), None);
        assert_eq!(m.from_etcd(&[0xff, 0xfe]), None);
    }

    #[test]
    fn prefix_ends() {
        let cases: [(&[u8], &[u8]); 5] = [
            (b"/a/", b"/a0"),
            (b"a", b"b"),
            (&[b'a', 0xff], b"b"),
            (&[0xff, 0xff], b""),
            (b"", b""),
        ];
        for (p, end) in cases {
            assert_eq!(prefix_end(p), end, "{p:?}");
        }
    }

    #[test]
    fn range_starts() {
        let cases = [
            ("/p/", None, Some(RangeStart::Prefix)),
            ("/p/", Some("/a"), Some(RangeStart::Prefix)),
            ("/p/", Some("/p/"), Some(RangeStart::After("/p/".into()))),
            ("/p/", Some("/p/x"), Some(RangeStart::After("/p/x".into()))),
            ("/p/", Some("/p0"), None),
            ("/p/", Some("/q"), None),
        ];
        for (prefix, after, expected) in cases {
            assert_eq!(range_start(prefix, after), expected, "{prefix} {after:?}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(normalize_endpoint(" http://h:1/ ").unwrap(), "http://h:1");
        assert!(normalize_endpoint("https://h:1").is_err());
    }

    #[test]
    fn status_classification() {
        use tonic::{Code, Status};
        let cases = [
            (
                Status::new(
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision has been compacted",
                ),
                "compacted",
            ),
            (
                Status::new(
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision is a future revision",
                ),
                "future",
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: no leader"),
                "notsent",
            ),
            (
                Status::new(Code::Unavailable, "tcp connect error: Connection refused"),
                "notsent",
            ),
            (
                Status::new(Code::Unavailable, "etcdserver: request timed out"),
                "endpoint",
            ),
            (Status::new(Code::InvalidArgument, "bad"), "final"),
        ];
        for (status, want) in cases {
            let got = match classify(&status) {
                Failure::Final(StoreError::Compacted { .. }) => "compacted",
                Failure::Final(StoreError::FutureRevision(_)) => "future",
                Failure::Final(_) => "final",
                Failure::NotSent(_) => "notsent",
                Failure::Endpoint(_) => "endpoint",
            };
            assert_eq!(got, want, "{status:?}");
        }
    }

    #[test]
    fn delete_event_without_prev_keeps_key() {
        let keys = KeyMap::new("/registry");
        let ev = pb::Event {
            r#type: pb::EVENT_DELETE,
            kv: Some(pb::KeyValue {
                key: b"/registry/pods/ns/a".to_vec(),
                mod_revision: 9,
                ..Default::default()
            }),
            prev_kv: None,
        };
        match convert_event(&keys, ev) {
            Some(Event::Delete { prev, revision }) => {
                assert_eq!(prev.key, "/registry/pods/ns/a");
                assert_eq!(revision, 9);
            }
            other => panic!("{other:?}"),
        }
        let put = pb::Event {
            r#type: 0, // PUT
            kv: Some(pb::KeyValue {
                key: b"/elsewhere".to_vec(),
                mod_revision: 3,
                version: 1,
                ..Default::default()
            }),
            prev_kv: None,
        };
        assert_eq!(convert_event(&keys, put), None);
    }
}
